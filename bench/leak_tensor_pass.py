"""What the leak doctor's tensor diff costs: reading TensorFlow's tensor counter at the start of
its window, and the ``gc.get_objects()`` pass at its end (the tensors made since, their bytes, the
container holding them, its name and the line that adds to it), and the container diff's passes
(the lists and dicts at the window's start; at its end, the one that gained the most bytes), in a process with TensorFlow, a
Keras model and ``--kept`` tensors in a list. Both hold the GIL: the training thread waits that
long, once per window (at most two windows a run). Prints milliseconds; no asserts.

    python bench/leak_tensor_pass.py [--kept 400] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kept", type=int, default=400)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    import keras
    import numpy as np
    import tensorflow as tf

    from tpuwatch.agent import leak_doctor
    from tpuwatch.protocol import AllocationSites

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"), keras.layers.Dense(64)])
    x = tf.constant(np.random.default_rng(0).random((1024, 64), dtype=np.float32))
    empty = AllocationSites(t=0.0, window_s=3.0, step_from=0, step_to=1, step_time_inside_s=None,
                            step_time_before_s=None, sites=(), grown_bytes=(), blocks=(), kinds=(), code=())
    roots = leak_doctor._library_roots()  # computed once per run by the doctor
    starts, ends = [], []
    container_starts, container_ends = [], []  # the container diff's two passes
    for _ in range(args.repeats):
        all_logits: list = []
        t0 = time.perf_counter()
        before = leak_doctor._tensor_mark()
        starts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        held = leak_doctor._containers(roots)
        container_starts.append(time.perf_counter() - t0)
        for _ in range(args.kept):
            all_logits.append(model(x))  # the line the pass must find
        t0 = time.perf_counter()
        found = leak_doctor._with_tensors(empty, before, roots, [__file__])
        ends.append(time.perf_counter() - t0)
        assert found.kinds[:1] == ("tensors",), found
        t0 = time.perf_counter()
        leak_doctor._with_containers(found, held, roots, [__file__])
        container_ends.append(time.perf_counter() - t0)
        del held
    print(f"gc-tracked objects: {len(gc.get_objects())}; kept tensors per window: {args.kept}; "
          f"found at {found.sites[0]} (+{found.grown_bytes[0] / 2**20:.0f} MiB)")
    print(f"start (counter read): median {statistics.median(starts) * 1e3:.3f} ms; "
          f"end pass: median {statistics.median(ends) * 1e3:.1f} ms (GIL held, once per window)")
    print(f"container diff: start pass median {statistics.median(container_starts) * 1e3:.1f} ms, "
          f"end median {statistics.median(container_ends) * 1e3:.1f} ms (GIL held, once per window); "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
