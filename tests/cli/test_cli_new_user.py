"""What a new user's first hour hit (the tryout report): every bad reference or option gets one
line naming what is wrong and what to do; the hints tpuwatch prints work when pasted; `ls`
fits the terminal."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuwatch import rundir
from tpuwatch_testing import child_env

ROBUSTNESS = Path(__file__).resolve().parents[1] / "robustness"
sys.path.insert(0, str(ROBUSTNESS))
from hard_edges import one_line_error, tpuwatch, write_script  # noqa: E402


def _fake_run(runs: Path, run_id: str, script: str = "train.py", steps: int | None = 10) -> Path:
    d = runs / run_id
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "script": script, "started": 1.0e9,
                                            "exit_code": 0, "state": "finished", "steps": steps}))
    (d / "events.jsonl").write_text("")
    return d


@pytest.fixture
def home_with_runs(tmp_path) -> Path:
    home = Path(os.environ["TPUWATCH_HOME"])
    _fake_run(home / "runs", "20261123-000000-train-aaaa")
    _fake_run(home / "runs", "20261123-000001-train-bbbb")
    return home


@pytest.mark.parametrize("command", ["report", "replay", "attach"])
@pytest.mark.parametrize("what", ["empty-dir", "plain-dir", "file", "empty-events-only"])
def test_a_path_that_is_not_a_run(tmp_path, home_with_runs, command, what):
    """Before: `tpuwatch report /tmp` ended in NotImplementedError: Non-relative patterns are unsupported.
    A directory with nothing but an empty events.jsonl (tpuwatch writes run.json before anything
    else) was attached as a run that was "lost" (exit 1)."""
    target = tmp_path / "target"
    if what == "file":
        target.write_text("root:x:0:0\n")
    else:
        target.mkdir()
        if what == "plain-dir":
            (target / "notes.txt").write_text("x")
        if what == "empty-events-only":
            (target / "events.jsonl").write_text("")
    line = one_line_error(tpuwatch(command, str(target)), str(target), "not a run directory")
    assert "tpuwatch ls" in line


@pytest.mark.parametrize("command", ["report", "replay", "attach"])
@pytest.mark.parametrize("ref", ["*", "2026*", "**", "[", "?"])
def test_glob_characters_are_taken_literally(home_with_runs, command, ref):
    """Before: `tpuwatch report '*'` globbed recursively ("ambiguous (runs, ...)")."""
    one_line_error(tpuwatch(command, ref), f"no run {ref!r}", "tpuwatch ls")


def test_a_run_id_prefix_still_finds_the_run(home_with_runs):
    proc = tpuwatch("report", "20261123-000001", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    one_line_error(tpuwatch("report", "20261123-00000"), "ambiguous", "20261123-000000-train-aaaa")


def test_one_worker_of_a_group_by_run_id(home_with_runs):
    """docs/multihost.md: give `<run>/worker-1` to look at one worker alone."""
    _fake_run(home_with_runs / "runs" / "20261123-000002-group-cccc", "worker-1")
    proc = tpuwatch("report", "20261123-000002-group-cccc/worker-1", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    one_line_error(tpuwatch("report", "20261123-000002-group-cccc/worker-7"), "worker-7", "tpuwatch ls")


def _last_hint(stderr: str) -> list[str]:
    last = [line for line in stderr.splitlines() if "for the" in line and "report" in line][-1]
    return shlex.split(last.split("`")[1])


@pytest.mark.parametrize("workers", [None, 2])
@pytest.mark.tf
def test_the_end_hint_works_for_a_run_dir_outside_the_runs_home(tmp_path, workers):
    """Before: `--run-dir /x/runs/mw` ended with "`tpuwatch report mw`", which said "no run 'mw'"."""
    script = write_script(tmp_path / "hello.py", "print('hello')\n")
    run_dir = tmp_path / "elsewhere" / "mw"
    extra = ["--workers", str(workers)] if workers else []
    proc = tpuwatch("run", "--headless", *extra, "--run-dir", str(run_dir), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    hint = _last_hint(proc.stderr)
    assert hint[:2] == ["tpuwatch", "report"] and Path(hint[2]) == run_dir, hint
    # pasted from another directory, the hint still works
    report = tpuwatch(*hint[1:], cwd=ROBUSTNESS)
    assert report.returncode == 0, report.stderr


@pytest.mark.tf
def test_the_end_hint_is_the_run_id_under_the_runs_home(tmp_path):
    script = write_script(tmp_path / "hello.py", "print('hello')\n")
    proc = tpuwatch("run", "--headless", str(script))
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (Path(os.environ["TPUWATCH_HOME"]) / "runs").iterdir()
    assert _last_hint(proc.stderr) == ["tpuwatch", "report", run_dir.name]


@pytest.mark.parametrize("every", ["-1", "0", "nan", "inf"])
def test_every_must_be_positive(tmp_path, every):
    script = write_script(tmp_path / "hello.py", "print('hello')\n")
    one_line_error(tpuwatch("run", "--headless", "--every", every, str(script)), "--every", "positive")
    assert not (Path(os.environ["TPUWATCH_HOME"]) / "runs").exists()


def test_run_without_a_script_says_the_script_is_required():
    line = one_line_error(tpuwatch("run"), "script", "tpuwatch run --help")
    assert "args" not in line


def test_an_unknown_option_names_it_and_the_help():
    one_line_error(tpuwatch("run", "--headless", "--bogus", "x.py"), "--bogus", "tpuwatch run --help")
    one_line_error(tpuwatch("report", "--bogus"), "--bogus", "tpuwatch report --help")
    one_line_error(tpuwatch("bogus"), "bogus", "tpuwatch --help")


@pytest.mark.tf
def test_an_unknown_module(tmp_path):
    """Before: a "crashed" run recorded and a multi-line traceback."""
    line = one_line_error(tpuwatch("run", "--headless", "-m", "no.such.module", cwd=tmp_path), "no.such.module")
    assert "no module named" in line.lower()
    assert not (Path(os.environ["TPUWATCH_HOME"]) / "runs").exists()


def test_doctor_rejects_a_gcs_address_before_checking_anything():
    """Before: it imported TensorFlow for seconds, then failed the check."""
    proc = tpuwatch("doctor", "--gcs", "notabucket")
    one_line_error(proc, "notabucket", "gs://BUCKET")
    assert proc.stdout == ""


def test_replay_into_a_pipe_says_it_needs_a_terminal(home_with_runs):
    """Before: escape codes into the pipe, and it never exited."""
    one_line_error(tpuwatch("replay", "20261123-000001", timeout=60), "terminal", "tpuwatch report")


def test_ls_fits_the_terminal(tmp_path):
    runs = Path(os.environ["TPUWATCH_HOME"]) / "runs"
    ids = [f"20261123-0{i}0000-{'a_rather_long_training_script_name'[: 10 + 6 * i]}-ab{i}d" for i in range(4)]
    for i, run_id in enumerate(ids):
        _fake_run(runs, run_id, script=f"/home/someone/projects/experiments/{'deep/' * i}train_{i}.py",
                  steps=10 ** (i + 2))
    for columns in (80, 100, 60):
        proc = subprocess.run([sys.executable, "-m", "tpuwatch", "ls"], capture_output=True, text=True,
                              env=child_env(COLUMNS=str(columns)), timeout=60)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert len(lines) == 5
        assert all(len(line) <= columns for line in lines), "\n".join(lines)
        for run_id in ids:  # the id is what the other commands take: never cut
            assert any(line.split()[0] == run_id for line in lines), (run_id, lines)
    wide = subprocess.run([sys.executable, "-m", "tpuwatch", "ls"], capture_output=True, text=True,
                          env=child_env(COLUMNS="250"), timeout=60).stdout
    assert "/home/someone/projects/experiments/deep/deep/deep/train_3.py" in wide


@pytest.mark.tf
def test_headless_streams_are_as_the_readme_says(tmp_path):
    """README: the script's stdout and stderr both reach tpuwatch's stdout (in the order written);
    tpuwatch's own lines go to stderr (the tryout's s_err.py, whose "to-stderr" landed in `>out`)."""
    script = write_script(tmp_path / "s_err.py", """
        import sys
        print("to-stdout", flush=True)
        print("to-stderr", file=sys.stderr, flush=True)
        sys.exit(3)
    """)
    proc = tpuwatch("run", "--headless", str(script))
    assert proc.returncode == 3
    assert proc.stdout.splitlines() == ["to-stdout", "to-stderr"], proc.stdout
    # none of the script's lines on tpuwatch's stream; the summary quotes the last one, in its own
    # row, because the script failed with no exception to say why
    lines = [line.strip() for line in proc.stderr.splitlines()]
    assert "to-stdout" not in lines and "to-stderr" not in lines, proc.stderr
    assert "output    to-stderr (the script's last line)" in lines and "to-stdout" not in proc.stderr
    assert "tpuwatch: exit code 3" in proc.stderr


DATA = Path(__file__).resolve().parents[1] / "data"


def _recorded_run(home: Path, run_id: str, child_pid: int | None, exit_code: int | None,
                  recording: str = "healthy_4replica.jsonl") -> Path:
    d = home / "runs" / run_id
    d.mkdir(parents=True)
    meta = {"run_id": run_id, "script": "train.py", "started": 1.75e9, "child_pid": child_pid}
    if child_pid is not None:  # what the launcher records beside the pid: the stand-in process is the run's
        meta["child_identity"] = rundir.process_identity(child_pid)
    if exit_code is not None:
        meta.update(exit_code=exit_code, state="finished" if exit_code == 0 else "crashed")
    (d / "run.json").write_text(json.dumps(meta))
    (d / "events.jsonl").write_bytes((DATA / recording).read_bytes())
    return d


def test_attach_into_a_pipe_prints_the_summary_of_an_ended_run(tmp_path):
    """Before: a dashboard into the pipe, waiting for keys forever."""
    home = Path(os.environ["TPUWATCH_HOME"])
    _recorded_run(home, "20261123-000002-train-cccc", child_pid=None, exit_code=0)
    proc = tpuwatch("attach", "20261123-000002", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout  # no escape codes into the pipe
    assert "MirroredStrategy" in proc.stdout and "steps" in proc.stdout, proc.stdout


def test_attach_into_a_pipe_exits_with_the_scripts_code():
    """As `tpuwatch run` does (docs/remote.md): `tpuwatch attach RUN > log && deploy` must not go on
    after a crash. Before: 0 whatever the run did."""
    home = Path(os.environ["TPUWATCH_HOME"])
    _recorded_run(home, "20261123-000004-train-eeee", child_pid=None, exit_code=1, recording="crashed.jsonl")
    proc = tpuwatch("attach", "20261123-000004", timeout=60)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "crashed" in proc.stdout, proc.stdout


def _progress_lines(stream, want: int, deadline_s: float = 60.0) -> list[str]:
    """Lines read from a viewer's stdout until ``want`` progress lines (``p50 ... input``) came;
    a bound on a hang, not a timing check."""
    lines: list[str] = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and sum("p50" in line for line in lines) < want:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
    return lines


@contextlib.contextmanager
def _viewer_of_a_running_run(run_id: str):
    """A recorded run whose training process (a sleeper) is alive, and `tpuwatch attach` into a
    pipe following it: yields ``(training, viewer)``; both are killed on the way out."""
    home = Path(os.environ["TPUWATCH_HOME"])
    training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    viewer = None
    try:
        _recorded_run(home, run_id, child_pid=training.pid, exit_code=None, recording="running_truncated.jsonl")
        viewer = subprocess.Popen([sys.executable, "-m", "tpuwatch", "attach", run_id[:15], "--every", "0.3"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        yield training, viewer
    finally:
        for proc in (viewer, training):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_attach_into_a_pipe_follows_a_running_run_until_it_ends(tmp_path):
    with _viewer_of_a_running_run("20261123-000003-train-dddd") as (training, viewer):
        first = _progress_lines(viewer.stdout, 1)
        assert any("p50" in line for line in first), first  # a progress line while training runs
        assert viewer.poll() is None, first
        training.kill()
        training.wait()
        out, err = viewer.communicate(timeout=60)
    # Killed with no exit record: the run is lost, and attach says so in its code too.
    assert viewer.returncode == 1, err
    assert "lost" in out and "MirroredStrategy" in out, out


def test_attach_into_a_pipe_whose_reader_left_ends_while_the_run_is_quiet(tmp_path):
    """`tpuwatch attach RUN | head -1` on a run that stalled (evaluation, a hang): nothing new to
    write, so the broken pipe was noticed only at the next step, and the shell waited. Before:
    attach lived until the run moved or ended."""
    with _viewer_of_a_running_run("20261123-000005-train-ffff") as (training, viewer):
        # Stalled (its steps are old): after this line nothing changes to print.
        lines = _progress_lines(viewer.stdout, 1)
        assert "stalled" in lines[-1], lines
        viewer.stdout.close()  # what `head` does after its lines
        code = viewer.wait(timeout=30)
        assert training.poll() is None  # the run itself is untouched
    assert code == 141


@pytest.mark.parametrize("command", ["checkpoint", "profile"])
def test_an_action_without_run_goes_to_the_live_run_not_the_latest(command):
    """With a live run and a newer ended one, `tpuwatch checkpoint` picked the
    ended one ("is not live"). It must pick the live run (its socket is absent here, so the
    command names it in its "not live" line: the stand-in process is no agent)."""
    home = Path(os.environ["TPUWATCH_HOME"])
    training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _recorded_run(home, "20261123-000006-train-live", child_pid=training.pid, exit_code=None,
                      recording="running_truncated.jsonl")
        _recorded_run(home, "20261123-000007-train-dead", child_pid=None, exit_code=0)
        proc = tpuwatch(command, "--timeout", "5", timeout=60)
    finally:
        training.kill()
        training.wait()
    assert "train-live" in proc.stderr and "train-dead" not in proc.stderr, proc.stderr


def test_an_action_without_run_when_none_is_live_says_so():
    home = Path(os.environ["TPUWATCH_HOME"])
    _recorded_run(home, "20261123-000008-train-done", child_pid=None, exit_code=0)
    proc = tpuwatch("checkpoint", timeout=60)
    assert proc.returncode == 2
    one_line_error(proc)
    assert "no run is live" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, what", [
    (("checkpoint", "--timeout", "-5"), "--timeout -5"), (("profile", "--timeout", "nan"), "--timeout nan"),
    (("profile", "--steps", "0"), "--steps 0"), (("profile", "--ms", "-1"), "--ms -1"),
])
def test_an_action_with_a_number_out_of_range_is_one_line_before_anything_is_sent(args, what):
    """Before: `--timeout -5` gave up at once after queueing the command, and a bad --steps went
    to the agent (or to "no run is live", which is not the problem)."""
    one_line_error(tpuwatch(*args, timeout=60), what, "give a positive")


def test_ls_lists_the_runs_of_a_directory_given_to_it(tmp_path):
    """A new user's tryout (2026-11-26): two runs made with `--run-dir /tmp/tryout2/run1` (and
    run2) were in no `tpuwatch ls` listing, which looks under $TPUWATCH_HOME/runs only."""
    elsewhere = tmp_path / "tryout2"
    _fake_run(elsewhere, "run1", script="fit.py", steps=400)
    _fake_run(elsewhere, "run2", script="fit.py", steps=1500)
    both = tpuwatch("ls", str(elsewhere))
    assert both.returncode == 0, both.stderr
    assert [line.split()[0] for line in both.stdout.splitlines()[1:]] == ["run2", "run1"], both.stdout
    one = tpuwatch("ls", str(elsewhere / "run1"))  # a run directory itself
    assert one.returncode == 0 and [line.split()[0] for line in one.stdout.splitlines()[1:]] == ["run1"], one.stdout
    one_line_error(tpuwatch("ls", str(tmp_path / "nowhere")), "nowhere", "directory")
