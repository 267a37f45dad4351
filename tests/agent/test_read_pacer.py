"""The step probe's read pacer on its own (no TensorFlow): the first records are all read, then at
most one read every ``every_s`` of training; a pause reads a held-back loss by the wall clock."""

from __future__ import annotations

from tpuwatch.agent import read_pacer
from tpuwatch.agent.read_pacer import ReadPacer


def test_the_first_records_are_all_read_then_by_training_time():
    pacer = ReadPacer(every_s=0.25, read_all_first=2)
    reads = []
    for i in range(12):
        read_all = pacer.read_all
        trained = pacer.trained(0.1)  # a 100 ms step
        pacer.recorded()
        if read_all or pacer.loss_due(trained):
            pacer.loss_read(trained, now=float(i), step=i + 1)
            reads.append(i)
    # Records 0 and 1 whatever the pace; then every third 100 ms step (0.3 s >= 0.25 s of training).
    assert reads == [0, 1, 4, 7, 10]
    assert pacer.read_all_left == 0 and abs(pacer.trained_s - 1.2) < 1e-9


def test_a_pause_is_not_training_time():
    pacer = ReadPacer(every_s=0.25, read_all_first=0)
    trained = pacer.trained(0.1)
    assert pacer.loss_due(trained)  # never read yet
    pacer.loss_read(trained, now=100.0, step=1)
    # Ten wall-clock seconds of evaluation later, the next 0.1 s step is still not due...
    assert not pacer.loss_due(pacer.trained(0.1))
    # ...but a pause may read a held-back loss: the wall clock says so.
    assert not pacer.pause_read_due(100.1)
    assert pacer.pause_read_due(110.0)
    pacer.paused_read(110.0)
    assert not pacer.pause_read_due(110.2)


def test_the_accumulator_keeps_its_own_pace():
    pacer = ReadPacer(every_s=0.25, read_all_first=0)
    trained = pacer.trained(0.3)
    assert pacer.acc_due(trained) and pacer.loss_due(trained)
    pacer.acc_read(trained, step=1)
    assert not pacer.acc_due(trained) and pacer.loss_due(trained)


def test_the_setting_applies_from_the_first_record(monkeypatch):
    monkeypatch.setenv("TPUWATCH_LOSS_EVERY_S", "0")
    pacer = ReadPacer.from_settings()
    assert (pacer.every_s, pacer.read_all_left) == (0.0, 0)
    monkeypatch.setenv("TPUWATCH_LOSS_EVERY_S", "")
    pacer = ReadPacer.from_settings()
    assert (pacer.every_s, pacer.read_all_left) == (read_pacer.LOSS_EVERY_S, read_pacer.READ_ALL_FIRST)
    monkeypatch.setenv("TPUWATCH_LOSS_EVERY_S", "often")  # unreadable: the default
    assert ReadPacer.from_settings().every_s == read_pacer.LOSS_EVERY_S


def _first_records(step_s: float, read_s: float, records: int = 100) -> tuple[list[int], float]:
    """Which of a run's first records are read when a read costs ``read_s`` after a ``step_s``
    step (the first call, its trace, takes 3 s), and the reads' share of the steady training."""
    pacer = ReadPacer(every_s=0.25, read_all_first=256, steady_share=read_pacer.STEADY_SHARE)  # as from_settings
    reads, spent = [], 0.0
    for i in range(records):
        read_all = pacer.read_all
        trained = pacer.trained(3.0 if i == 0 else step_s)
        pacer.recorded()
        if read_all or pacer.loss_due(trained):
            pacer.loss_read(trained, now=float(i), step=i + 1)
            pacer.spent(read_s)
            spent += read_s if i else 0.0  # the first record's read is paid beside its trace
            reads.append(i)
    return reads, spent / (step_s * (records - 1))


def test_the_first_records_are_all_read_while_a_read_is_cheap_next_to_a_step():
    reads, _ = _first_records(step_s=0.100, read_s=0.0003)  # 0.3 % of a step: 0.9 % counted at READ_COST_FACTOR
    assert reads == list(range(100))


def test_the_first_records_cost_at_most_a_hundredth_of_the_training():
    """The TF tutorial's loop: ~13 ms steps, ~0.9 ms to read 4 replicas' losses and the
    accumulator right after one. Reading each of the first 256 records cost ~7 % of a short run.
    A read costs the training READ_COST_FACTOR times its own time (it slows the steps beside)."""
    reads, share = _first_records(step_s=0.013, read_s=0.0009)
    assert 0 in reads and len(reads) < 50  # the first record, then as the budget allows
    factor = read_pacer.READ_COST_FACTOR
    assert share * factor <= read_pacer.READ_SHARE + factor * 0.0009 / (0.013 * 99)  # at most one read over it
    # more often than the steady pace would (a 0.9 ms read once every 0.9 s of training): early answers
    assert len(reads) > 100 * 0.013 / (0.0009 / read_pacer.STEADY_SHARE) + 2


