"""``--notify``: a real shell command per event, once each, never held up by a command that hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuwatch.console.alerts import RATE_BURST, Alerts
from tpuwatch.monitor.snapshot import RunSnapshot
from tpuwatch.protocol import Finding
from tpuwatch_testing import SAMPLES, child_env


def _wait_for(predicate, bound_s: float = 20.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _finding(rule: str, severity: str = "warning", t: float = 100.0) -> Finding:
    return Finding(t=t, rule=rule, severity=severity, message=f"{rule}: planted", advice="fix it")


def _commands(tmp_path: Path) -> tuple[str, str]:
    events, pids = tmp_path / "events.jsonl", tmp_path / "hang.pids"
    append = f'cat >> {events}; echo "$TPUWATCH_EVENT_KIND $TPUWATCH_EVENT_RULE $TPUWATCH_EVENT_SEVERITY" >> {events}.env'
    hang = f"echo $$ >> {pids}; exec sleep 600"
    return append, hang


def test_an_event_reaches_one_command_while_another_hangs(tmp_path):
    append, hang = _commands(tmp_path)
    said: list[str] = []
    alerts = Alerts([append, hang], report=said.append, run_dir=str(tmp_path), timeout_s=2.0)
    snap = RunSnapshot(run_id="r1", status="running", step=12)
    alerts.update(snap, [_finding("stall")])
    pids = tmp_path / "hang.pids"
    assert _wait_for(lambda: pids.exists() and pids.read_text().strip())
    hanger = int(pids.read_text().split()[0])
    assert _wait_for(lambda: len(_lines(tmp_path / "events.jsonl")) == 1, bound_s=10)
    # the first command had its event while the second still hung on the same one
    assert _alive(hanger) and not said
    (event,) = _lines(tmp_path / "events.jsonl")
    assert (event["kind"], event["rule"], event["severity"], event["run_id"], event["step"]) == \
        ("stall", "stall", "warning", "r1", 12)
    assert (tmp_path / "events.jsonl.env").read_text() == "stall stall warning\n"
    alerts.close(RunSnapshot(run_id="r1", status="finished", step=20, exit_code=0), [])
    kinds = [e["kind"] for e in _lines(tmp_path / "events.jsonl")]
    assert kinds == ["stall", "end"]
    assert not _alive(hanger)
    assert any("ran past 2 s (stall event): killed" in line for line in said), said
    assert "timed out (killed)" in alerts.summary()


def test_findings_are_sent_once_again_when_worse_and_rate_limited(tmp_path):
    append, _ = _commands(tmp_path)
    alerts = Alerts([append], min_severity="warning", report=print, timeout_s=10.0, clock=lambda: 0.0)
    snap = RunSnapshot(run_id="r2", status="running")
    alerts.update(snap, [_finding("input-bound", "info")])  # below --notify-min-severity
    alerts.update(snap, [_finding("retrace-storm")])
    alerts.update(snap, [_finding("retrace-storm")])  # the same finding again: nothing
    alerts.update(snap, [_finding("retrace-storm", "critical")])  # worse: sent again
    alerts.update(snap, [_finding(f"rule-{i}") for i in range(RATE_BURST)])  # past the burst
    alerts.update(RunSnapshot(run_id="r2", status="crashed", exception="ValueError: x"), [])
    alerts.close(RunSnapshot(run_id="r2", status="crashed", exit_code=1), [])
    events = _lines(tmp_path / "events.jsonl")
    sent = [(e["kind"], e["rule"], e["severity"]) for e in events]
    assert sent == [("finding", "retrace-storm", "warning"), ("finding", "retrace-storm", "critical")] + \
        [("finding", f"rule-{i}", "warning") for i in range(RATE_BURST - 2)] + \
        [("crash", "", "critical"), ("end", "", "critical")]
    assert events[-2]["message"] == "ValueError: x"
    assert events[-1]["suppressed"] == alerts.suppressed == 2
    assert "2 held back by the rate limit" in alerts.summary()


def test_a_findings_stacks_and_profile_ride_with_its_event(tmp_path):
    append, _ = _commands(tmp_path)
    alerts = Alerts([append], report=print, timeout_s=10.0, clock=lambda: 0.0)
    snap = RunSnapshot(run_id="r3", status="stalled", step=20)
    stall = Finding(t=100.0, rule="stall", severity="warning", message="stall: no step for 12 s after step 20",
                    advice="fix it", evidence={"waiting_at": "waiting at train.py:26: time.sleep(40)",
                                               "stacks": "/r/stacks/stall-after-step-20.txt"})
    slow = Finding(t=101.0, rule="input-bound", severity="warning", message="input-bound: planted", advice="",
                   evidence={"profile_path": "/r/profiles/auto-1"})
    alerts.update(snap, [stall, slow])
    alerts.close(RunSnapshot(run_id="r3", status="finished", step=30, exit_code=0), [])
    first, second, end = _lines(tmp_path / "events.jsonl")
    assert (first["stack_headline"], first["stacks"], first["profile"]) == (
        "waiting at train.py:26: time.sleep(40)", "/r/stacks/stall-after-step-20.txt", "")
    assert (second["stack_headline"], second["profile"]) == ("", "/r/profiles/auto-1")
    assert end["stacks"] == ""


def _run(tmp_path: Path, *script: str) -> subprocess.CompletedProcess:
    append, hang = _commands(tmp_path)
    return subprocess.run(
        [sys.executable, "-m", "tpuwatch", "run", "--headless", "--run-dir", str(tmp_path / "run"),
         "--notify", append, "--notify", hang, *script],
        capture_output=True, text=True, timeout=240,
        env=child_env(TPUWATCH_HOME=str(tmp_path / "home"), TPUWATCH_NOTIFY_TIMEOUT_S="2"))


def _no_hanger_left(tmp_path: Path) -> None:
    pids = [int(p) for p in (tmp_path / "hang.pids").read_text().split()]
    assert pids and not any(_alive(p) for p in pids)


@pytest.mark.tf
@pytest.mark.slow
def test_a_planted_stall_is_sent_once_and_the_end_once(tmp_path):
    proc = _run(tmp_path, str(SAMPLES / "planted" / "stall_fast_loop.py"), "--steps", "200", "--hang-at", "100",
                "--hang-seconds", "12", "--replicas", "2")
    assert proc.returncode == 0, proc.stderr
    assert "done: 200 steps" in proc.stdout
    events = _lines(tmp_path / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds.count("stall") == 1 and kinds.count("end") == 1 and kinds[-1] == "end", kinds
    stall = next(e for e in events if e["kind"] == "stall")
    assert "after step 100" in stall["message"] and stall["run_id"] == "run"
    # the evidence the agent took while it hung: where the training thread waited, and the file
    assert stall["stack_headline"].startswith("waiting at stall_fast_loop.py:"), stall
    assert "evaluator.acquire" in stall["stack_headline"] and Path(stall["stacks"]).is_file()
    end = events[-1]
    assert (end["status"], end["exit_code"], end["step"]) == ("finished", 0, 200)
    assert "ran past 2 s (stall event): killed" in proc.stderr
    _no_hanger_left(tmp_path)


@pytest.mark.tf
@pytest.mark.slow
def test_a_crash_is_sent_once_with_its_error_and_the_end_once(tmp_path):
    proc = _run(tmp_path, str(SAMPLES / "crashes" / "undistributed_dataset.py"))
    assert proc.returncode == 1, proc.stderr
    events = _lines(tmp_path / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds.count("crash") == 1 and kinds.count("end") == 1 and kinds[-1] == "end", kinds
    crash = next(e for e in events if e["kind"] == "crash")
    assert crash["message"].startswith("IndexError") and crash["severity"] == "critical"
    explained = [e for e in events if e["kind"] == "finding"]
    assert [e["rule"] for e in explained] == ["script-crash"]
    assert "undistributed_dataset.py:10" in explained[0]["message"]
    assert (events[-1]["status"], events[-1]["exit_code"]) == ("crashed", 1)
    assert "ran past 2 s" in proc.stderr and "timed out (killed)" in proc.stderr
    _no_hanger_left(tmp_path)


def test_attach_alerts_for_a_recorded_run_it_did_not_start(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_bytes((Path(__file__).parents[1] / "data" / "crashed.jsonl").read_bytes())
    append, _ = _commands(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "attach", str(run_dir), "--notify", append],
                          capture_output=True, text=True, timeout=120,
                          env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 1, proc.stderr  # the run's own exit code
    events = _lines(tmp_path / "events.jsonl")
    assert [(e["kind"], e["rule"]) for e in events] == [
        ("finding", "loss-nonfinite"), ("finding", "script-crash"), ("crash", ""), ("end", "")]
    assert events[2]["message"] == "FloatingPointError: loss is nan at step 150"
    assert "notify: 4 event(s) to 1 command(s)" in proc.stderr


def test_notify_on_a_remote_attach_is_refused_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "attach", "127.0.0.1:9", "--notify", "true"],
                          capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "on each training host" in proc.stderr


def _hostile_crash_recording(run_dir: Path) -> None:
    """crashed.jsonl with the exception's message holding a NUL, a lone surrogate, a newline and an
    escape (JSON escapes, as the agent writes an exception it cannot encode otherwise)."""
    lines = (Path(__file__).parents[1] / "data" / "crashed.jsonl").read_text().splitlines()
    hostile = []
    for line in lines:
        record = json.loads(line)
        if record.get("kind") == "exception":
            record["message"] = "bad\x00value \ud800 next\nline \x1b]0;owned\x07"
        hostile.append(json.dumps(record))
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("\n".join(hostile) + "\n")


def test_a_crash_message_with_nul_and_a_surrogate_reaches_every_command(tmp_path):
    run_dir = tmp_path / "r"
    _hostile_crash_recording(run_dir)
    out_a, out_b = tmp_path / "a.jsonl", tmp_path / "b.txt"
    first = f"cat >> {out_a}"
    second = f'printf "%s|%s\\n" "$TPUWATCH_EVENT_KIND" "$TPUWATCH_EVENT_MESSAGE" >> {out_b}'
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "attach", str(run_dir), "--notify", first,
                           "--notify", second], capture_output=True, text=True, timeout=120,
                          env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    events = _lines(out_a)
    assert [e["kind"] for e in events if e["kind"] in ("crash", "end")] == ["crash", "end"], events
    crash = next(e for e in events if e["kind"] == "crash")
    assert crash["message"].startswith("FloatingPointError: bad\x00value \ud800 next\nline")  # JSON keeps it whole
    kinds = [line.split("|")[0] for line in out_b.read_text().splitlines()]
    assert kinds.count("crash") == 1 and kinds.count("end") == 1, out_b.read_text()
    crash_line = next(line for line in out_b.read_text().splitlines() if line.startswith("crash|"))
    # the environment's message is one printable line: no NUL, no newline, no escape
    assert "bad\\x00value \\ud800 next\\nline \\x1b]0;owned\\x07" in crash_line, crash_line
    assert "notify: 4 event(s) to 2 command(s)" in proc.stderr and "failed" not in proc.stderr

