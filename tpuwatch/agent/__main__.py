"""``python -m tpuwatch.agent [options] SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``).

Installs the probes, starts the agent thread and socket, then runs the user's script as
``__main__`` with the user's ``sys.argv``, unmodified. The exit code is the script's own.
"""

from __future__ import annotations

# ruff: noqa: E402 (the working directory leaves sys.path before the other imports)
import os
import sys

# `python -m tpuwatch.agent` put the working directory first on sys.path, where `python train.py`
# puts the script's directory: it goes before anything more is imported through it (a secrets.py
# there shadowed the standard module, for the agent and the script). as_plain_python() puts what
# Python would have put back (the working directory itself for `-m MODULE`).
_CWD_TAKEN = sys.path.pop(0) if __name__ == "__main__" and sys.path and sys.path[0] == os.getcwd() else None

import argparse
import importlib.util
import runpy
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from tpuwatch import address, rundir, settings
from tpuwatch.agent import clocks, exit_guard
from tpuwatch.agent.traceback_filters import own_frame
from tpuwatch.protocol import clip_argv

if TYPE_CHECKING:
    import types

    from tpuwatch.agent.runtime import Agent

EXIT_USAGE = 2


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tpuwatch.agent",
        allow_abbrev=False,
        description="Run a TensorFlow training script under the tpuwatch agent.",
    )
    p.add_argument("--run-dir", type=Path, help="run directory (default: $TPUWATCH_RUN_DIR or a new one)")
    p.add_argument("--sample-hz", type=float, default=settings.SAMPLE_HZ.positive_float(),
                   help="periodic sampling rate, 0.5-20 Hz (default 4)")
    p.add_argument("--listen", default=settings.LISTEN.get(),
                   help="also serve viewers over TCP at HOST:PORT (token in the run directory)")
    p.add_argument("--disable", default=settings.DISABLE.get(),
                   help="comma-separated probes to leave out")
    p.add_argument("-m", dest="module", help="run a module (like python -m)")
    p.add_argument("script", nargs="?", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = p.parse_args(argv)
    if ns.module and ns.script:
        ns.args = [ns.script] + ns.args
        ns.script = None
    if not ns.module and not ns.script:
        p.error("name a training script (or -m MODULE)")
    return ns


def parse_listen(value: str) -> tuple[str, int] | None:
    return address.parse_listen(value)


def main(argv: list[str] | None = None) -> int:
    ns = _parse(sys.argv[1:] if argv is None else argv)
    target = ns.module or ns.script
    if ns.script:
        script = Path(ns.script)
        if not script.is_file():
            print(f"tpuwatch: script not found: {ns.script} (give the path of a Python training script)", file=sys.stderr)
            return EXIT_USAGE
    if importlib.util.find_spec("tensorflow") is None:
        print(f"tpuwatch: TensorFlow is not importable in {sys.executable}; "
              "install it with `pip install 'tpuwatch[tf]'` (or tensorflow-tpu on a TPU VM)", file=sys.stderr)
        return EXIT_USAGE
    try:
        listen = parse_listen(ns.listen)
    except ValueError as e:
        print(f"tpuwatch: {e}", file=sys.stderr)
        return EXIT_USAGE

    run_dir = ns.run_dir or (Path(settings.RUN_DIR.get()) if settings.RUN_DIR.get() else None)
    run_id = settings.RUN_ID.get() or rundir.new_run_id(target)
    if run_dir is None:
        run_dir = rundir.runs_root() / run_id
    try:
        rundir.create(run_dir)
    except rundir.RunDirError as e:
        print(f"tpuwatch: run directory: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"tpuwatch: run directory {run_dir} is not writable ({e.strerror}); set TPUWATCH_HOME or pass "
              "--run-dir", file=sys.stderr)
        return EXIT_USAGE
    if not rundir.read_meta(run_dir):
        # Started on its own (not by `tpuwatch run`): leave the metadata `ls`/`attach` need.
        rundir.write_meta(run_dir, {"run_id": run_id, "script": target, "argv": clip_argv([target, *ns.args]),
                                    "child_pid": os.getpid(), "child_identity": rundir.process_identity(os.getpid()),
                                    "started": clocks.wall(), "host": rundir.hostname(),
                                    "cwd": os.getcwd(), "state": "running"})

    from tpuwatch.agent.runtime import Agent

    try:
        agent = Agent(run_dir, run_id, sample_hz=ns.sample_hz)
    except OSError as e:  # its recording is a planted link, another user's file, ...: the script does not start
        print(f"tpuwatch: cannot record the run: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE

    from tpuwatch.agent import probes

    disabled = {name.strip() for name in ns.disable.split(",") if name.strip()}
    installed = probes.install_all(agent, target, [target, *ns.args], disabled)
    _start_server(agent, run_dir, listen)
    agent.start()
    from tpuwatch.agent import guards

    guards.install(agent)  # full disk, fork(), SIGTERM
    if ns.script:
        guards.install_reexec(agent, ns.script)
    code, sig, reason = _run_script(agent, ns, target)
    agent.phases.finishing()
    code, sig, reason = _finish_python(code, sig, reason)
    if sig is None and std_flush_fails():
        code, reason = EXIT_FLUSH_FAILED, reason or "Python could not flush sys.stdout or sys.stderr at exit"
    if agent.step_probe is not None:  # the last step's losses, if its record went without them
        try:
            agent.step_probe.read_unread_losses()
        except Exception as e:  # the exit record comes next whatever the probe does
            agent.probe_failed("steps", e)
    from tpuwatch.protocol import Exit

    agent.emit(Exit(t=clocks.wall(), exit_code=code, signal=sig, source="agent", reason=reason), force=True)
    agent.shutdown("the script ended before the next step boundary")
    probes.uninstall(installed)
    bound = exit_guard.bound_s()
    agent.flush()
    agent.stop()
    exit_guard.flush_std()  # the script's files were flushed once it ended (finish_python)
    if sig is not None:  # die by the signal, like Python does for SIGINT
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    exit_guard.arm(code, run_dir, bound)
    return code


def _start_server(agent: Agent, run_dir: Path, listen: tuple[str, int] | None) -> None:
    from tpuwatch.agent.transport import Server

    # Workers of one job may share a token (TPUWATCH_TOKEN), so one viewer can attach to all.
    token = rundir.write_token(run_dir, settings.TOKEN.get() or None) if listen else None
    try:
        agent.server = Server(agent, rundir.socket_path(run_dir), listen, token)
        agent.server.start()
    except OSError as e:
        agent.event("error", "transport", f"viewers cannot attach: {e} (the recording still works)")
        return
    where = {"socket": str(agent.server.unix_path)}
    if agent.server.tcp_address:
        where["tcp"] = "%s:%d" % agent.server.tcp_address
    rundir.update_meta(run_dir, **where)


def _finish_python(code: int, sig: int | None, reason: str) -> tuple[int, int | None, str]:
    """Waits for the script's non-daemon threads and runs its atexit handlers (training may go on
    in a thread after the main module returns: the agent records it until it ends). A Ctrl-C
    here ends the wait as it would in Python."""
    try:
        exit_guard.finish_python()
    except KeyboardInterrupt:
        if sig is None:
            return 128 + signal.SIGINT, signal.SIGINT, "interrupted (SIGINT) while waiting for the script's threads"
    except BaseException as e:  # an atexit handler's own error is printed, as Python does
        write_stderr(f"Error in atexit handler: {type(e).__name__}: {e}\n")
    return code, sig, reason


def _run_script(agent: Agent, ns: argparse.Namespace, target: str) -> tuple[int, int | None, str]:
    """Runs the script; returns its exit code, the signal that ended it (or None) and why."""
    from tpuwatch.agent import stopper
    from tpuwatch.agent.runtime import format_exception
    from tpuwatch.protocol import ExceptionRaised

    sys.argv = [target, *ns.args]
    code = 0
    sig: int | None = None
    reason = ""
    try:
        as_plain_python(ns.script)
        stopper.SCRIPT_RUNNING.set()  # a remote stop interrupts the script from now on
        try:
            if ns.module:
                runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
            else:
                # `python x.py` compiles it (and names it in tracebacks, __file__) by its absolute
                # path; sys.path is as_plain_python's
                runpy.run_path(os.path.abspath(ns.script), run_name="__main__")
        finally:
            stopper.SCRIPT_RUNNING.clear()
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        sig = signal.SIGINT
        code = 128 + sig
        reason = "interrupted (SIGINT)"
    except BaseException as e:  # the script's own exception: record it, then behave like Python
        text = _text_of(e)
        agent.emit(ExceptionRaised(t=clocks.wall(), type=type(e).__name__, message=text[:2000],
                                   traceback=format_exception(e)[-20000:]), force=True)
        try:
            _print_as_python_would(e)
        except Exception:  # noqa: BLE001  (Python's own printing gives up quietly too; the record is kept)
            pass
        code = 1
        reason = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]
    return code, sig, reason


def _text_of(e: BaseException) -> str:
    """``str(e)``, or what Python prints when the script's ``__str__`` raises."""
    try:
        return str(e)
    except Exception:  # noqa: BLE001  (any error of the script's own __str__)
        return "<exception str() failed>"


def as_plain_python(script: str | None) -> None:
    """``sys.path`` and ``PYTHONPATH`` as ``python SCRIPT`` (or ``python -m MODULE``) gives them:
    ``-m tpuwatch.agent`` put the working directory first (a ``secrets.py`` there would shadow the
    standard module), where Python puts the script's directory; and the launcher's entry for
    tpuwatch leaves PYTHONPATH (tpuwatch's own modules import through its package, already loaded)."""
    ours = settings.PACKAGE_PATH.get()
    if ours:
        value = os.environ.get("PYTHONPATH", "")
        if value == ours:
            del os.environ["PYTHONPATH"]
        elif value.startswith(ours + os.pathsep):
            os.environ["PYTHONPATH"] = value[len(ours) + 1:]
        else:
            ours = ""  # changed since the launcher set it: leave it alone
        if ours:
            sys.path[:] = without_launcher_entry(sys.path, ours, os.environ.get("PYTHONPATH", ""))
    if _CWD_TAKEN is not None and script is None:
        sys.path.insert(0, _CWD_TAKEN)  # python -m MODULE: the working directory, as we found it
    elif script is not None and not getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH (3.11+)
        sys.path.insert(0, str(Path(script).resolve().parent))


def without_launcher_entry(path: list[str], ours: str, user_pythonpath: str,
                           site_dirs: list[str] | None = None, stdlib_dirs: list[str] | None = None) -> list[str]:
    """``path`` (sys.path) as plain python builds it without the launcher's PYTHONPATH entry
    ``ours``. Python's ``site`` skips a directory already on sys.path, so the entry is the only one:
    kept where the user's PYTHONPATH names it too; where it is a site-packages directory (a pip
    install: TensorFlow is there) moved to where ``site`` puts it, after the standard library;
    else removed (a source checkout)."""
    import site
    import sysconfig

    if ours not in path or ours in user_pythonpath.split(os.pathsep):
        return list(path)
    out = list(path)
    out.remove(ours)
    real = os.path.realpath
    if site_dirs is None:
        site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    if real(ours) not in {real(d) for d in site_dirs}:
        return out
    if stdlib_dirs is None:
        stdlib_dirs = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")]
    libs = {real(d) for d in stdlib_dirs}
    at = 0
    for i, p in enumerate(out):
        rp = real(p)
        if p.endswith(".zip") or any(rp == d or rp.startswith(d + os.sep) for d in libs):
            at = i + 1
    out.insert(at, ours)
    return out


def _without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without tpuwatch's frames (a new chain; the frames are the same)."""
    import types

    kept = []
    while tb is not None:
        if not own_frame(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out: types.TracebackType | None = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def plain_traceback(exc: BaseException) -> str:
    """The script's uncaught exception as `python script.py` prints it: no tpuwatch or runpy
    frames, in the exception and in those it was raised from (or while handling). Drops them
    from the tracebacks themselves (the script has ended)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        try:
            e.__traceback__ = _without_own_frames(e.__traceback__)
        except (TypeError, ValueError, AttributeError):
            pass  # printed with its frames rather than not at all
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return _printed_by_python(exc)


def _printed_by_python(exc: BaseException) -> str:
    """What Python's own printing (``sys.__excepthook__``; C code up to 3.12) writes for ``exc``.
    Not the traceback module's: the two differ where an entry's line and its instruction disagree,
    as in the tracebacks TensorFlow's and Keras' filters rebuild (the line they kept, the
    instruction where the frame ended): Python prints the line. Written into a buffer that stands
    in for sys.stderr meanwhile (another thread's write in that instant joins the text)."""
    import io
    import traceback

    buf = io.StringIO()
    saved = sys.stderr
    try:
        sys.stderr = buf
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
    except Exception:  # printed by the traceback module rather than not at all
        buf = io.StringIO()
    finally:
        sys.stderr = saved
    return buf.getvalue() or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _print_as_python_would(exc: BaseException) -> None:
    """:func:`plain_traceback` on stderr, or through the script's own ``sys.excepthook`` when it
    set one (as Python would call it)."""
    text = plain_traceback(exc)
    hook = getattr(sys, "excepthook", None)  # a script may have deleted it
    if hook is not None and hook is not sys.__excepthook__:
        try:
            hook(type(exc), exc, exc.__traceback__)
            return
        except BaseException:  # a broken hook of the script's: Python falls back to its own printing
            pass
    write_stderr(text)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    write_stderr(f"{value}\n")
    return 1


def write_stderr(text: str) -> None:
    """Writes ``text`` to the script's ``sys.stderr`` as Python writes a traceback there: not at
    all when the script set it to None, and ignoring the errors of a stream the script closed or
    replaced (a closed descriptor, an object without ``flush``): they must not become tpuwatch's
    own traceback, nor cost the run its exit record."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(text)
    except (OSError, ValueError, AttributeError, TypeError):
        return  # Python, too, drops a traceback its stderr does not take
    try:
        stream.flush()
    except (OSError, ValueError, AttributeError, TypeError):
        pass  # as Python does (its flush after a traceback ignores errors)


#: Python's exit status when its last flush of sys.stdout/sys.stderr fails (Py_FinalizeEx).
EXIT_FLUSH_FAILED = 120


def std_flush_fails() -> bool:
    """Whether the interpreter's flush of ``sys.stdout``/``sys.stderr`` at exit will fail (the
    script replaced one with an object without ``flush``, ...): Python then exits with 120."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False) is True:
            continue
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError, TypeError):
            return True
    return False


if __name__ == "__main__":
    sys.exit(main())
