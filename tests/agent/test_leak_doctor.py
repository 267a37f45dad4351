"""The leak doctor's tensor diff: TensorFlow's tensors are not Python allocations, so
tracemalloc cannot see a container of them grow; the window's gc pass finds the new tensors, the
container holding them, its name and the line that adds to it. Real TensorFlow, in process."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tpuwatch.agent import leak_doctor
from tpuwatch.protocol import AllocationSites

pytestmark = pytest.mark.tf
EMPTY = AllocationSites(t=0.0, window_s=3.0, step_from=0, step_to=1, step_time_inside_s=None,
                        step_time_before_s=None, sites=(), grown_bytes=(), blocks=(), kinds=(), code=())


def _line(text: str) -> str:
    (n,) = [i for i, line in enumerate(open(__file__).read().splitlines(), start=1)
            if line.strip() == text]
    return f"test_leak_doctor.py:{n}"


def _window(fill) -> AllocationSites:
    """The window's two passes around ``fill``, which ends the window itself while its frame
    still runs (as the agent's thread samples a training loop that is running)."""
    before = leak_doctor._tensor_mark()
    found = []
    fill(lambda: found.append(leak_doctor._with_tensors(EMPTY, before, leak_doctor._library_roots(), [__file__])))
    return found[0]


def test_a_local_list_of_tensors_is_charged_to_its_append_line():
    import tensorflow as tf

    def fill(end):
        outputs = []
        for _ in range(40):
            outputs.append(tf.ones((256, 256)))
        end()

    found = _window(fill)
    assert found.sites == (_line("outputs.append(tf.ones((256, 256)))"),)
    assert found.kinds == ("tensors",) and 35 <= found.blocks[0] <= 40
    assert found.blocks[0] * 256 * 256 * 4 < found.grown_bytes[0] < found.blocks[0] * (256 * 256 * 4 + 1024)
    assert found.code == ("outputs.append(tf.ones((256, 256)))",)


def test_an_attribute_dict_of_scalar_tensors_is_charged_to_its_store_line():
    import tensorflow as tf

    class History:
        def __init__(self) -> None:
            self.loss_by_step: dict[int, tf.Tensor] = {}
            self.outputs_by_step: dict[int, tf.Tensor] = {}

    h = History()

    def fill(end):
        for step in range(2000):
            h.loss_by_step[step] = tf.reduce_sum(tf.ones((100,)))  # a scalar per step
        end()

    found = _window(fill)
    assert found.sites == (_line("h.loss_by_step[step] = tf.reduce_sum(tf.ones((100,)))  # a scalar per step"),)
    # a new tensor that took the id of one that died meanwhile is missed: a few, not more
    assert found.kinds == ("scalar tensors",) and 1900 <= found.blocks[0] <= 2000

    def fill_big(end):
        for step in range(40):
            h.outputs_by_step[step] = tf.ones((64, 1024))
        end()

    found = _window(fill_big)  # the scalars made before this window are not counted again
    assert found.sites == (_line("h.outputs_by_step[step] = tf.ones((64, 1024))"),)
    assert found.kinds == ("tensors",) and 35 <= found.blocks[0] <= 40


def test_tensors_kept_in_a_tuple_per_step_are_charged_to_the_lists_append_line():
    import tensorflow as tf

    def fill(end):
        records = []
        for step in range(40):
            records.append((step, tf.ones((256, 256)), tf.zeros((8,))))
        end()

    found = _window(fill)
    assert found.sites == (_line("records.append((step, tf.ones((256, 256)), tf.zeros((8,))))"),)
    assert found.kinds == ("tensors",)


def test_per_replica_outputs_kept_in_a_list_are_charged_to_the_append_line():
    # a strategy's step returns a PerReplica per output: its tensors sit in the value's _values,
    # one level down from the list (before: the tensors were counted, the line "not found")
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    except RuntimeError:
        pass  # this process's devices were set up by an earlier test: use what it has
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    step = tf.function(lambda: strategy.run(lambda: tf.ones((128, 256)) * 2.0))

    def fill(end):
        per_step = []
        for _ in range(40):
            per_step.append(step())
        end()

    found = _window(fill)
    assert found.sites == (_line("per_step.append(step())"),), found
    assert found.kinds == ("tensors",) and found.blocks[0] >= 35 * len(devices)


def test_tensors_made_where_tensors_alive_at_the_start_died_are_still_new():
    # CI, oldest pair, 2026-11-26: tensors an earlier test left in a cycle were alive when the
    # window started and freed by a gc during it; the new tensors took their addresses, and an
    # id-based diff found none of them
    import gc

    import tensorflow as tf

    class Cycle:
        def __init__(self) -> None:
            self.me = self
            self.kept = [tf.ones((4,)) for _ in range(400)]

    Cycle()  # garbage: alive until a collection

    def fill(end):
        gc.collect()  # frees the 400 tensors, whose addresses the next ones take
        made = []
        for step in range(40):
            made.append((step, tf.ones((256, 256)), tf.zeros((8,))))
        end()

    found = _window(fill)
    assert found.sites == (_line("made.append((step, tf.ones((256, 256)), tf.zeros((8,))))"),)
    assert found.blocks == (80,)


def test_tensors_that_do_not_outlive_the_window_are_not_reported():
    import tensorflow as tf

    def fill(end):
        total = 0.0
        for _ in range(40):
            total += float(tf.reduce_sum(tf.ones((256, 256))))
        end()

    assert _window(fill) == EMPTY


class _Agent:
    global_step = 0

    def __init__(self) -> None:
        self.emitted: list = []

    def emit(self, msg, force=False) -> None:
        self.emitted.append(msg)

    def clock(self) -> float:
        return 1.8e9

    def probe_failed(self, name, e) -> None:
        raise e


def _rising(doctor, agent, t, rss, mib_per_sample=30):
    """One sample of the agent's thread (2 Hz) while the steps go on and RSS climbs."""
    t[0] += 0.5
    agent.global_step += 20
    rss[0] += mib_per_sample << 20
    return list(doctor())


def _leaky_module(tmp_path, monkeypatch, name: str, source: str, kept: str = "kept"):
    """A script module of the test's own (its lines are the sites the window names), ``KEPT`` in
    ``source`` written as ``kept``: this file's text then has no line that adds to that name."""
    import importlib

    (tmp_path / f"{name}.py").write_text("import numpy as np\n\n" + source.replace("KEPT", kept))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # gone after the test: no other test's file
    return module


def _keeping_module(tmp_path, monkeypatch, name: str, kept: str, elements: int = 1 << 18):
    """A script module whose ``keep(kept, n)`` appends ``n`` arrays of ``elements`` float64s (2 MiB
    by default) to the list ``kept`` at its line 5."""
    return _leaky_module(tmp_path, monkeypatch, name,
                         "def keep(KEPT, n):\n"
                         "    for _ in range(n):\n"
                         f"        KEPT.append(np.ones({elements}))  # a step's array, kept\n", kept)


# a list only a closure holds: no name of the script's is bound to it
_CLOSURE = ("def make_keeper():\n"
            "    KEPT = []\n"
            "    def keep(n):\n"
            "        for _ in range(n):\n"
            "            KEPT.append(np.ones(1 << 18))  # 2 MiB a step\n"
            "    return keep\n")


# a name that two lines add to, the first not the one that grows
_TWO_LINES = ("KEPT = []\n"
              "def note(x):\n"
              "    KEPT.append(float(x))\n"
              "def make_keeper():\n"
              "    def keep(n):\n"
              "        for _ in range(n):\n"
              "            KEPT.append(np.ones(1 << 18))  # 2 MiB a step\n"
              "    return keep\n")


def _window_open(doctor, agent, t, rss) -> None:
    """Samples until the window opens, and one more: its first snapshot."""
    import tracemalloc

    for _ in range(leak_doctor.RISE_SAMPLES + 1):
        assert _rising(doctor, agent, t, rss) == []
    assert doctor.window_open and not tracemalloc.is_tracing()  # the window opened, light
    assert _rising(doctor, agent, t, rss) == []  # its first snapshot


def test_a_window_still_open_when_the_script_ends_reports_what_it_saw(tmp_path, monkeypatch):
    # a short run can end inside the 3 s window: its sites were lost and tracemalloc stayed on
    # through the exit (CI, 2026-11-26: the finding came without the line)
    import tracemalloc

    # (a name no other line of these files adds to: the light window names its one line)
    leaky = _keeping_module(tmp_path, monkeypatch, "leaky_script", "kept_to_the_end")
    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], script_dir=str(tmp_path))
    kept_to_the_end: list = [np.ones(1) for _ in range(20)]  # what earlier steps kept
    try:
        _window_open(doctor, agent, t, rss)
        leaky.keep(kept_to_the_end, 20)
        agent.global_step += 20  # the steps that kept them
        t[0] += 1.0  # the script ends 1 s in
        doctor.close()
    finally:
        if tracemalloc.is_tracing() and agent.emitted == []:
            tracemalloc.stop()
    assert not tracemalloc.is_tracing()
    (sites,) = agent.emitted
    assert isinstance(sites, AllocationSites) and sites.window_s < leak_doctor.WINDOW_S
    assert sites.sites[0] == "leaky_script.py:5" and sites.grown_bytes[0] >= 20 * (2 << 20)
    doctor.close()  # twice (or with no window): nothing more
    assert len(agent.emitted) == 1


