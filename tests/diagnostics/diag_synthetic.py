"""Synthetic telemetry for the diagnostics tests: protocol messages of a run, built in order.

``SyntheticRun`` plays one or more workers forward in time: steps with realistic noise, host and
device samples at 2 Hz, epochs, retraces. Tests change one thing and check one rule.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

from tpuwatch import protocol
from tpuwatch.monitor.diagnostics import Engine
from tpuwatch.protocol import (
    Config,
    DeviceSample,
    Epoch,
    Exit,
    Hello,
    HostSample,
    Message,
    Retrace,
    Step,
    Topology,
)

T0 = 1_750_000_000.0
MiB = 1 << 20
GiB = 1 << 30

LossFn = Callable[[int, int, float], float]  # (step, global replica, clean loss) -> loss


@dataclass
class SyntheticRun:
    workers: int = 1
    local_replicas: int = 4
    is_tpu: bool = False
    seed: int = 0
    step_time_s: float = 0.05
    time_noise: float = 0.05  # relative sd of step time (lognormal)
    input_wait_frac: float = 0.01
    loss_noise: float = 0.02  # relative sd of each replica's loss around the clean loss
    sample_every_s: float | None = 0.5  # None: the agent sends no samples
    rss_bytes: Callable[[float], int] = lambda dt: 2 * GiB  # dt: seconds since start
    available_bytes: int = 12 * GiB
    device_peak_bytes: int = 400 * MiB
    device_limit_bytes: int | None = None
    config: Config | None = None
    msgs: list[tuple[Message, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.t = T0
        self.step = 0
        self.names = [f"host{i}:{100 + i}" for i in range(self.workers)]
        self.next_sample_t = T0
        for wi, name in enumerate(self.names):
            host, pid = name.split(":")
            self.emit(Hello(protocol_version=protocol.PROTOCOL_VERSION, agent_version="0.1.0",
                            run_id="r", t=self.t, pid=int(pid), host=host, worker=name,
                            python_version="3.11", tf_version="2.21.0", keras_version="3.15.0",
                            script="train.py", argv=("train.py",)), name)
            kind = "TPU v4" if self.is_tpu else "CPU"
            devs = tuple(f"/job:worker/replica:0/task:{wi}/device:{'TPU' if self.is_tpu else 'CPU'}:{i}"
                         for i in range(self.local_replicas))
            self.emit(Topology(t=self.t, strategy="TPUStrategyV2" if self.is_tpu else
                               ("MultiWorkerMirroredStrategy" if self.workers > 1
                                else "MirroredStrategy"),
                               replicas=self.workers * self.local_replicas,
                               local_replicas=self.local_replicas, num_workers=self.workers,
                               worker_index=wi, device_kind=kind, devices=devs,
                               is_tpu=self.is_tpu), name)
            if self.config is not None:
                self.emit(self.config, name)

    @property
    def replicas(self) -> int:
        return self.workers * self.local_replicas

    def emit(self, msg: Message, worker: str | None = None) -> None:
        self.msgs.append((msg, worker if worker is not None else self.names[0]))

    def clean_loss(self, step: int) -> float:
        return 2.3 * math.exp(-step / 500.0) + 0.2

    def advance(self, dt: float) -> None:
        """Time passes (no steps); the agents' samplers keep reporting."""
        end = self.t + dt
        while self.sample_every_s is not None and self.next_sample_t <= end:
            self._samples(self.next_sample_t)
            self.next_sample_t += self.sample_every_s
        self.t = end

    def _samples(self, t: float) -> None:
        for wi, name in enumerate(self.names):
            self.emit(HostSample(t=t, rss_bytes=int(self.rss_bytes(t - T0)),
                                 available_bytes=self.available_bytes, total_bytes=16 * GiB,
                                 cpu_percent=150.0), name)
            self.emit(DeviceSample(t=t, device=f"/job:worker/task:{wi}/device:0",
                                   current_bytes=self.device_peak_bytes // 2,
                                   peak_bytes=self.device_peak_bytes,
                                   limit_bytes=self.device_limit_bytes, source="tf"), name)

    def steps(
        self,
        n: int,
        *,
        step_time_s: float | Callable[[int], float] | None = None,
        input_wait_s: float | Callable[[int, int], float] | None = None,  # (step, worker index)
        worker_step_time: Callable[[int, int], float] | None = None,  # (step, worker) -> time
        loss: LossFn | None = None,
        function: str = "train_step",
        examples: int | None = None,
        epoch: int | None = None,
        losses_every: int = 1,  # the losses read on every this-many-th step only (the agent's pace)
    ) -> None:
        for _ in range(n):
            self.step += 1
            s = self.step
            base = step_time_s(s) if callable(step_time_s) else (step_time_s or self.step_time_s)
            dt = base * math.exp(self.rng.gauss(0.0, self.time_noise))
            self.advance(dt)
            for wi, name in enumerate(self.names):
                st = worker_step_time(s, wi) if worker_step_time else dt
                if input_wait_s is None:
                    wait = st * self.input_wait_frac
                elif callable(input_wait_s):
                    wait = input_wait_s(s, wi)
                else:
                    wait = input_wait_s
                clean = self.clean_loss(s)
                losses = []
                for li in range(self.local_replicas):
                    r = wi * self.local_replicas + li
                    v = clean * (1.0 + self.rng.gauss(0.0, self.loss_noise))
                    losses.append(loss(s, r, v) if loss else v)
                read = s % losses_every == 0
                self.emit(Step(step=s, t=self.t, step_time_s=st, input_wait_s=wait,
                               loss=sum(losses) / len(losses) if read else None,
                               replica_losses=tuple(losses) if read else (), steps=1,
                               examples=examples, function=function, epoch=epoch), name)

    def retrace(self, function: str, traces: int, instances: int = 1, change: str = "",
                worker: int = 0) -> None:
        self.emit(Retrace(t=self.t, function=function, traces=traces, instances=instances,
                          signature="(x)", change=change, step=self.step), self.names[worker])

    def epoch_end(self, epoch: int) -> None:
        for name in self.names:
            self.emit(Epoch(t=self.t, epoch=epoch, phase="end", step=self.step), name)

    def epoch_begin(self, epoch: int) -> None:
        for name in self.names:
            self.emit(Epoch(t=self.t, epoch=epoch, phase="begin", step=self.step), name)

    def exit(self, code: int = 0, signal: int | None = None, source: str = "agent") -> None:
        for name in self.names:
            self.emit(Exit(t=self.t + 0.1, exit_code=code, signal=signal, source=source), name)

    def engine(self, **overrides) -> Engine:
        eng = Engine(clock=lambda: self.t, **overrides)
        self.feed(eng)
        return eng

    def feed(self, eng: Engine) -> None:
        for msg, worker in self.msgs:
            eng.apply(msg, worker=worker)
        self.msgs = []


def findings(eng: Engine, rule: str | None = None, now: float | None = None):
    eng.evaluate(now)
    return [f for f in eng.findings() if rule is None or f.rule == rule]


def alarms(eng: Engine, now: float | None = None):
    """Warning and critical findings."""
    return [f for f in findings(eng, now=now) if f.severity != "info"]
