"""`tpuwatch run` from the outside: bad input gets one clear line and a non-zero exit; a headless
run prints progress and a summary, passes the script's output and exit code through."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch_testing import SCRIPTS, child_env


def tpuwatch(*args: str, cwd: Path | None = None, timeout: float = 240, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=child_env(**(env or {})))


def _one_line_error(proc, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tpuwatch: ")
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_script(tmp_path):
    _one_line_error(tpuwatch("run", "--headless", str(tmp_path / "nope.py")), "script not found", "nope.py")


def test_a_typod_script_path_gets_did_you_mean(tmp_path):
    """`tpuwatch run trian.py` next to train.py names train.py."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "other.py").write_text("print('hi')\n")
    _one_line_error(tpuwatch("run", "--headless", "trian.py", cwd=tmp_path), "script not found: trian.py",
                    "did you mean train.py?")
    _one_line_error(tpuwatch("run", "--headless", str(tmp_path / "trian.py")),
                    f"did you mean {tmp_path / 'train.py'}?")
    _one_line_error(tpuwatch("run", "--headless", "zzz.py", cwd=tmp_path), "script not found: zzz.py")
    assert "did you mean" not in tpuwatch("run", "--headless", "zzz.py", cwd=tmp_path).stderr


@pytest.mark.parametrize("command", [("run", "--headles", "x.py"), ("report", "--form", "json"),
                                     ("attach", "--ever", "1"), ("checkpoint", "--time", "1")])
def test_option_abbreviations_are_refused(tmp_path, command):
    """`--headles` was taken silently for `--headless`."""
    _one_line_error(tpuwatch(*command, cwd=tmp_path), command[1])


@pytest.mark.tf
def test_tpuwatch_options_after_the_script_get_a_hint(tmp_path):
    """`tpuwatch run script.py --headless --short` failed inside the script
    (its argparse: "unrecognized arguments: --headless") with only "exit code 2"."""
    script = tmp_path / "train.py"
    script.write_text("import argparse\n"
                      "parser = argparse.ArgumentParser()\n"
                      "parser.add_argument('--short', action='store_true')\n"
                      "print(parser.parse_args())\n")
    proc = tpuwatch("run", "--headless", str(script), "--short", "--every", "3", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "unrecognized arguments: --every 3" in proc.stdout  # the script's own words, untouched
    hint = [line for line in proc.stderr.splitlines() if "go before the script" in line]
    assert len(hint) == 1 and "--every" in hint[0] and "--short" not in hint[0], proc.stderr
    # a script's own exit 2 with nothing of tpuwatch's in it: no hint
    script.write_text("import sys\nprint('unrecognized arguments: --frobnicate')\nsys.exit(2)\n")
    proc = tpuwatch("run", "--headless", str(script), cwd=tmp_path)
    assert proc.returncode == 2 and "go before the script" not in proc.stderr, proc.stderr


def test_not_a_python_file(tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    _one_line_error(tpuwatch("run", "--headless", str(data)), "not a Python file")
    binary = tmp_path / "model.py"
    binary.write_bytes(b"\x00\x01\x02")
    _one_line_error(tpuwatch("run", "--headless", str(binary)), "not a Python file")


def test_interpreter_without_tensorflow(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    _one_line_error(tpuwatch("run", "--headless", "--python", str(venv / "bin" / "python"), str(script)),
                    "TensorFlow is not importable", "pip install 'tpuwatch[tf]'")


@pytest.mark.tf
def test_unwritable_run_directory(tmp_path):
    if os.geteuid() == 0:
        # root writes anywhere: make the parent a file instead, which nobody can create dirs under.
        blocker = tmp_path / "file"
        blocker.write_text("")
        target = blocker / "run"
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = locked / "run"
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    _one_line_error(tpuwatch("run", "--headless", "--run-dir", str(target), str(script)),
                    "is not writable", "--run-dir")


def test_unknown_run_reference():
    _one_line_error(tpuwatch("report", "no-such-run"), "no run 'no-such-run'", "tpuwatch ls")


@pytest.mark.tf
def test_headless_run_prints_progress_passes_output_and_exit_code(tmp_path):
    run_dir = tmp_path / "run"
    proc = tpuwatch("run", "--headless", "--every", "1", "--run-dir", str(run_dir), str(SCRIPTS / "exits.py"),
                    "--exit", "3")
    assert proc.returncode == 3, proc.stderr
    assert "ok" not in proc.stdout  # the script exited before printing
    assert f"recording in {run_dir}" in proc.stderr
    assert "exit code 3" in proc.stderr
    assert "steps" in proc.stderr and "3" in proc.stderr  # the summary names the 3 steps it ran

    ok = tpuwatch("run", "--headless", "--run-dir", str(tmp_path / "ok"), str(SCRIPTS / "exits.py"))
    assert ok.returncode == 0
    assert any(line.startswith("ok ") for line in ok.stdout.splitlines())  # the script output reaches stdout


@pytest.mark.tf
def test_a_module_runs_with_dash_m(tmp_path):
    pkg = tmp_path / "mytrainer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(SCRIPTS / "exits.py", pkg / "train.py")
    proc = tpuwatch("run", "--headless", "--run-dir", str(tmp_path / "run"), "-m", "mytrainer.train", cwd=tmp_path,
                    env={"PYTHONPATH": os.pathsep.join([str(tmp_path), child_env()["PYTHONPATH"]])})
    assert proc.returncode == 0, proc.stderr
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert events.count('"kind":"step"') == 3


@pytest.mark.tf
def test_a_scripts_own_excepthook_gets_its_exception_without_tpuwatchs_frames(tmp_path):
    """As under plain python, an uncaught exception goes to the script's sys.excepthook; the
    traceback it gets starts at the script."""
    script = tmp_path / "hooked.py"
    script.write_text("import sys, traceback\n"
                      "def hook(kind, exc, tb):\n"
                      "    print('HOOK', [f.filename for f in traceback.extract_tb(tb)], flush=True)\n"
                      "sys.excepthook = hook\n"
                      "raise RuntimeError('boom')\n")
    proc = tpuwatch("run", "--headless", "--run-dir", str(tmp_path / "run"), str(script))
    assert proc.returncode == 1, proc.stderr
    assert f"HOOK ['{script}']" in proc.stdout, proc.stdout
