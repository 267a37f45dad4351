"""The agent's commands: handlers by action, the queue run at safe points, one Result each.

A command arrives on any thread (the transport's, or the agent's own for the auto-profile); one
that must run between two steps waits in :attr:`CommandQueue.pending` for the training thread's
next safe point, the others run at once. Every command gets exactly one Result.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

from tpuwatch.agent.agent_api import CommandRefused, Handler, ResultListener
from tpuwatch.protocol import Command, CommandState, Message, Result


class CommandQueue:
    """``emit``: the agent's buffer; ``step``: the training's current step (for the states);
    ``probe_failed``: a result listener's failure stops its probe."""

    def __init__(self, emit: Callable[[Message], None], clock: Callable[[], float], step: Callable[[], int],
                 probe_failed: Callable[[str, BaseException], None]) -> None:
        self._emit = emit
        self._clock = clock
        self._step = step
        self._probe_failed = probe_failed
        self.handlers: dict[str, tuple[Handler, bool, Callable[[Command], None] | None]] = {}
        #: Commands waiting for the next safe point (the step probe reads it once a call).
        self.pending: collections.deque[Command] = collections.deque()
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        # Command id -> called with (ok, message, details) when its Result is sent.
        self._on_result: dict[str, ResultListener] = {}

    def register(
        self,
        action: str,
        handler: Handler,
        *,
        at_step_boundary: bool = True,
        validate: Callable[[Command], None] | None = None,
    ) -> None:
        """Registers a command handler. ``validate`` runs on receipt and may raise CommandRefused."""
        self.handlers[action] = (handler, at_step_boundary, validate)

    def submit(self, cmd: Command, on_result: ResultListener | None = None) -> None:
        """Called by the transport when a viewer sends a command (any thread), or by the agent
        itself (the auto-profile); ``on_result`` is called with its Result's ok, message, details."""
        if on_result is not None:
            self._on_result[cmd.id] = on_result
        entry = self.handlers.get(cmd.action)
        if entry is None:
            known = ", ".join(sorted(self.handlers)) or "none"
            self._result(cmd, False, f"unknown action {cmd.action!r} (known: {known})")
            return
        handler, at_boundary, validate = entry
        try:
            if validate is not None:
                validate(cmd)
        except CommandRefused as e:
            self._result(cmd, False, str(e))
            return
        except Exception as e:  # a validator bug must not kill the server thread
            self._result(cmd, False, f"could not validate {cmd.action}: {type(e).__name__}: {e}")
            return
        with self._lock:
            if cmd.action in self._busy:
                self._result(cmd, False, f"a {cmd.action} is already queued or running; wait for its result")
                return
            self._busy.add(cmd.action)
        if at_boundary:
            self._emit(CommandState(t=self._clock(), id=cmd.id, action=cmd.action, state="queued", step=self._step()))
            self.pending.append(cmd)
        else:
            self._execute(cmd, handler)

    def safe_point(self) -> None:
        """Runs queued commands. Called on the training thread between two steps."""
        while self.pending:
            try:
                cmd = self.pending.popleft()
            except IndexError:
                return
            self._execute(cmd, self.handlers[cmd.action][0])

    def _execute(self, cmd: Command, handler: Handler) -> None:
        self._emit(CommandState(t=self._clock(), id=cmd.id, action=cmd.action, state="running", step=self._step()))
        try:
            message, details = handler(cmd)
            ok = True
        except CommandRefused as e:
            message, details, ok = str(e), {}, False
        except Exception as e:  # a handler's bug fails its command, never the training step that ran it
            first = str(e).splitlines()[0] if str(e) else ""
            message, details, ok = f"{cmd.action} failed: {type(e).__name__}: {first}", {}, False
        except BaseException as e:  # Ctrl-C (or SystemExit) on the training thread mid-command: it goes
            # on to the script as it would without tpuwatch; the command still gets its one Result
            self.finish(cmd, False, f"{cmd.action} interrupted by {type(e).__name__} on the training thread; "
                                    "nothing was kept")
            raise
        # A handler may finish asynchronously (a profile spans steps): it then returns None.
        if message is not None:
            self.finish(cmd, ok, message, details)

    def finish(self, cmd: Command, ok: bool, message: str, details: dict[str, Any] | None = None) -> None:
        """Sends the one Result for ``cmd`` and frees its action."""
        with self._lock:
            self._busy.discard(cmd.action)
        self._result(cmd, ok, message, details or {})

    def _result(self, cmd: Command, ok: bool, message: str, details: dict[str, Any] | None = None) -> None:
        plain = {k: v for k, v in (details or {}).items() if v is None or isinstance(v, (int, float, str, bool))}
        self._emit(Result(t=self._clock(), id=cmd.id, action=cmd.action, ok=ok, message=message, details=plain))
        listener = self._on_result.pop(cmd.id, None)
        if listener is not None:
            try:
                listener(ok, message, plain)
            except Exception as e:  # the listener's probe stops; the command has its Result
                self._probe_failed(getattr(listener, "probe", "agent"), e)

    def fail_pending(self, reason: str) -> None:
        while self.pending:
            cmd = self.pending.popleft()
            self.finish(cmd, False, reason)

    def detach(self) -> None:
        """In a forked child: nothing is queued any more (the queue takes nothing)."""
        self.pending = collections.deque(maxlen=0)