def test_a_window_cut_short_after_the_scripts_frames_returned_claims_nothing(tmp_path, monkeypatch):
    # CI, 2026-11-26: a short run (400 steps in ~5 s) ended inside the window; at exit the script's
    # main() had returned and freed the list it kept the arrays in, so the diff found nothing and
    # said so: "the script's Python allocations did not grow ... what grows is native memory"
    import tracemalloc

    leaky = _leaky_module(tmp_path, monkeypatch, "leaky_main",
                          "def main(n):\n"
                          "    kept = []\n"
                          "    for _ in range(n):\n"
                          "        kept.append(np.ones(1 << 18))  # 2 MiB a step, kept until main returns\n")
    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], script_dir=str(tmp_path))
    try:
        _window_open(doctor, agent, t, rss)
        leaky.main(20)  # the training ran on and the script returned: its list is gone
        agent.global_step += 20
        doctor.close()
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert agent.emitted == []  # no window to show: the finding keeps its general advice


def test_a_window_ends_as_soon_as_it_has_seen_the_growth_it_needs():
    # a fast leak (60 MiB/s here) needs no 3 s under tracemalloc, which slows every step; a short
    # run could end before a 3 s window did
    import tracemalloc

    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0])
    grown_fast = [bytearray(1) for _ in range(20)]  # what earlier steps kept
    try:
        for _ in range(leak_doctor.RISE_SAMPLES + 1):
            _rising(doctor, agent, t, rss)
        assert doctor.window_open
        opened = t[0]
        _rising(doctor, agent, t, rss)  # the first snapshot
        found: list = []
        while not found and t[0] - opened < leak_doctor.WINDOW_S:
            grown_fast.extend(bytearray(1 << 20) for _ in range(30))
            found = _rising(doctor, agent, t, rss)
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    (sites,) = found
    assert sites.window_s <= leak_doctor.MIN_WINDOW_S + 0.5 and t[0] - opened < leak_doctor.WINDOW_S
    assert sites.grown_bytes[0] >= 30 << 20


