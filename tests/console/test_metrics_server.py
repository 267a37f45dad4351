"""``--metrics``: the run's numbers on /metrics, scraped by a real Prometheus server."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from tpuwatch.console.metrics_server import RunMetrics
from tpuwatch.monitor.diagnostics.feed import FindingsFeed
from tpuwatch.monitor.state import RunState
from tpuwatch.protocol import DeviceSample, Finding, Hello, HostSample, Step
from tpuwatch_testing import SAMPLES, child_env, read_messages


def _samples(metrics: RunMetrics) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _hello(worker: str) -> Hello:
    return Hello(protocol_version=1, agent_version="0.1.0", run_id="r", t=0.0, pid=1, host="h", worker=worker,
                 python_version="3.11", tf_version="2.21.0", keras_version="3.15", script="train.py", argv=())


def test_names_units_and_values_follow_the_run():
    state, metrics = RunState(clock=lambda: 10.0), RunMetrics()
    feed = FindingsFeed(clock=lambda: 10.0)  # the input-wait figure is the engine's, as in the relay
    msgs = [_hello("w0"),
            Step(step=2, t=1.0, step_time_s=0.004, input_wait_s=0.001, loss=0.5, replica_losses=(0.4, 0.6), steps=2),
            Step(step=3, t=2.0, step_time_s=0.3, input_wait_s=None, loss=0.25, replica_losses=(0.2, 0.3)),
            HostSample(t=2.0, rss_bytes=1000, available_bytes=5000, total_bytes=9000, cpu_percent=50.0),
            DeviceSample(t=2.0, device="/device:TPU:0", current_bytes=300, peak_bytes=400, limit_bytes=1000)]
    for m in msgs:
        state.apply(m)
        feed.apply(m)
        metrics.take("w0", m)
    feed.evaluate(state, 10.0, force=True)
    state.add_finding(Finding(t=2.0, rule="stall", severity="warning", message="m", advice="a"))
    metrics.update(state.snapshot(), [])
    got = _samples(metrics)
    assert got[("tpuwatch_steps_total", (("worker", "w0"),))] == 3
    assert got[("tpuwatch_step_time_seconds_count", (("worker", "w0"),))] == 3  # a record of 2 steps counts 2
    assert got[("tpuwatch_step_time_seconds_bucket", (("le", "0.005"), ("worker", "w0")))] == 2
    assert got[("tpuwatch_step_time_seconds_bucket", (("le", "0.25"), ("worker", "w0")))] == 2
    assert got[("tpuwatch_step_time_seconds_bucket", (("le", "0.5"), ("worker", "w0")))] == 3
    assert got[("tpuwatch_step_time_seconds_sum", (("worker", "w0"),))] == pytest.approx(0.308)
    assert got[("tpuwatch_replica_loss", (("replica", "0"), ("worker", "w0")))] == 0.2
    assert got[("tpuwatch_replica_loss", (("replica", "1"), ("worker", "w0")))] == 0.3
    assert got[("tpuwatch_host_rss_bytes", (("worker", "w0"),))] == 1000
    assert got[("tpuwatch_device_memory_bytes", (("device", "/device:TPU:0"), ("worker", "w0")))] == 300
    assert got[("tpuwatch_device_memory_limit_bytes", (("device", "/device:TPU:0"), ("worker", "w0")))] == 1000
    assert got[("tpuwatch_findings", (("rule", "stall"), ("severity", "warning")))] == 1
    assert got[("tpuwatch_run_status", (("status", "running"),))] == 1
    # three records are too few for the input-bound rule's figure: no gauge rather than a guess
    assert ("tpuwatch_input_wait_ratio", (("worker", "w0"),)) not in got


def test_input_wait_ratio_is_the_input_bound_rules_figure():
    state, metrics = RunState(clock=lambda: 100.0), RunMetrics()
    feed = FindingsFeed(clock=lambda: 100.0)
    msgs = [_hello("w0")] + [Step(step=i, t=float(i), step_time_s=0.1, input_wait_s=0.025, loss=0.5,
                                  replica_losses=(0.5,)) for i in range(1, 61)]
    for m in msgs:
        state.apply(m)
        feed.apply(m)
        metrics.take("w0", m)
    feed.evaluate(state, 100.0, force=True)
    snap = state.snapshot()
    metrics.update(snap, [])
    got = _samples(metrics)
    assert snap.workers[0].input_wait_frac is not None
    assert got[("tpuwatch_input_wait_ratio", (("worker", "w0"),))] == pytest.approx(snap.workers[0].input_wait_frac)
    assert got[("tpuwatch_input_wait_ratio", (("worker", "w0"),))] == pytest.approx(0.25, abs=0.01)


def _tpuwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True, timeout=60,
                          env=child_env())


@pytest.mark.parametrize("value, words", [("nonsense", "expected HOST:PORT"), ("127.0.0.1:70000", "out of range"),
                                          ("256.1.1.1:9464", "cannot listen there")])
def test_a_bad_metrics_address_is_one_line_before_the_script_starts(tmp_path, value, words):
    script = tmp_path / "train.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    proc = _tpuwatch("run", "--headless", "--metrics", value, str(script))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tpuwatch: --metrics {value!r}") and words in lines[0], lines
    assert not (tmp_path / "ran").exists()


def test_a_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _tpuwatch("run", "--headless", "--metrics", f"127.0.0.1:{port}", str(tmp_path / "train.py"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cannot listen there" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _query(base: str, promql: str) -> list[dict]:
    body = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert body["status"] == "success", body
    return body["data"]["result"]


def _until(what, bound_s: float):
    deadline = time.monotonic() + bound_s
    while True:
        try:
            value = what()
        except OSError:
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


@pytest.mark.tf
@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_step_counter_and_each_replicas_loss_of_a_live_run(tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must have the prometheus server (.ci/run installs the Debian package)")
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    metrics_port, web_port = _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                      "scrape_configs:\n  - job_name: tpuwatch\n"
                      f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n")
    server = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{web_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = tmp_path / "run"
    # The planted stall holds the run still at step 150 for a minute: Prometheus reads it live.
    run = subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", "--headless", "--metrics",
                            f"127.0.0.1:{metrics_port}", "--run-dir", str(run_dir),
                            str(SAMPLES / "planted" / "stall_fast_loop.py"), "--steps", "300", "--hang-at", "150",
                            "--hang-seconds", "60", "--replicas", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    base = f"http://127.0.0.1:{web_port}"
    try:
        assert _until(lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=5).status == 200, 60)
        steps = _until(lambda: [r for r in _query(base, "tpuwatch_steps_total") if r["value"][1] == "150"], 120)
        assert steps, _query(base, "tpuwatch_steps_total")
        assert steps[0]["metric"]["job"] == "tpuwatch" and steps[0]["metric"]["worker"]
        losses = _until(lambda: _query(base, "tpuwatch_replica_loss"), 30)
        by_replica = {r["metric"]["replica"]: float(r["value"][1]) for r in losses}
    finally:
        run.send_signal(signal.SIGINT)  # tpuwatch passes it to the training
        try:
            out, err = run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            out, err = run.communicate()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    (step150,) = [m for m in read_messages(run_dir / "events.jsonl") if isinstance(m, Step) and m.step == 150]
    assert by_replica == {"0": step150.replica_losses[0], "1": step150.replica_losses[1]}
    printed = float(re.search(r"^step 150  loss (\S+)$", out, re.M).group(1))  # the script's mean
    assert sum(by_replica.values()) / 2 == pytest.approx(printed, abs=5e-5)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


@pytest.mark.tf
def test_the_viewer_survives_600_idle_connections_under_ulimit_512_and_keeps_serving(tmp_path):
    """Any local user can connect to --metrics: 600 connections that each send one request line
    and then wait must neither exhaust the viewer's file descriptors (ulimit -n 512) nor keep a
    scrape out. Before: a thread and a descriptor per connection, never timed out; the viewer died
    with EMFILE and exit 1 while the script ran on unwatched."""
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    script = tmp_path / "wait.py"
    script.write_text("import sys, os, time\nopen(sys.argv[1], 'w').close()\n"
                      "deadline = time.monotonic() + 120\n"
                      "while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:\n"
                      "    time.sleep(0.05)\nprint('script done')\n")
    port = _free_port()
    viewer = subprocess.Popen(
        ["bash", "-c", 'ulimit -n 512 && exec "$@"', "bash", sys.executable, "-m", "tpuwatch", "run", "--headless",
         "--metrics", f"127.0.0.1:{port}", "--run-dir", str(tmp_path / "run"), str(script), str(ready), str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    idle: list[socket.socket] = []
    try:
        _until(lambda: ready.exists() and "tpuwatch_run_status" in _scrape(port), 120)
        for _ in range(600):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the blank line that ends the request
            idle.append(s)
        assert viewer.poll() is None, viewer.communicate()
        for _ in range(5):  # scrapes go on while all 600 are still connected
            assert 'tpuwatch_run_status{status=' in _scrape(port)
        assert viewer.poll() is None
        stop.write_text("")
        out, err = viewer.communicate(timeout=60)
    finally:
        for s in idle:
            s.close()
        if viewer.poll() is None:
            viewer.kill()
            viewer.communicate()
    assert viewer.returncode == 0, err
    assert "Errno 24" not in err and "Traceback" not in err, err
    assert "script done" in out


@pytest.mark.parametrize("value, warned", [("0.0.0.0:0", True), ("[::]:0", True), ("127.0.0.1:0", False),
                                           ("0", False)])
def test_metrics_on_every_network_says_what_it_exposes(tmp_path, value, warned):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_bytes((Path(__file__).parents[1] / "data" / "crashed.jsonl").read_bytes())
    proc = subprocess.run([sys.executable, "-m", "tpuwatch", "attach", str(run_dir), "--metrics", value],
                          capture_output=True, text=True, timeout=60, env=child_env(TPUWATCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 1, proc.stderr  # the run's exit code
    warning = [line for line in proc.stderr.splitlines() if "warning: --metrics" in line]
    if warned:
        (line,) = warning
        assert f"--metrics {value} serves" in line and "without a token" in line and "127.0.0.1:PORT" in line, line
    else:
        assert not warning, proc.stderr
