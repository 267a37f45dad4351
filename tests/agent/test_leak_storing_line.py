"""The leak doctor charges an allocation to the line that keeps its result: tracemalloc sees where
the bytes were made (``out = normalise(batch)``), the fix edits where they are kept
(``seen[key] = out``). Pure source reading, no TensorFlow."""

from __future__ import annotations

from tpuwatch.agent import leak_doctor

SOURCE = '''def memo(batch):
    out = (batch - batch.mean()) / batch.std()
    n = len(seen)
    seen[n] = out  # kept for later
    return out


def no_store(batch):
    copy = batch.copy()
    return copy


def later_block(batch):
    arr = batch + 1
    if arr.any():
        history.append(arr)


def other_name(batch):
    arr = batch + 1
    history.append(arr2)


def outside(batch):
    arr = batch + 1
    return arr
kept.append(arr)
'''


def test_the_line_that_stores_an_allocations_result_is_found_in_its_block(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(SOURCE)
    lines = SOURCE.splitlines()

    def at(text: str) -> int:
        (n,) = [i for i, line in enumerate(lines, start=1) if line.strip().startswith(text)]
        return n

    assert leak_doctor._storing_line(str(path), at("out = (batch")) == at("seen[n] = out")
    assert leak_doctor._storing_line(str(path), at("copy = batch.copy()")) is None
    assert leak_doctor._storing_line(str(path), at("if arr.any():") - 1) == at("history.append(arr)")  # nested
    assert leak_doctor._storing_line(str(path), at("history.append(arr2)") - 1) is None  # another name
    assert leak_doctor._storing_line(str(path), len(lines) - 2) is None  # the block ended before it
    by_site = {(str(path), at("out = (batch")): [50 << 20, 100, "python"],
               (str(path), at("copy = batch.copy()")): [1 << 20, 3, "python"]}
    moved = leak_doctor._at_storing_lines(by_site)
    assert moved == {(str(path), at("seen[n] = out")): [50 << 20, 100, "python"],
                     (str(path), at("copy = batch.copy()")): [1 << 20, 3, "python"]}