def test_a_slow_growth_keeps_the_window_open_its_full_length():
    import tracemalloc

    # RSS alone climbs (nothing of the script's holds it): the light window runs its full length,
    # names nothing, and tracemalloc's follows, its full length too
    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0])
    escalated = None
    try:
        for _ in range(40):  # 12 MiB/s: suspected once 64 MiB beyond where training began
            _rising(doctor, agent, t, rss, mib_per_sample=6)
            if doctor.window_open:
                break
        assert doctor.window_open
        opened = t[0]
        found: list = []
        while not found and t[0] - opened < 3 * leak_doctor.WINDOW_S:
            found = _rising(doctor, agent, t, rss, mib_per_sample=6)
            if escalated is None and tracemalloc.is_tracing():
                escalated = t[0]
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert escalated is not None and escalated - opened >= leak_doctor.WINDOW_S
    assert len(found) == 1 and found[0].window_s >= leak_doctor.WINDOW_S - 0.5


def test_no_window_opens_while_a_profile_is_captured():
    class Profiler:
        active: object | None = object()  # a capture (the auto-profile's or the user's) runs

    class Agent:
        global_step = 0
        profiler = Profiler()

    agent, t, rss = Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0])
    import tracemalloc

    for _ in range(leak_doctor.RISE_SAMPLES + 3):
        t[0] += 0.5
        agent.global_step += 20
        rss[0] += 30 << 20
        assert list(doctor()) == []
    assert not doctor.window_open
    # the capture ended: what grew meanwhile was the profiler's (left out); the growth climbs on
    # for as many samples as the doctor asks for, and the window opens
    agent.profiler.active = None
    for i in range(leak_doctor.RISE_SAMPLES + 1):
        t[0] += 0.5
        agent.global_step += 20
        rss[0] += 30 << 20
        list(doctor())
        assert doctor.window_open == (i == leak_doctor.RISE_SAMPLES)
    assert not tracemalloc.is_tracing()  # a light window first


