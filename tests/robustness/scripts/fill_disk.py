"""Fills the disk under the run directory, keeps printing and stepping, then frees the space.

argv: FILLER_PATH MARKER_PATH. The marker (on another disk) gets "survived N" when the script
reached its end, so a test can tell "training went on" from "the script died"."""

import errno
import os
import sys
import time

import tensorflow  # noqa: F401  (the step probe attaches once TensorFlow is imported)

import tpuwatch

filler, marker = sys.argv[1], sys.argv[2]
fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)  # everything the disk has: later writes fail
for size in (65536, 512, 1):
    try:
        while True:
            os.write(fd, b"\0" * size)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
os.close(fd)

steps = 0
for i in range(600):
    with tpuwatch.step(examples=8) as s:
        s.loss = 1.0 / (i + 1)
    steps += 1
    print(f"step {i} " + "x" * 4000)  # the script's own print, on the full disk
    sys.stderr.write(f"err {i}\n")
    time.sleep(0.005)  # ~3 s of full disk, so a viewer polling once a second sees it
os.unlink(filler)  # space returns
for i in range(600, 620):
    with tpuwatch.step(examples=8) as s:
        s.loss = 1.0 / (i + 1)
    steps += 1
    print(f"step {i} after the disk has space again")
with open(marker, "w") as f:
    f.write(f"survived {steps}\n")
