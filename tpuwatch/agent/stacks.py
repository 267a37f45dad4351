"""Stack dumps of the training process, for runs that stall or hang.

Two ways in, because a hang can be of two kinds:

* the ``stack_dump`` command (registered with ``at_step_boundary=False``): it runs on the
  transport's server thread, so it answers while the training thread is stuck in a collective,
  an input pipeline, a sleep or a Python loop. It formats every thread's stack
  (``sys._current_frames``), marks the training (main) thread, writes
  ``<run_dir>/stacks/<timestamp>.txt``, emits a :class:`~tpuwatch.protocol.StackDump` and
  returns the path.
* ``faulthandler`` on SIGUSR1, for a hang inside C code that holds the GIL (no Python thread,
  the server's included, can run then): the C-level handler still writes every thread's
  Python stack to ``<run_dir>/stacks/faulthandler.txt``. ``tpuwatch`` sends SIGUSR1 when the
  command gets no answer. Installed only when the script has not claimed SIGUSR1 itself.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from tpuwatch import rundir
from tpuwatch.protocol import Command, StackDump

if TYPE_CHECKING:
    from tpuwatch.agent.agent_api import Agent
    from tpuwatch.agent.patches import Patches

#: Sub-directory of the run directory the dumps go to.
STACKS_DIR = "stacks"
#: The file faulthandler appends to on SIGUSR1.
FAULTHANDLER_FILE = "faulthandler.txt"
#: The StackDump message carries at most this much text (the file has all of it).
MAX_MESSAGE_CHARS = 200_000
#: A thread's stack is cut to its innermost frames beyond this many.
MAX_FRAMES = 200


def format_stacks(current: int | None = None, *, step: int | None = None,
                  clock: Callable[[], float] = time.time) -> str:
    """Every thread's Python stack, the training (main) thread first and marked.

    ``current``: the ident of the thread doing the dump (marked as such, since its own frames
    are the dump's, not the program's).
    """
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    order = sorted(frames, key=lambda ident: (ident != main_ident, threads.get(ident) is None,
                                              getattr(threads.get(ident), "name", "")))
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(clock()))
    head = f"tpuwatch stack dump: pid {os.getpid()}, {when}"
    if step is not None:
        head += f", global step {step}"
    out = [head, f"{len(frames)} threads; the training thread is the main thread", ""]
    for ident in order:
        thread = threads.get(ident)
        name = thread.name if thread is not None else "(not a threading.Thread)"
        notes = []
        if ident == main_ident:
            notes.append("TRAINING THREAD")
        if ident == current:
            notes.append("this dump")
        elif name.startswith("tpuwatch-"):
            notes.append("tpuwatch")
        if thread is not None and thread.daemon:
            notes.append("daemon")
        label = f" [{', '.join(notes)}]" if notes else ""
        out.append(f'Thread "{name}" (ident {ident}){label}, most recent call last:')
        stack: list[traceback.FrameSummary] = traceback.extract_stack(frames[ident])
        if len(stack) > MAX_FRAMES:
            out.append(f"  ... {len(stack) - MAX_FRAMES} outer frames left out ...")
            stack = stack[-MAX_FRAMES:]
        out.extend(line.rstrip("\n") for line in traceback.format_list(stack))
        out.append("")
    del frames  # frames keep every local of every thread alive
    return "\n".join(out)


class StackDumper:
    """The ``stack_dump`` command handler, and the SIGUSR1 faulthandler file."""

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.dir = Path(agent.run_dir) / STACKS_DIR
        self._fault_file: IO[str] | None = None

    def _ensure_dir(self) -> Path:
        self.dir.mkdir(mode=0o700, exist_ok=True)
        return self.dir

    def dump(self, cmd: Command) -> tuple[str | None, dict[str, Any]]:
        text = format_stacks(threading.get_ident(), step=self.agent.global_step, clock=self.agent.clock)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.agent.clock()))
        path = self._ensure_dir() / f"{stamp}-{cmd.id[:16] or 'dump'}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)  # never through a link
        with os.fdopen(fd, "w") as f:
            f.write(text)
        shown = text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + f"\n... cut; all of it in {path}\n"
        self.agent.emit(StackDump(t=self.agent.clock(), text=shown, path=str(path)))
        return f"stack dump written to {path}", {"path": str(path)}

    def install_faulthandler(self) -> bool:
        """Registers faulthandler on SIGUSR1 unless the script or Python already handles it."""
        if not hasattr(signal, "SIGUSR1"):
            return False
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
            return False
        path = self._ensure_dir() / FAULTHANDLER_FILE
        fd = rundir.open_append(path)
        # Kept open for the life of the process: faulthandler writes to its fd from a C handler.
        self._fault_file = os.fdopen(fd, "a")
        faulthandler.register(signal.SIGUSR1, file=self._fault_file, all_threads=True, chain=False)
        return True

    def uninstall(self) -> None:
        if self._fault_file is not None:
            faulthandler.unregister(signal.SIGUSR1)
            self._fault_file.close()
            self._fault_file = None


def install(agent: "Agent", patches: "Patches") -> StackDumper:
    """Registers ``stack_dump`` (answered even while training hangs) and the SIGUSR1 dump."""
    dumper = StackDumper(agent)
    agent.register("stack_dump", dumper.dump, at_step_boundary=False)
    try:
        dumper.install_faulthandler()
    except (OSError, ValueError, RuntimeError) as e:
        # Not fatal: the command still works for hangs that let Python threads run.
        agent.event("warning", "probe:stacks", f"no SIGUSR1 stack dump: {type(e).__name__}: {e}")
    return dumper