def test_a_window_that_saw_no_step_is_no_evidence_and_the_next_climb_opens_another():
    # a window that opened as an epoch ended (no step ran in its 3 s) found nothing, counted, and
    # none opened again: the finding said "native memory" for NumPy arrays kept per step
    import tracemalloc

    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0])
    try:
        for _ in range(leak_doctor.RISE_SAMPLES + 1):
            _rising(doctor, agent, t, rss)
        assert doctor.window_open
        for _ in range(int(leak_doctor.WINDOW_S / 0.5) + 2):  # the window's 3 s: no step, RSS flat
            t[0] += 0.5
            assert list(doctor()) == []
        assert not doctor.window_open and not tracemalloc.is_tracing()  # it closed, sending nothing
        kept = []
        found: list = []
        for _ in range(40):  # the steps go on, and so does the growth
            kept.extend(bytearray(1 << 20) for _ in range(30))
            found = _rising(doctor, agent, t, rss)
            if found:
                break
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    (sites,) = found
    assert sites.step_to > sites.step_from and sites.grown_bytes[0] >= 30 << 20
    assert sites.rss_grown_bytes is not None and sites.rss_grown_bytes > 0
    assert agent.emitted == []


def test_a_very_fast_climb_opens_the_window_without_waiting_for_six_samples():
    # leak_numpy_function_memo.py on a fast day: ~230 MiB a second over a 2 s training; six
    # rising samples came after the training had ended: a finding with no line
    import tracemalloc

    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0])
    try:
        for _ in range(3):  # two climbs after the first sample: 2 x 56 MiB in 0.5 s
            _rising(doctor, agent, t, rss, mib_per_sample=56)
        assert doctor.window_open
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()


@pytest.mark.parametrize("sample_hz, mib_per_s, opens_within_s", [
    (4, 8, 4.0),  # the agent's default rate: 0.25 MiB a step at ~30 ms steps
    (20, 8, 4.0),  # --sample-hz 20: the rule reads the same
    (4, 3, 10.0),  # a slower leak climbs as surely over a longer run of rising points
])
def test_a_steady_climb_opens_the_window_at_any_sample_rate(sample_hz, mib_per_s, opens_within_s):
    # CI, 2026-12-01: leak_dict_cache.py (0.26 MiB a step) beside another TF run, its steps slower:
    # the rule asked 24 MiB over six samples, and at the agent's 4 Hz that is 1.5 s (16 MiB/s):
    # no window opened and the finding came without its line
    import tracemalloc

    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0])
    dt = 1.0 / sample_hz
    try:
        while not doctor.window_open and t[0] < 30:
            t[0] += dt
            agent.global_step += 1
            rss[0] += int(mib_per_s * dt * (1 << 20))
            list(doctor())
        # the growth beyond what the pipelines hold (64 MiB) comes first, then the rising run
        assert doctor.window_open and t[0] <= 64 / mib_per_s + opens_within_s, t[0]
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()


