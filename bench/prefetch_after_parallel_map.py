"""Does a final ``.prefetch`` cut the wait after a parallel map and batch? (the doctor's
"no final prefetch" rule.)

A pipeline ``range.map(read, num_parallel_calls=AUTOTUNE).batch(8)`` whose ``read`` waits 2 ms
(I/O: it releases the GIL) feeds a loop whose step takes 8 ms (a sleep, as a device step frees
the host). Prints the share of the loop spent waiting in ``next()`` as written, with
``.prefetch(AUTOTUNE)`` added, and with TF's ``inject_prefetch`` optimisation turned off, each
``--rounds`` times. ``--interleave``: the batches come from a parallel ``interleave`` of 4 readers
(each reads its elements one after another, 2 ms each) instead of the parallel map. Run:
``python bench/prefetch_after_parallel_map.py [--interleave]``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", type=int, default=150)
    p.add_argument("--interleave", action="store_true")
    args = p.parse_args()
    import numpy as np
    import tensorflow as tf

    def read(i: np.int64) -> np.float32:
        time.sleep(0.002)
        return np.float32(i)

    def parse(i: tf.Tensor) -> tf.Tensor:
        y = tf.numpy_function(read, [i], tf.float32)
        y.set_shape(())
        return y

    def pipeline(variant: str) -> tf.data.Dataset:
        if args.interleave:
            ds = tf.data.Dataset.range(64).interleave(lambda shard: tf.data.Dataset.range(10**6).map(parse),
                                                      cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
        else:
            ds = tf.data.Dataset.range(10**9).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.batch(8)
        if variant == "prefetch":
            ds = ds.prefetch(tf.data.AUTOTUNE)
        if variant == "no-inject":
            options = tf.data.Options()
            options.experimental_optimization.inject_prefetch = False
            ds = ds.with_options(options)
        return ds

    for _ in range(args.rounds):
        for variant in ("as-written", "prefetch", "no-inject"):
            it = iter(pipeline(variant))
            for _ in range(20):  # warm-up: autotuning settles
                next(it)
            wait = 0.0
            t0 = time.perf_counter()
            for _ in range(args.batches):
                t = time.perf_counter()
                next(it)
                wait += time.perf_counter() - t
                time.sleep(0.008)  # the step
            total = time.perf_counter() - t0
            print(f"{variant:10s} wait {wait / total * 100:5.1f} % of the loop ({wait / args.batches * 1e3:.2f} ms a batch)")


if __name__ == "__main__":
    main()
