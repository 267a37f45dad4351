"""The README's pure-Python loop: no TensorFlow import at all, steps marked with tpuwatch.step()."""

import random

import tpuwatch

weight = 0.0
for i in range(6):
    with tpuwatch.step(examples=16) as s:
        batch = [random.gauss(1.0, 0.1) for _ in range(16)]
        s.loss = sum((x - weight) ** 2 for x in batch) / len(batch)
        weight += 0.1
    print(f"step {i + 1} loss {s.loss!r}", flush=True)
