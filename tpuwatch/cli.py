"""The ``tpuwatch`` command: run | attach | replay | report | compare | export | ls | profile | checkpoint | doctor.

The parser is assembled here from each command's module (:mod:`tpuwatch.commands`), which also
holds that command's flow. Imports nothing heavy at module level: ``tpuwatch --help`` must stay
fast and never needs TensorFlow (the UI process never imports it at all).
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from tpuwatch import __version__
from tpuwatch.commands import action, attach, compare, doctor, export, ls, replay, report, run
from tpuwatch.commands.lines import EXIT_USAGE, error
from tpuwatch.commands.streams import quiet_stdout

DESCRIPTION = """\
Watch and diagnose TensorFlow training from the terminal.

  tpuwatch run train.py [ARGS]       start a script under the agent and open the dashboard
  tpuwatch run --headless train.py   progress lines instead of the dashboard (automatic when
                                     stdout is not a terminal)
  tpuwatch attach [RUN]              re-join a run (the latest by default)
  tpuwatch replay RUN                play a recorded run back
  tpuwatch report RUN                summary and findings of a run
  tpuwatch compare RUN_A RUN_B [...] runs side by side: figures, step-time difference with its
                                     95% interval, losses by step, findings, setup
  tpuwatch export RUN --tensorboard LOGDIR   its series as TensorBoard scalars
  tpuwatch ls                        list runs
  tpuwatch profile [RUN]             capture a profile of a live run now
  tpuwatch checkpoint [RUN]          save a checkpoint of a live run now
  tpuwatch doctor                    check TensorFlow, TPU, GCS and the run directory

Runs are recorded under $TPUWATCH_HOME/runs (default ~/.tpuwatch/runs), where run ids and
`tpuwatch ls` look; a run recorded elsewhere with `run --run-dir DIR` is named by its path.
"""


class _Parser(argparse.ArgumentParser):
    """Bad input is one line naming what is wrong and where the help is (not the usage block).
    No abbreviations: `--headles` is refused, not taken for `--headless` (subcommands' parsers
    are of this class too)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"tpuwatch: {message}; see `{self.prog} --help`\n")


#: Each command's parser, in the order --help lists them, and its flow.
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], argparse.ArgumentParser],
                          Callable[[argparse.Namespace], int]]] = {
    "run": (run.add_parser, run.main),
    "attach": (attach.add_parser, attach.main),
    "replay": (replay.add_parser, replay.main),
    "report": (report.add_parser, report.main),
    "export": (export.add_parser, export.main),
    "compare": (compare.add_parser, compare.main),
    "ls": (ls.add_parser, ls.main),
    "profile": (action.add_profile_parser, action.main),
    "checkpoint": (action.add_checkpoint_parser, action.main),
    "doctor": (doctor.add_parser, doctor.main),
}


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tpuwatch", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tpuwatch {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add_parser, _ in COMMANDS.values():
        add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if unknown:
        where = f"tpuwatch {ns.command}" if ns.command else "tpuwatch"
        kind = "option" if unknown[0].startswith("-") else "argument"
        order = " (tpuwatch's options go before the script, the script's after it)" if ns.command == "run" else ""
        return error(f"unrecognized {kind} {unknown[0]} for `{where}`{order}; see `{where} --help`")
    if ns.command is None:
        parser.print_help()
        return EXIT_USAGE
    handler = COMMANDS[ns.command][1]
    from tpuwatch import rundir

    try:
        return shell_exit_code(handler(ns))
    except rundir.RunDirError as e:  # a home another user could write into, ...: one line, never a traceback
        return error(str(e.strerror))
    except PermissionError as e:
        return error(f"cannot access {e.filename or 'a file'}: permission denied; run tpuwatch as the user "
                     "who owns the run (or give a run of your own)")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `tpuwatch ls | head`: the reader has had enough. Quiet, like other Unix tools; stdout
        # goes to /dev/null so the interpreter's final flush cannot raise again.
        quiet_stdout()
        return 141  # 128 + SIGPIPE, what a shell shows for a tool killed by it


def shell_exit_code(code: int) -> int:
    """A command's exit code as a shell can see it (0-255): a recorded code outside that range
    (a crafted recording's 256, a ``Popen``-style -9) is never truncated into success: -N for
    signal N is 128+N, anything else out of range is 1."""
    if 0 <= code <= 255:
        return code
    if -64 < code < 0:
        return 128 - code
    return 1


if __name__ == "__main__":
    sys.exit(main())
