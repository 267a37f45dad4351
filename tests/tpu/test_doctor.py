"""``tpuwatch doctor`` on this machine (no TPU, TF installed) and against a real local GCS emulator."""

from __future__ import annotations

import importlib.metadata
import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuwatch.console import doctor

EMULATOR = Path(sys.executable).parent / "gcp-storage-emulator"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gcs_emulator(monkeypatch, tmp_path):
    """gcp-storage-emulator on 127.0.0.1 with a bucket "ckpt"; STORAGE_EMULATOR_HOST points at it."""
    port = _free_port()
    log = open(tmp_path / "emulator.log", "wb")
    proc = subprocess.Popen([str(EMULATOR), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory",
                             "--default-bucket", "ckpt"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "emulator.log").read_text()
            time.sleep(0.05)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    yield proc
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def _utf8() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8")


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode()


@pytest.mark.tf
def test_doctor_on_this_machine_with_a_reachable_bucket(gcs_emulator):
    out = _utf8()
    rc = doctor.main(gcs="gs://ckpt/runs/exp1", out=out)
    text = _text(out)
    lines = {line.split()[1]: line for line in text.splitlines()[1:] if line[:1] in "✓✗–"}
    assert rc == 0, text
    tf_version = importlib.metadata.version("tensorflow")
    assert lines["TensorFlow"].startswith("✓ TensorFlow") and f" {tf_version} (import took" in lines["TensorFlow"]
    assert lines["TPU"].startswith("– TPU") and "no TPU: TPUClusterResolver() says 'Please provide a TPU Name" in text
    assert lines["devices"].startswith("✓ devices") and "CPU x1" in lines["devices"]
    assert lines["TPU"] and "– TPU metrics    no TPU chips found" in text
    assert lines["run"].startswith("✓ run directory") and os.environ["TPUWATCH_HOME"] in lines["run"]
    assert lines["GCS"].startswith("✓ GCS") and "gs://ckpt/runs/exp1: bucket reachable and writable (emulator" in text
    assert text.rstrip().endswith("All required checks passed.")


def test_missing_bucket_and_stopped_emulator_fail_with_one_line(gcs_emulator):
    c = doctor.gcs_check("gs://no-such-bucket/x")
    assert (c.status, c.required) == ("fail", True)
    assert c.detail == f"bucket gs://no-such-bucket not found (emulator {os.environ['STORAGE_EMULATOR_HOST']})"
    assert doctor.gcs_check("gs://ckpt").status == "ok"
    gcs_emulator.terminate()
    gcs_emulator.wait(timeout=10)
    c = doctor.gcs_check("gs://ckpt/x", timeout_s=2)
    assert c.status == "fail" and c.detail.startswith("cannot reach bucket gs://ckpt (emulator")
    assert "\n" not in c.detail


def test_bad_destination_and_unwritable_home_fail(monkeypatch, tmp_path):
    assert doctor.gcs_check("s3://bucket").detail == "--gcs 's3://bucket': expected gs://BUCKET[/PATH]"
    assert doctor.gcs_check("gs://").status == "fail"
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TPUWATCH_HOME", str(blocker))  # a file where the home directory should be
    c = doctor.rundir_check()
    assert c.failed and c.detail.startswith(f"{blocker}/runs is not writable")


def test_missing_interpreter_fails_fast_in_ascii(monkeypatch):
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    rc = doctor.main(python="/nonexistent/python3", out=out)
    text = _text(out)
    assert rc == 1
    assert "XX interpreter    interpreter /nonexistent/python3 not found" in text
    assert "ok run directory" in text
    assert text.rstrip().endswith("1 required check(s) failed: interpreter")


def test_tpu_metrics_lines():
    tpu = {"chip": "TPU v4 chip", "chips": 4}
    up = doctor._metrics_check({"tpu_metrics": {**tpu, "ok": True, "reason": "", "port": 8431, "devices": 4}})
    assert (up.status, up.detail) == ("ok", "4 x TPU v4 chip: libtpu answers on port 8431 (4 devices)")
    idle = doctor._metrics_check({"tpu_metrics": {**tpu, "ok": False, "port": None, "devices": 0,
                                                  "reason": "TPU metrics service unreachable on port 8431"}})
    assert idle.status == "info" and "expected before training" in idle.detail
    no_tpu_info = {"ok": False, "chips": 0, "chip": "", "port": None,
                   "reason": "tpu-info not installed (pip install 'tpuwatch[tpu]')"}
    missing = doctor._metrics_check({"tpu_metrics": no_tpu_info, "tpu": {"found": True, "detail": "grpc://x"}})
    assert missing.status == "fail" and not missing.required and "pip install 'tpuwatch[tpu]'" in missing.detail
    assert doctor._metrics_check({"tpu_metrics": no_tpu_info, "tpu": {"found": False}}).status == "info"


@pytest.mark.tf
def test_doctor_flags_a_protobuf_that_the_installed_tensorflow_does_not_accept(monkeypatch, tmp_path):
    """`pip install tpuwatch` beside an older TF once upgraded protobuf past TF's pin, and
    every TF import broke. A TensorFlow distribution that pins protobuf below the installed one
    (metadata placed first on the path, as an older TF's would be) is a failed required check."""
    installed = importlib.metadata.version("protobuf")
    major = int(installed.split(".")[0])
    dist = tmp_path / "tensorflow-2.16.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.16.2\n"
                                   f"Requires-Dist: protobuf <{major}.0.0dev,>=3.20.3\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    checks = doctor.interpreter_checks(sys.executable)
    pb = next(c for c in checks if c.name == "protobuf")
    assert pb.status == "fail" and pb.required, pb
    assert installed in pb.detail and f"protobuf<{major}.0.0dev,>=3.20.3" in pb.detail, pb.detail
    monkeypatch.delenv("PYTHONPATH")
    healthy = next(c for c in doctor.interpreter_checks(sys.executable) if c.name == "protobuf")
    assert healthy.status == "ok", healthy