def test_a_first_records_read_counts_what_it_slows_the_steps_beside():
    """A 0.29 ms read after a 13.6 ms step (4 replicas' losses, the tutorial's loop here) is 2.1 %
    of the step by its own time: the first records were read on 68 of 99 records (~1 % by the
    reads' own time, 4-6 % slower in all). Counted at READ_COST_FACTOR times, on ~1 in 6."""
    reads, share = _first_records(step_s=0.0136, read_s=0.00029, records=256)
    assert share * read_pacer.READ_COST_FACTOR <= read_pacer.READ_SHARE * 1.1, share
    assert 256 * 0.12 <= len(reads) <= 256 * 0.25, len(reads)


def test_after_the_first_records_reads_cost_at_most_a_thousandth_of_the_training():
    """Counted at READ_COST_FACTOR times its time (what a read slows the steps beside), a read
    that costs 0.33 ms after a 3.3 ms step (the tiny custom step on a 2-core box) is made about
    once a second of training, not three times (~10 µs a step in all); a cheap one four times."""
    for read_s, expected_gap in ((0.00033, 0.99), (0.00005, read_pacer.LOSS_EVERY_S)):
        pacer = ReadPacer(every_s=read_pacer.LOSS_EVERY_S, read_all_first=0, steady_share=read_pacer.STEADY_SHARE)
        reads = []
        for i in range(4000):
            trained = pacer.trained(0.0033)
            pacer.recorded()
            if pacer.loss_due(trained):
                pacer.loss_read(trained, now=float(i), step=i + 1)
                pacer.spent(read_s)
                reads.append(trained)
        gaps = [b - a for a, b in zip(reads[2:], reads[3:])]  # once the cost is known
        assert abs(min(gaps) - expected_gap) < 0.0034, (read_s, min(gaps))
        assert max(gaps) < expected_gap + 0.0034


def test_a_pace_set_by_the_user_holds_whatever_a_read_costs(monkeypatch):
    monkeypatch.setenv("TPUWATCH_LOSS_EVERY_S", "0.25")
    pacer = ReadPacer.from_settings()
    pacer.trained(1.0)
    pacer.trained(0.007)
    pacer.spent(0.5)
    assert pacer.pace_s == 0.25


def _steady_reads(step_s: float, read_s: float, steps: int) -> list[float]:
    """The training times of the reads after a run's first records, ``step_s`` steps, each read
    costing ``read_s``."""
    pacer = ReadPacer(every_s=read_pacer.LOSS_EVERY_S, read_all_first=0, steady_share=read_pacer.STEADY_SHARE)
    reads = []
    for i in range(steps):
        trained = pacer.trained(step_s)
        pacer.recorded()
        if pacer.loss_due(trained):
            pacer.loss_read(trained, now=float(i), step=i + 1)
            pacer.spent(read_s)
            reads.append(trained)
    return reads


def test_at_long_steps_reads_cost_at_most_ten_microseconds_a_step():
    """A thousandth of the training is 27 µs a step at a 27 ms step, 100 µs at a 100 ms step: over
    the 50 µs budget with the rest of the agent. Four replicas' losses and the accumulator read in
    0.27 ms after a 27 ms step (this box) were read every ~10 steps, ~30 µs a step. Each read
    counts at READ_COST_FACTOR times its time; where that asks for more than MAX_PACE_S, the
    next test's once a second holds."""
    factor = read_pacer.READ_COST_FACTOR
    for step_s, read_s in ((0.027, 0.0001), (0.020, 0.00015)):
        pace_s = factor * read_s * step_s / read_pacer.READ_STEP_S
        assert read_pacer.LOSS_EVERY_S < pace_s < read_pacer.MAX_PACE_S
        reads = _steady_reads(step_s, read_s, 3000)
        gaps = [b - a for a, b in zip(reads[3:], reads[4:])]  # once the cost and step are known
        assert min(gaps) >= pace_s - 1e-9, (step_s, min(gaps))
        assert max(gaps) < pace_s + step_s + 1e-9


