"""gs:// destinations against a real local GCS emulator (gcp-storage-emulator), through google-cloud-storage."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from actions_live import LiveRun, restore, weights_by_iteration

pytestmark = pytest.mark.tf
BUCKET = "tpuwatch-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def emulator(monkeypatch):
    port = _free_port()
    exe = Path(sys.executable).parent / "gcp-storage-emulator"
    proc = subprocess.Popen([str(exe), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    host = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the GCS emulator did not start"
            time.sleep(0.1)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    from google.cloud import storage

    client = storage.Client()
    client.create_bucket(BUCKET)
    yield client
    proc.terminate()
    proc.wait(10)


def test_checkpoints_and_profiles_go_to_the_bucket_and_restore(tmp_path, emulator):
    log = tmp_path / "weights.txt"
    run = LiveRun(tmp_path, "--mode", "custom", "--weights-log", str(log), "--sleep-ms", "10",
                  env={"STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"],
                       "TPUWATCH_ALLOWED_DESTINATIONS": os.pathsep.join([f"gs://{BUCKET}/allowed", "gs://no-such-bucket"])})
    try:
        run.wait_for_steps(2)
        saved = [run.command("checkpoint", dir=f"gs://{BUCKET}/allowed/ckpts").result for _ in range(2)]
        profile = run.command("profile", steps=2, logdir=f"gs://{BUCKET}/allowed/prof").result
        missing = run.command("checkpoint", dir="gs://no-such-bucket/x").result
        not_allowed = run.command("checkpoint", dir=f"gs://{BUCKET}/elsewhere").result
    finally:
        code = run.stop()
    assert code == 0, run.output()
    assert all(r.ok for r in saved), [r.message for r in saved]
    names = {b.name: b.size for b in emulator.list_blobs(BUCKET, prefix="allowed/ckpts/")}
    for r in saved:
        step = r.details["step"]
        assert r.details["path"] == f"gs://{BUCKET}/allowed/ckpts/ckpt-{step}"
        assert f"allowed/ckpts/ckpt-{step}.index" in names
        assert f"allowed/ckpts/ckpt-{step}.data-00000-of-00001" in names
        assert r.details["bytes"] == sum(v for k, v in names.items() if k.startswith(f"allowed/ckpts/ckpt-{step}."))
        # The local staging copy is gone once the bucket has it.
        assert not list((run.run_dir / "checkpoints" / "gcs").rglob(f"ckpt-{step}.*"))
    assert "allowed/ckpts/checkpoint" in names
    # Download and restore: bit-identical weights of the step it was taken at.
    local = tmp_path / "downloaded"
    local.mkdir()
    for name in names:
        emulator.bucket(BUCKET).blob(name).download_to_filename(str(local / Path(name).name))
    restored = restore([str(local / f"ckpt-{r.details['step']}") for r in saved])
    weights = weights_by_iteration(log)
    for r, got in zip(saved, restored):
        assert got["step"] == got["iterations"] == r.details["step"]
        assert got["weights"] == weights[got["iterations"]]

    assert profile.ok, profile.message
    assert profile.details["path"].startswith(f"gs://{BUCKET}/allowed/prof/plugins/profile/")
    prefix = profile.details["path"][len(f"gs://{BUCKET}/"):]
    assert any(b.name.endswith(".xplane.pb") for b in emulator.list_blobs(BUCKET, prefix=prefix + "/"))

    assert not missing.ok and "does not exist" in missing.message and "no-such-bucket" in missing.message
    assert not not_allowed.ok and "--allow-dest" in not_allowed.message
