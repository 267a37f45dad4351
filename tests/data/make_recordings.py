"""Builds realistic, deterministic tpuwatch recordings (``events.jsonl``) for tests and demos.

Each ``*_messages()`` function returns the protocol messages of one kind of run, in the order an
agent writes them; :func:`write` encodes them with :func:`tpuwatch.protocol.encode`. Running this
file regenerates the checked-in recordings next to it::

    .venv/bin/python tests/data/make_recordings.py

    healthy_4replica.jsonl   MirroredStrategy, 4 replicas, 300 steps, retrace, checkpoint, exit 0
    input_bound.jsonl        same model, ~80% of each step waiting for input, exit 0
    crashed.jsonl            replica 2 goes NaN at step 120, exception, exit 1
    waiting.jsonl            only the agent's hello (status "starting": no strategy, no step yet)
    running_truncated.jsonl  still running (no exit), last line cut in the middle

Other tests import the functions (``sys.path`` insert of this folder, or
``importlib`` by path) to build bigger or odder runs with the same shape.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Iterable, Iterator

if __package__ in (None, ""):  # run as a script from anywhere: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tpuwatch import protocol
from tpuwatch.protocol import (
    Command,
    CommandState,
    Config,
    DeviceSample,
    Epoch,
    Event,
    ExceptionRaised,
    Exit,
    Hello,
    HostSample,
    Message,
    Result,
    Retrace,
    Step,
    Topology,
)

HERE = Path(__file__).resolve().parent
T0 = 1_750_000_000.0  # fixed unix time so recordings are byte-for-byte reproducible
RUN_ID = "20250615-120000-train-ab12"
HOST = "tpu-vm-0"
PID = 4242
WORKER = f"{HOST}:{PID}"
DEVICES = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4))
GiB = 1 << 30
MiB = 1 << 20


def hello(t: float = T0, run_id: str = RUN_ID, worker: str = WORKER, host: str = HOST,
          pid: int = PID, script: str = "train.py") -> Hello:
    return Hello(
        protocol_version=protocol.PROTOCOL_VERSION, agent_version="0.1.0", run_id=run_id, t=t,
        pid=pid, host=host, worker=worker, python_version="3.11.9", tf_version="2.21.0",
        keras_version="3.15.0", script=script, argv=(script, "--epochs", "3"),
    )


def topology(t: float, replicas: int = 4, devices: tuple[str, ...] = DEVICES) -> Topology:
    return Topology(
        t=t, strategy="MirroredStrategy", replicas=replicas, local_replicas=len(devices),
        num_workers=1, worker_index=0, device_kind="CPU", devices=devices, is_tpu=False,
    )


def steps(
    n: int,
    *,
    t0: float,
    first_step: int = 1,
    step_time_s: float = 0.05,
    input_wait_frac: float = 0.02,
    replicas: int = 4,
    examples: int = 64,
    seed: int = 0,
    nan_replica_from: tuple[int, int] | None = None,  # (replica index, step)
    epoch_len: int | None = None,
    epochs: int | None = None,
) -> Iterator[Step]:
    """``n`` step records with a decaying, noisy loss per replica and jittered step times."""
    rng = random.Random(seed)
    t = t0
    for i in range(n):
        step = first_step + i
        dt = step_time_s * (1.0 + 0.1 * (rng.random() - 0.5))
        t += dt
        base = 2.3 * math.exp(-step / 150.0) + 0.1
        losses = [base * (1.0 + 0.05 * (rng.random() - 0.5)) for _ in range(replicas)]
        if nan_replica_from is not None and step >= nan_replica_from[1]:
            losses[nan_replica_from[0]] = math.nan
        finite = [v for v in losses if math.isfinite(v)]
        loss = sum(losses) / len(losses) if len(finite) == len(losses) else math.nan
        yield Step(
            step=step, t=round(t, 6), step_time_s=round(dt, 6),
            input_wait_s=round(dt * input_wait_frac, 6), loss=loss,
            replica_losses=tuple(losses), steps=1, examples=examples, function="train_step",
            epoch=min((step - 1) // epoch_len, (epochs or step) - 1) if epoch_len else None,
        )


def samples(t_from: float, t_to: float, *, every_s: float = 0.5, rss0: int = 2 * GiB,
            rss_growth_per_s: int = 0) -> Iterator[Message]:
    """Host and device samples at a fixed rate between two times."""
    t = t_from
    k = 0
    while t <= t_to:
        yield HostSample(t=round(t, 6), rss_bytes=rss0 + int(rss_growth_per_s * (t - t_from)),
                         available_bytes=12 * GiB, total_bytes=16 * GiB, cpu_percent=180.0)
        for i, dev in enumerate(DEVICES):
            cur = 300 * MiB + 10 * MiB * i + (k % 3) * MiB
            yield DeviceSample(t=round(t, 6), device=dev, current_bytes=cur,
                               peak_bytes=420 * MiB + 10 * MiB * i, limit_bytes=None, source="tf")
        t += every_s
        k += 1


def merge_by_time(*streams: Iterable[Message]) -> list[Message]:
    """Interleaves streams by their ``t`` (stable: equal times keep stream order)."""
    tagged = []
    for si, stream in enumerate(streams):
        for mi, m in enumerate(stream):
            tagged.append((getattr(m, "t", 0.0), si, mi, m))
    tagged.sort(key=lambda x: (x[0], x[1], x[2]))
    return [m for *_, m in tagged]


def _training(n_steps: int, *, input_wait_frac: float, step_time_s: float, seed: int,
              nan_replica_from: tuple[int, int] | None = None, epochs: int = 3,
              rss_growth_per_s: int = 0, total_steps: int | None = None
              ) -> tuple[list[Message], float]:
    """Hello .. last step (no end). Returns the messages and the time of the last step."""
    t = T0
    total_steps = total_steps or n_steps
    epoch_len = max(1, total_steps // epochs)
    head: list[Message] = [
        hello(t),
        Event(t=t + 0.4, level="info", source="agent", message="agent started, sampling at 2 Hz"),
        topology(t + 1.0),
        Config(t=t + 1.0, mixed_precision="float32", global_batch_size=64,
               per_replica_batch_size=16, steps_per_execution=1, total_steps=total_steps,
               epochs=epochs),
        Retrace(t=t + 1.2, function="train_step", traces=1, instances=1,
                signature="(x: float32[16, 28, 28, 1], y: int64[16])", change="", step=0),
    ]
    first_t = t + 2.5  # the first step includes compilation
    body = list(steps(n_steps, t0=first_t, step_time_s=step_time_s, input_wait_frac=input_wait_frac,
                      seed=seed, nan_replica_from=nan_replica_from, epoch_len=epoch_len,
                      epochs=epochs))
    end_t = body[-1].t
    epochs_msgs: list[Message] = []
    for e in range(epochs):
        if e * epoch_len >= len(body):
            break  # the run has not got there (yet)
        b = body[e * epoch_len]
        last = body[min((e + 1) * epoch_len, len(body)) - 1]
        epochs_msgs.append(Epoch(t=round(b.t - b.step_time_s, 6), epoch=e, phase="begin",
                                 step=b.step - 1))
        if last.step >= (e + 1) * epoch_len:
            epochs_msgs.append(Epoch(t=last.t, epoch=e, phase="end", step=last.step,
                                     logs={"loss": round(last.loss, 4) if last.loss == last.loss
                                           else math.nan}))
    # the last batch of the first epoch is smaller: one real retrace with a shape change
    extra: list[Message] = []
    if n_steps > epoch_len:
        s = body[epoch_len - 1]
        extra.append(Retrace(t=s.t - 0.001, function="train_step", traces=2, instances=1,
                             signature="(x: float32[8, 28, 28, 1], y: int64[8])",
                             change="x: shape (16, 28, 28, 1) -> (8, 28, 28, 1)", step=s.step - 1))
    msgs = head + merge_by_time(
        body, epochs_msgs, extra,
        samples(t + 1.5, end_t, rss_growth_per_s=rss_growth_per_s),
    )
    return msgs, end_t


def healthy_messages(n_steps: int = 300) -> list[Message]:
    msgs, end = _training(n_steps, input_wait_frac=0.02, step_time_s=0.05, seed=1)
    mid = msgs[len(msgs) // 2].t  # a checkpoint requested half way
    cmd = [
        Command(id="c1", action="checkpoint", args={}),
        CommandState(t=mid, id="c1", action="checkpoint", state="queued"),
        CommandState(t=mid + 0.05, id="c1", action="checkpoint", state="running", step=n_steps // 2),
        Result(t=mid + 0.09, id="c1", action="checkpoint", ok=True,
               message=f"checkpoint saved at step {n_steps // 2}",
               details={"path": "/tmp/run/checkpoints/ckpt-1", "seconds": 0.04,
                        "step": n_steps // 2}),
    ]
    i = next(k for k, m in enumerate(msgs) if getattr(m, "t", 0) >= mid)
    msgs[i:i] = cmd
    return msgs + [Exit(t=end + 0.3, exit_code=0)]


def input_bound_messages(n_steps: int = 300) -> list[Message]:
    msgs, end = _training(n_steps, input_wait_frac=0.8, step_time_s=0.1, seed=2)
    return msgs + [Exit(t=end + 0.3, exit_code=0)]


def crashed_messages(n_steps: int = 150, nan_at: int = 120) -> list[Message]:
    msgs, end = _training(n_steps, input_wait_frac=0.03, step_time_s=0.05, seed=3,
                          nan_replica_from=(2, nan_at))
    tb = ('Traceback (most recent call last):\n  File "train.py", line 88, in <module>\n'
          '    check_finite(loss)\n  File "train.py", line 41, in check_finite\n'
          '    raise FloatingPointError(f"loss is {loss} at step {step}")\n'
          f"FloatingPointError: loss is nan at step {n_steps}\n")
    return msgs + [
        Event(t=end + 0.01, level="error", source="agent", message="script raised FloatingPointError"),
        ExceptionRaised(t=end + 0.02, type="FloatingPointError",
                        message=f"loss is nan at step {n_steps}", traceback=tb),
        Exit(t=end + 0.2, exit_code=1, reason="exception"),
    ]


def waiting_messages() -> list[Message]:
    return [hello(T0)]


def write(path: Path, messages: Iterable[Message], *, cut_last_bytes: int = 0) -> Path:
    """Writes ``messages`` as a recording; ``cut_last_bytes`` drops bytes from the end (a torn
    write: the last line loses its newline and part of its text)."""
    data = b"".join(protocol.encode(m) for m in messages)
    if cut_last_bytes:
        data = data[:-cut_last_bytes]
    path.write_bytes(data)
    return path


RECORDINGS = {
    "healthy_4replica.jsonl": lambda p: write(p, healthy_messages()),
    "input_bound.jsonl": lambda p: write(p, input_bound_messages()),
    "crashed.jsonl": lambda p: write(p, crashed_messages()),
    "waiting.jsonl": lambda p: write(p, waiting_messages()),
    # 200 of 600 steps, no exit record, and the last step line is cut 40 bytes short
    "running_truncated.jsonl": lambda p: write(p, _training(200, input_wait_frac=0.02,
                                                            step_time_s=0.05, seed=4,
                                                            total_steps=600)[0],
                                               cut_last_bytes=40),
}


def main(out_dir: Path = HERE) -> None:
    for name, make in RECORDINGS.items():
        path = make(out_dir / name)
        print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