def test_a_climb_that_pauses_waits_for_a_new_run_of_rising_points():
    # RSS that stands still between two climbs is no steady leak: each climb is judged alone
    import tracemalloc

    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0])
    try:
        rss[0] += 200 << 20  # well beyond what the pipelines hold
        for i in range(40):  # 20 s at 2 Hz: 2 s climbing 4 MiB a point, 1 s still, again
            t[0] += 0.5
            agent.global_step += 10
            if i % 6 < 4:
                rss[0] += 4 << 20
            list(doctor())
            assert not doctor.window_open, i
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()


def test_a_climb_of_a_few_samples_below_the_fast_rate_waits_for_six():
    import tracemalloc

    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0])
    try:
        for _ in range(leak_doctor.RISE_SAMPLES):
            _rising(doctor, agent, t, rss, mib_per_sample=30)
        assert not doctor.window_open
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()


def _until_found(doctor, agent, t, rss, fill, limit_s: float) -> tuple[list, bool]:
    """Samples a window from its opening while ``fill`` keeps what a step keeps: (what it sent,
    whether tracemalloc ever ran)."""
    import tracemalloc

    for _ in range(leak_doctor.RISE_SAMPLES + 1):  # the leak under way: RSS climbs as fill keeps
        fill()
        _rising(doctor, agent, t, rss)
    assert doctor.window_open
    opened, traced, found = t[0], False, []
    while not found and t[0] - opened < limit_s:
        fill()
        found = _rising(doctor, agent, t, rss)
        traced = traced or tracemalloc.is_tracing()
    return found, traced


def test_a_line_the_light_window_names_alone_costs_no_tracemalloc(tmp_path, monkeypatch):
    # tracemalloc's window cost 1.5-2.7x a small step while open: when the containers' diff
    # names the script's line, the only one adding to that list, for most of what grew, that is
    # the answer, and tracemalloc never runs
    import tracemalloc

    leaky = _keeping_module(tmp_path, monkeypatch, "leaky_light", "saved_batches")
    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], script_dir=str(tmp_path))
    saved_batches: list = []
    try:
        found, traced = _until_found(doctor, agent, t, rss, lambda: leaky.keep(saved_batches, 15),
                                     2 * leak_doctor.WINDOW_S)
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert not traced
    (sites,) = found
    assert sites.sites[0] == "leaky_light.py:5" and sites.kinds[0] == "numpy"
    assert sites.grown_bytes[0] >= 0.5 * (sites.rss_grown_bytes or 0) > 0


@pytest.mark.parametrize("source, name", [
    (_CLOSURE, "closure"),
    (_TWO_LINES, "two lines"),
], ids=["closure", "two lines"])
def test_growth_no_one_line_explains_gets_tracemallocs_window(tmp_path, monkeypatch, source, name):
    import tracemalloc

    leaky = _leaky_module(tmp_path, monkeypatch, f"leaky_{name.replace(' ', '_')}", source, "history")
    keep = leaky.make_keeper()
    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], script_dir=str(tmp_path))
    try:
        found, traced = _until_found(doctor, agent, t, rss, lambda: keep(15), 3 * leak_doctor.WINDOW_S)
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert traced
    (sites,) = found
    line = next(i for i, text in enumerate(source.splitlines(), start=3) if "# 2 MiB a step" in text)
    assert sites.sites[0] == f"leaky_{name.replace(' ', '_')}.py:{line}", sites