def test_at_long_steps_a_read_is_made_once_a_second_of_training_and_a_step():
    """A 0.3 ms read after a 150 ms step (the bundled sample's input-bound part), counted at
    READ_COST_FACTOR times its time, would wait 13.5 s of training for ten µs a step: the
    input-bound rule's 30 s window would hold 2 reads of the wait, not the 20 it needs, and the
    loss shown would lag as long. Once a second of training and a step holds both (30 µs a step
    of its own at 150 ms steps, 90 µs counted at the factor, under the thousandth's 150 µs); a
    read that costs more than a third of a millisecond, a millisecond so counted, keeps to the
    thousandth."""
    factor = read_pacer.READ_COST_FACTOR
    for step_s, read_s, pace_s in ((0.150, 0.0003, read_pacer.MAX_PACE_S), (0.5, 0.0003, read_pacer.MAX_PACE_S),
                                   (0.150, 0.00035, factor * 0.00035 / read_pacer.STEADY_SHARE),
                                   (1.0, 0.002, factor * 0.002 / read_pacer.STEADY_SHARE)):
        reads = _steady_reads(step_s, read_s, 400)
        gaps = [b - a for a, b in zip(reads[3:], reads[4:])]
        assert min(gaps) >= pace_s - 1e-9, (step_s, min(gaps))
        assert max(gaps) < pace_s + step_s + 1e-9, (step_s, max(gaps))
    assert 30.0 / (read_pacer.MAX_PACE_S + 0.150) >= 20


def test_the_step_time_comes_from_the_accumulators_reads_too():
    """A loop whose accumulator is read and whose losses never are (no loss found in its step)
    kept the thousandth's pace: ~27 µs a step at 27 ms steps. (A 0.1 ms read: the thousandth's
    pace, 0.3 s counted at READ_COST_FACTOR, is under the step-time pace, 0.81 s.)"""
    pacer = ReadPacer(every_s=read_pacer.LOSS_EVERY_S, read_all_first=0, steady_share=read_pacer.STEADY_SHARE)
    reads = []
    for i in range(3000):
        trained = pacer.trained(0.027)
        if pacer.acc_due(trained):
            pacer.acc_read(trained, step=i + 1)
            pacer.spent(0.0001)
            reads.append(trained)
    gaps = [b - a for a, b in zip(reads[3:], reads[4:])]
    step_pace = read_pacer.READ_COST_FACTOR * 0.0001 * 0.027 / read_pacer.READ_STEP_S
    assert step_pace > read_pacer.READ_COST_FACTOR * 0.0001 / read_pacer.STEADY_SHARE
    assert min(gaps) >= step_pace - 1e-9


def test_a_loops_accumulator_read_before_its_step_count_is_known_measures_no_step_time():
    """A loop inside the function counts its steps in the graph: the read that tells them gives no
    step number, and the next loss read measures from the one before."""
    pacer = ReadPacer(every_s=read_pacer.LOSS_EVERY_S, read_all_first=0, steady_share=read_pacer.STEADY_SHARE)
    pacer.loss_read(pacer.trained(1.0), now=0.0, step=100)
    pacer.acc_read(pacer.trained(1.0), step=None)
    pacer.loss_read(pacer.trained(0.0), now=1.0, step=200)
    assert abs(pacer._step_s - 0.01) < 1e-12


def test_at_the_tiny_step_the_share_of_the_training_sets_the_pace():
    """A 2.3 ms step, ~1 ms a read (3 ms counted at READ_COST_FACTOR): ten µs a step would read
    every 0.69 s; a thousandth of the training, every 3 s."""
    reads = _steady_reads(0.0023, 0.001, 6000)
    gaps = [b - a for a, b in zip(reads[3:], reads[4:])]
    assert abs(min(gaps) - read_pacer.READ_COST_FACTOR * 0.001 / read_pacer.STEADY_SHARE) < 0.0024


def test_during_the_first_records_a_read_beyond_their_share_is_paced_at_its_own_time():
    """A short run's rules need its steps read (the replica skew wants 16 reads over 50 steps): the
    first records' reads beyond READ_SHARE keep the pace a read's own time sets; after them each
    read counts at READ_COST_FACTOR times its time."""
    pacer = ReadPacer(every_s=read_pacer.LOSS_EVERY_S, read_all_first=256, steady_share=read_pacer.STEADY_SHARE)
    pacer.trained(1.0)  # the first call (its trace)
    for _ in range(10):
        pacer.trained(0.020)
        pacer.recorded()
        pacer.spent(0.0009)
    assert not pacer.read_all  # 9 ms of reads counted at 3x over 0.2 s of training: over the hundredth
    assert abs(pacer.pace_s - 0.0009 / read_pacer.STEADY_SHARE) < 1e-9
    pacer.read_all_left = 0
    assert abs(pacer.pace_s - read_pacer.READ_COST_FACTOR * 0.0009 / read_pacer.STEADY_SHARE) < 1e-9
