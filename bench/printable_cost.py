"""What escaping the run's text costs the viewer.

Every line of the script's output goes through ``clean_line`` (colour codes dropped, every other
control escaped with ``tpuwatch.printable``), and every panel body through ``printable_content``
at each refresh. This times both on typical text (TensorFlow log lines, Keras progress with
colour codes), beside the colour-stripping alone that ``clean_line`` did before, and prints the
ratio and the 1-minute load average.

    python bench/printable_cost.py [--lines 200000]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpuwatch.ui.output_tail import clean_line  # noqa: E402
from tpuwatch.ui.printable_content import printable_content  # noqa: E402

#: What clean_line removed before escaping was added (CSI and two-character escapes).
_BEFORE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_only(raw: str) -> str:
    if "\r" in raw:
        segments = [s for s in raw.split("\r") if s]
        raw = segments[-1] if segments else ""
    return _BEFORE.sub("", raw)


def per_line_us(fn, lines: list[str]) -> float:
    t = time.perf_counter()
    for line in lines:
        fn(line)
    return (time.perf_counter() - t) / len(lines) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    from textual.content import Content

    lines = [f"\x1b[1m{i}/3000\x1b[0m [====>....] - 2s 8ms/step - loss: 0.{i:05d}" if i % 10 == 0 else
             f"I0000 00:00:1750000001.{i} 12 cudart_stub.cc:29] line {i} of TensorFlow's log" for i in range(a.lines)]
    before = statistics.median(per_line_us(strip_only, lines) for _ in range(a.repeats))
    after = statistics.median(per_line_us(clean_line, lines) for _ in range(a.repeats))
    body = Content("\n".join(f"r{i}  CPU:{i}   0.9286  -0.0244 · 3× CPU · step 150" for i in range(40)))
    t = time.perf_counter()
    for _ in range(10_000):
        printable_content(body)
    panel = (time.perf_counter() - t) / 10_000 * 1e6
    print(f"output line: {before:.2f} us before, {after:.2f} us now ({after / before:.2f}x); "
          f"10k lines/s cost {after * 1e4 / 1e6 * 100:.1f}% of a core")
    print(f"40-line panel body, nothing to escape: {panel:.1f} us")
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