_TWO_ENDS = ("def note(KEPT, x):\n"
             "    KEPT.append(float(x))\n"
             "def keep(KEPT, n):\n"
             "    for _ in range(n):\n"
             "        KEPT.append(np.ones(1 << 18))  # 2 MiB a step\n"
             "def keep_tensors(HELD, n):\n"
             "    import tensorflow as tf\n"
             "    for _ in range(n):\n"
             "        HELD.append(tf.ones((128, 128)))  # 64 KiB a step\n")


@pytest.mark.parametrize("end", ["the script ends", "a tf.function is traced", "a smaller line is left"])
def test_a_light_window_no_tracemalloc_can_follow_names_no_line_that_others_add_to_too(tmp_path, monkeypatch, end):
    """A light window cut short by the script's end, or whose tracemalloc window may not follow,
    sent the first line adding to the list: here ``note``'s, which does not grow it. Another line
    adds to the same name, so no line alone is the one to change: nothing is named (nor a smaller
    line left after it, which holds little of what grew)."""
    import tracemalloc

    import tensorflow  # noqa: F401  (loaded before the window opens: its tensor pass runs)

    name = "leaky_two_ends_" + "".join(c for c in end if c.isalpha())  # a module of its own per case
    leaky = _leaky_module(tmp_path, monkeypatch, name, _TWO_ENDS.replace("HELD", "held_tensors"), "appended_twice")
    agent, t, rss, traces = _Agent(), [0.0], [1 << 30], [0]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], traces=lambda: traces[0],
                                    script_dir=str(tmp_path))
    appended_twice: list = [np.ones(1) for _ in range(20)]
    held_tensors: list = []
    leaky.note(appended_twice, 1.0)
    found: list = []
    traced = False
    try:
        _window_open(doctor, agent, t, rss)
        leaky.keep(appended_twice, 20)
        if end == "a tf.function is traced":
            traces[0] += 1
            while doctor.window_open and t[0] < 20:
                leaky.keep(appended_twice, 15)
                found += _rising(doctor, agent, t, rss)
                traced = traced or tracemalloc.is_tracing()
        else:
            if end == "a smaller line is left":
                leaky.keep_tensors(held_tensors, 24)  # 1.5 MiB, by a line no other adds to that name
            agent.global_step += 20
            t[0] += 1.0
            rss[0] += 40 << 20
            doctor.close()
            found = agent.emitted
        traced = traced or tracemalloc.is_tracing()
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert not traced and not doctor.window_open
    assert found == [] and agent.emitted == [], found


def test_a_window_that_can_only_be_light_and_found_nothing_claims_no_native_memory(tmp_path, monkeypatch):
    """Where Python runs on TensorFlow's threads every window is light and none follows: one that
    found nothing sent its empty sites, which the monitor reads as "native memory" without
    tracemalloc's look."""
    import tracemalloc

    monkeypatch.setattr(leak_doctor, "_python_on_tf_threads", lambda: True)
    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], script_dir=str(tmp_path))
    found: list = []
    try:
        _window_open(doctor, agent, t, rss)
        while doctor.window_open and t[0] < 20:
            found += _rising(doctor, agent, t, rss)  # RSS climbs; nothing the script holds grows
        traced = tracemalloc.is_tracing()
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert not traced and not doctor.window_open
    assert found == [], found


@pytest.mark.parametrize("meanwhile", ["the script starts tracemalloc", "a tf.function is traced"])
def test_no_tracemalloc_window_follows_when_a_window_could_not_open(tmp_path, monkeypatch, meanwhile):
    # what _open asks of any window holds for the one after a light window too: the script's own
    # tracemalloc is left alone (a start would do nothing, our stop would end the script's), and
    # tracing under tracemalloc is ~7x slower
    import tracemalloc

    keep = _leaky_module(tmp_path, monkeypatch, "leaky_guarded", _CLOSURE, "kept_by_closure").make_keeper()
    agent, t, rss, traces = _Agent(), [0.0], [1 << 30], [0]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], traces=lambda: traces[0],
                                    script_dir=str(tmp_path))
    try:
        for _ in range(leak_doctor.RISE_SAMPLES + 1):
            keep(15)
            _rising(doctor, agent, t, rss)
        assert doctor.window_open and not tracemalloc.is_tracing()
        _rising(doctor, agent, t, rss)  # the light window's first pass
        if meanwhile == "the script starts tracemalloc":
            tracemalloc.start()
        else:
            traces[0] += 1
        found: list = []
        while doctor.window_open and t[0] < 20:
            keep(15)
            found += _rising(doctor, agent, t, rss)
        script_traces = tracemalloc.is_tracing()
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert found == [] and not doctor.window_open  # the closure's list has no name: nothing to send
    assert script_traces == (meanwhile == "the script starts tracemalloc")


