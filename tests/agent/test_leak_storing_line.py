"""The leak doctor charges growth to the line that keeps it: tracemalloc sees where the bytes were
made (``out = normalise(batch)``), the fix edits where they are kept (``seen[key] = out``); and a
container that gained arrays names its line where tracemalloc sees nothing. No TensorFlow; NumPy
comes with it (not with tpuwatch), so the tests with arrays are marked ``tf``."""

from __future__ import annotations

import sys

import pytest

from tpuwatch.agent import leak_doctor
from tpuwatch.protocol import AllocationSites

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


class Keeper:
    def __init__(self):
        self.snapshots = [[0.0] for _ in range(20)]

    def on_batch_end(self, weights):
        self.snapshots.append([w.copy() for w in weights])


@pytest.mark.tf
def test_a_container_that_gained_arrays_in_the_window_is_charged_to_the_line_that_adds_to_it():
    import numpy as np

    # NumPy arrays whose buffers TensorFlow allocated (get_weights() under a strategy), or
    # Python's allocations on TensorFlow's threads (where tracemalloc stays off), are invisible
    # to tracemalloc: the container that grew says where they are kept
    keeper = Keeper()
    weights = [np.ones((256, 256), np.float32), np.ones(256, np.float32)]
    start = leak_doctor._containers()
    for _ in range(40):
        keeper.on_batch_end(weights)
    empty = AllocationSites(t=0.0, window_s=3.0, step_from=0, step_to=40, step_time_inside_s=None,
                            step_time_before_s=None, sites=(), grown_bytes=(), blocks=(), kinds=(), code=())
    found = leak_doctor._with_containers(empty, start, leak_doctor._library_roots(), [__file__])
    (n,) = [i for i, line in enumerate(open(__file__).read().splitlines(), start=1)
            if line.strip() == "self.snapshots.append([w.copy() for w in weights])"]
    assert found.sites == (f"test_leak_storing_line.py:{n}",) and found.kinds == ("numpy",)
    assert found.blocks == (40,) and 40 * 257 * 256 * 4 <= found.grown_bytes[0] < 41 * 257 * 256 * 4 + 40 * 1024
    del start
    quiet = leak_doctor._with_containers(empty, leak_doctor._containers(), leak_doctor._library_roots(), [__file__])
    assert quiet == empty  # nothing gained since


memo: dict = {}


def remember(batch):
    out = batch * 2.0
    memo[len(memo)] = out
    return out


@pytest.mark.tf
def test_a_dict_the_garbage_collector_does_not_track_is_found_through_the_scripts_names():
    # ints to NumPy arrays: CPython untracks such a dict, so no gc pass lists it (a memo on
    # tf.data's threads came without its line)
    import gc

    import numpy as np

    for _ in range(20):
        remember(np.ones(16))
    assert not gc.is_tracked(memo)
    start = leak_doctor._containers(leak_doctor._library_roots())
    batch = np.ones((512, 512), np.float32)
    for _ in range(30):
        remember(batch)
    empty = AllocationSites(t=0.0, window_s=3.0, step_from=0, step_to=30, step_time_inside_s=None,
                            step_time_before_s=None, sites=(), grown_bytes=(), blocks=(), kinds=(), code=())
    found = leak_doctor._with_containers(empty, start, leak_doctor._library_roots(), [__file__])
    (n,) = [i for i, line in enumerate(open(__file__).read().splitlines(), start=1)
            if line.strip() == "memo[len(memo)] = out"]
    assert found.sites == (f"test_leak_storing_line.py:{n}",) and found.kinds == ("numpy",)
    assert found.grown_bytes[0] >= 30 * 512 * 512 * 4


def test_the_scripts_names_are_read_without_running_their_objects_code():
    # a lazily loaded module (importlib's LazyLoader, TensorFlow's) imports on any attribute read,
    # a proxy runs its own code: the agent's thread reads objects' own __dict__ only
    touched = []

    class Lazy:
        def __getattribute__(self, name):
            touched.append(name)
            return object.__getattribute__(self, name)

        def __getattr__(self, name):
            touched.append(name)
            raise AttributeError(name)

    lazy_module_like = Lazy()
    kept = [bytearray(8) for _ in range(20)]
    lazy_module_like.kept = kept
    touched.clear()
    roots = leak_doctor._library_roots()
    held = leak_doctor._script_held(roots)
    assert any(h is kept for h in held)  # found through the object's own dict
    frame = sys._getframe()
    assert "kept" in leak_doctor._names(kept, [frame])[1]
    assert leak_doctor._replica_values(lazy_module_like) == ()
    assert touched == []
    del lazy_module_like, frame
