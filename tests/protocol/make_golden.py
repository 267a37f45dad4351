"""Writes tests/protocol/golden.jsonl: one message of every kind, with edge values.

Run it only when the protocol changes on purpose (and bump PROTOCOL_VERSION if old readers break).
"""

from __future__ import annotations

import math
from pathlib import Path

from tpuwatch import protocol as p

GOLDEN = Path(__file__).with_name("golden.jsonl")

MESSAGES: list[p.Message] = [
    p.Hello(protocol_version=1, agent_version="0.1.0", run_id="20261122-020500-train-ab12", t=1795300000.25,
            pid=4242, host="tpu-vm-0", worker="tpu-vm-0:4242", python_version="3.11.7", tf_version="2.21.0",
            keras_version="3.15.1", script="train.py", argv=("train.py", "--epochs", "3")),
    p.Topology(t=1795300001.0, strategy="TPUStrategyV2", replicas=8, local_replicas=8, num_workers=1,
               worker_index=0, device_kind="TPU v4", devices=tuple(f"TPU:{i}" for i in range(8)), is_tpu=True),
    p.Config(t=1795300001.5, mixed_precision="mixed_bfloat16", global_batch_size=1024, per_replica_batch_size=128,
             steps_per_execution=32, total_steps=3000, epochs=3, keras_version="3.15.1"),
    p.Step(step=32, t=1795300002.0, step_time_s=0.0215, input_wait_s=0.0012, loss=2.302585,
           replica_losses=(2.30, 2.31, math.nan, math.inf, -math.inf, 2.29, 2.30, 2.31), steps=32, examples=1024,
           function="multi_step_on_iterator", epoch=0),
    p.Step(step=33, t=1795300002.1, step_time_s=0.02, input_wait_s=None, loss=None),
    p.StepLoss(t=1795300002.2, step=33, loss=2.305, replica_losses=(2.30, 2.31)),
    p.HostSample(t=1795300002.5, rss_bytes=3_221_225_472, available_bytes=300_000_000_000,
                 total_bytes=400_000_000_000, cpu_percent=102.5, load_1m=3.25),
    p.DeviceSample(t=1795300002.5, device="TPU:0", current_bytes=30_000_000_000, peak_bytes=31_000_000_000,
                   limit_bytes=34_359_738_368, source="tpu-info", limit_source="runtime", duty_cycle_pct=98.5),
    p.Retrace(t=1795300003.0, function="train_step", traces=2, instances=1,
              signature="x: float32(64, 28, 28, 1), lr: 0.05", change="lr: python float 0.1 -> 0.05", step=100,
              call_site="train.py:61", call_code="loss = train_step(x, lr)"),
    p.Pipeline(t=1795300003.5, dataset=1, consumer="experimental_distribute_dataset",
               stages=("from_tensor_slices", "map", "cache", "batch", "prefetch"),
               sites=("train.py:40", "train.py:41", "train.py:42", "", "train.py:44"),
               settings=("", "num_parallel_calls=AUTOTUNE, deterministic='default'", "filename=''",
                         "batch_size=64, drop_remainder=True", "buffer_size=AUTOTUNE"),
               code=("ds = tf.data.Dataset.from_tensor_slices((x, y))", ".map(decode)", ".cache()", "",
                     ".prefetch(tf.data.AUTOTUNE))"),
               holds_bytes=(0, 0, 100_728_832, 0, -1), added_by=("", "", "", "keras", ""), elements=None,
               consumer_site="train.py:60", tf_prefetch=True, tf_parallel=(False, False, False, False, False),
               use="train"),
    p.AllocationSites(t=1795300003.7, window_s=3.0, step_from=120, step_to=400, step_time_inside_s=0.0125,
                      step_time_before_s=0.0121, sites=("train.py:71", "train.py:80"),
                      grown_bytes=(587_202_560, 1_048_576), blocks=(280, 5600), kinds=("numpy", "python"),
                      code=("kept.append(np.full(n, loss))", "history.append(logs)"), traced_bytes=590_000_000,
                      rss_grown_bytes=612_368_384),
    p.HostSites(t=1795300003.75, samples=48, script_samples=45, step_samples=20, sample_interval_s=0.25,
                sites=("train.py:30", "train.py:52"), counts=(40, 5), kinds=("numpy", "tensor read"),
                roles=("generator", "callback"), functions=("batches", "WeightHistory.on_train_batch_end"),
                callers=("train.py:61", "WeightHistory.on_train_batch_end"),
                code=("image = image[:, ::-1] * rng.uniform(0.8, 1.2)", "w = self.model.get_weights()")),
    p.Teardown(t=1795300003.78, since=1795300001.5, cpu_s=0.01, iterator="OwnedMultiDeviceIterator", step=600,
               stack=("train.py:48 in main: for x in dist_ds:", "train.py:90 in <module>: main()"),
               site="train.py:48 in main: for x in dist_ds:", under_way=True),
    p.InputStages(t=1795300003.8, path="/r/profiles/plugins/profile/2026_11_22_02_05_03", step_from=121,
                  step_to=150, capture_s=1.02, fetch_s=0.31,
                  iterators=("Root", "Root::Prefetch", "Root::Prefetch::MapAndBatch",
                             "Root::Prefetch::MapAndBatch::TensorSlice"),
                  self_s=(0.0004, 0.305, 0.98, 0.012), calls=(30, 30, 29, 1856), busy_s=(0.31, 0.305, 0.992, 0.012),
                  step_time_before_s=0.031,
                  step_time_inside_s=0.034, step_time_after_s=None),
    p.Epoch(t=1795300004.0, epoch=0, phase="end", step=1000, logs={"loss": 0.5, "accuracy": 0.875, "lr": math.nan}),
    p.Phase(t=1795300004.25, phase="evaluating", since=1795300004.0, detail="test_step", step=1000, calls=12),
    p.Event(t=1795300004.5, level="warning", source="probe:replica_loss", message="probe replica_loss disabled: x",
            fact=p.EventFact.PROBE_DISABLED, subject="replica_loss", reason="x"),
    p.ExceptionRaised(t=1795300005.0, type="ValueError", message="bad \"input\" \u2014 ünïcode",
                      traceback="Traceback (most recent call last):\n  ...\nValueError: bad"),
    p.Command(id="c1", action="checkpoint", args={"dir": "gs://bucket/ckpt", "steps": 5}),
    p.CommandState(t=1795300006.0, id="c1", action="checkpoint", state="running", step=1200),
    p.Result(t=1795300007.0, id="c1", action="checkpoint", ok=True, message="saved",
             details={"path": "gs://bucket/ckpt/ckpt-1200", "bytes": 123456, "seconds": 0.25, "step": 1200}),
    p.SlowSteps(t=1795300007.5, path="/r/profiles/auto-profile-2", function="train_step", first_slow_step=101,
                step_from=106, step_to=125, slow_step_s=0.21, normal_step_s=0.0105, slow_wait_s=0.0004,
                normal_wait_s=0.0003, slow_between_s=0.0011, normal_between_s=0.001),
    p.SlowSteps(t=1795300007.6, path="", function="train_step", first_slow_step=301, step_from=0, step_to=0,
                slow_step_s=0.2, normal_step_s=0.01, error="the profiler is busy"),
    p.StackDump(t=1795300008.0, text="Thread 0x1 (most recent call first):\n  File \"train.py\", line 3",
                path="/r/stacks/1.txt"),
    p.StackDump(t=1795300008.5, text="Thread \"MainThread\" [TRAINING THREAD]\n  File \"train.py\", line 26",
                path="/r/stacks/stall-10.txt", reason="stall", step=10, gap_s=12.5,
                headline="waiting at train.py:26: time.sleep(40)", stalled_in="script",
                input_line="train.py:12: time.sleep(1)"),
    p.Finding(t=1795300009.0, rule="input-bound", severity="warning", message="input wait is 42% of step time",
              advice="prefetch(tf.data.AUTOTUNE)", evidence={"wait_share": 0.42, "steps": 300}, first_step=10,
              last_step=310, worker="tpu-vm-0:4242"),
    p.Attach(protocol_version=1, offset=0, token="", viewer="tpuwatch"),
    p.Attach(protocol_version=1, offset=4096, token="t0k", viewer="tpuwatch", summary=True),
    p.HostSummary(
        t=1795300009.5, offset_bytes=81920, records=10, steps=10, step=1210, step_t=1795300009.4,
        function="train_step", epoch=1, step_time_p50_s=0.1, step_time_p95_s=0.125, step_time_max_s=0.25,
        step_time_sum_s=1.05, input_wait_sum_s=0.6, input_wait_steps=10, input_wait_p50_s=0.06, loss=2.25,
        replica_losses=(2.25, math.nan, 2.5, 2.0), loss_step=1208, host_t=1795300009.25, rss_bytes=6_442_450_944,
        available_bytes=300_000_000_000, total_bytes=400_000_000_000, cpu_percent=150.0, load_1m=None,
        devices=("TPU:0", "TPU:1"), device_t=(1795300009.25, 1795300009.25),
        device_current_bytes=(21_474_836_480, 21_475_000_000), device_peak_bytes=(25_769_803_776, 25_769_803_776),
        device_limit_bytes=(34_359_738_368, 0), device_source="tpu-info", device_limit_source="chip table v4"),
    p.Exit(t=1795300010.0, exit_code=137, signal=9, source="launcher", reason="killed by SIGKILL"),
]

if __name__ == "__main__":
    GOLDEN.write_bytes(b"".join(p.encode(m) for m in MESSAGES))
    print(f"wrote {GOLDEN}")
