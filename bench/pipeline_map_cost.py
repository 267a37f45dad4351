"""What the pipeline map costs: per transformation (the ``DatasetV2.__init__`` hook noting the
script's line) and per dataset (walking the chain once and building its message), against
building the same pipeline without the hook. Prints ratios and microseconds; no asserts.

    python bench/pipeline_map_cost.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class _Agent:
    def __init__(self) -> None:
        self.sent: list = []

    def emit(self, msg) -> None:
        self.sent.append(msg)

    def enabled(self, probe: str) -> bool:
        return True

    def probe_failed(self, probe: str, e) -> None:
        raise RuntimeError(f"{probe}: {e}")

    def clock(self) -> float:
        return time.time()


def build(tf, x, y):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.map(lambda a, b: (a * 2.0, b), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.cache().shuffle(1024).batch(64, drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    import numpy as np
    import tensorflow as tf

    from tpuwatch.agent import pipeline_map
    from tpuwatch.agent.patches import Patches

    x = np.zeros((4096, 32), np.float32)
    y = np.zeros(4096, np.int64)
    tf.autograph.experimental.do_not_convert(build)
    for _ in range(5):
        build(tf, x, y)  # warm TF's caches

    def timed(fn) -> float:
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    plain = timed(lambda: build(tf, x, y))
    agent = _Agent()
    patches = Patches()
    pm = pipeline_map.install(agent, patches)  # type: ignore[arg-type]
    hooked = timed(lambda: build(tf, x, y))
    ds = build(tf, x, y)
    describe = timed(lambda: pm.describe(ds, "iterator", 1))
    patches.restore()
    print(f"build a 6-stage pipeline: plain {plain * 1e6:.0f} µs, with the hook {hooked * 1e6:.0f} µs "
          f"(x{hooked / plain:.3f}; {(hooked - plain) / 6 * 1e6:+.1f} µs per transformation)")
    print(f"map it once (walk + settings + cardinality of the cache's and shuffle's inputs): "
          f"{describe * 1e6:.0f} µs per dataset")


if __name__ == "__main__":
    main()
