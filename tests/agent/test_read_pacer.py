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
            pacer.loss_read(trained, now=float(i))
            reads.append(i)
    # Records 0 and 1 whatever the pace; then every third 100 ms step (0.3 s >= 0.25 s of training).
    assert reads == [0, 1, 4, 7, 10]
    assert pacer.read_all_left == 0 and abs(pacer.trained_s - 1.2) < 1e-9


def test_a_pause_is_not_training_time():
    pacer = ReadPacer(every_s=0.25, read_all_first=0)
    trained = pacer.trained(0.1)
    assert pacer.loss_due(trained)  # never read yet
    pacer.loss_read(trained, now=100.0)
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
    pacer.acc_read(trained)
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