def test_a_light_windows_line_stands_when_tracemallocs_window_sees_no_step(tmp_path, monkeypatch):
    # the light window named the one line that adds to the list, but RSS grew more than it
    # holds: tracemalloc's window follows; no step runs in it (an evaluation began), so what the
    # light window found is what is sent
    import tracemalloc

    leaky = _keeping_module(tmp_path, monkeypatch, "leaky_partial", "kept_partly", elements=1 << 16)  # 0.5 MiB
    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], script_dir=str(tmp_path))
    kept_partly: list = []
    traced = False
    try:
        for _ in range(leak_doctor.RISE_SAMPLES + 2):  # 30 MiB a sample of RSS, 7.5 MiB of it kept
            leaky.keep(kept_partly, 15)
            _rising(doctor, agent, t, rss)
        while not tracemalloc.is_tracing() and t[0] < 20:
            leaky.keep(kept_partly, 15)
            assert _rising(doctor, agent, t, rss) == []
        traced = tracemalloc.is_tracing()
        found: list = []
        while doctor.window_open and t[0] < 40:  # no step: the time goes by, RSS does not climb
            t[0] += 0.5
            found += doctor()
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert traced
    (sites,) = found
    assert sites.sites[0] == "leaky_partial.py:5" and sites.grown_bytes[0] < 0.5 * (sites.rss_grown_bytes or 0)


def test_the_agent_holds_its_leak_doctor_for_the_auto_profile(tmp_path):
    # the auto-profile reads agent.leak_doctor.window_open: without the reference it would capture
    # under a light window, and no test of its own would notice
    import tensorflow  # noqa: F401  (imported: the probes install at once)

    from tpuwatch.agent import post_import, probes
    from tpuwatch.agent.runtime import Agent

    agent = Agent(tmp_path, "t")
    patches = probes.install_all(agent, "t.py", ["t.py"], set())
    try:
        assert isinstance(agent.leak_doctor, leak_doctor.LeakDoctor)
        assert "leak_doctor" not in agent.disabled_probes
    finally:
        probes.uninstall(patches)
        post_import.cancel_all()
        agent.stop()


def test_only_the_scripts_own_folder_is_searched_for_other_lines(tmp_path, monkeypatch):
    # CI: in a process that had imported every test module (each outside the libraries), the
    # search for other lines adding to the same name went through all of them and gave up at its
    # cap: every light window was followed by tracemalloc's. A module from elsewhere that adds to a
    # list of the same name is not the script's
    import tracemalloc

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    leaky = _keeping_module(project, monkeypatch, "leaky_own", "batches_seen")
    _leaky_module(elsewhere, monkeypatch, "unrelated_helper",
                  "def note(KEPT, x):\n    KEPT.append(x)\n", "batches_seen")
    agent, t, rss = _Agent(), [0.0], [1 << 30]
    doctor = leak_doctor.LeakDoctor(agent, rss=lambda: rss[0], clock=lambda: t[0], script_dir=str(project))
    batches_seen: list = []
    try:
        found, traced = _until_found(doctor, agent, t, rss, lambda: leaky.keep(batches_seen, 15),
                                     2 * leak_doctor.WINDOW_S)
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    assert not traced
    (sites,) = found
    assert sites.sites[0] == "leaky_own.py:5"
