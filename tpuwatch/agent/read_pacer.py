"""When the step probe reads what lives in TensorFlow variables: each replica's loss and the in-graph
accumulator (input wait, examples, steps run).

Each read is a transfer per replica on a TPU, ~0.1 ms a replica on a CPU (0.3-0.9 ms right after a
step on a 2-core box), so reads are paced by *training* time (the step calls' time and their input
wait), not by the wall clock: a pause (evaluation, a checkpoint) does not make the next read due.
A run's first :data:`READ_ALL_FIRST` records are read more often, so that a short run's
diagnostics see its steps: every record while the reads so far cost at most :data:`READ_SHARE` of
the training since the first call (their time, measured: :meth:`ReadPacer.spent`, times
:data:`READ_COST_FACTOR`: what they slow the steps beside), so every one where a read is cheap next
to a step, and no more than that share where it is not. After them, a read is made
at most every :data:`LOSS_EVERY_S` of training, and no more often than keeps the reads within
:data:`STEADY_SHARE` of the training and within :data:`READ_STEP_S` a step on average, each read
counted at :data:`READ_COST_FACTOR` times its time there too (at long steps, but at least once
every :data:`MAX_PACE_S` of training and a step where a read costs under a third of a
millisecond). When training pauses, the
last step's losses, if its record went without them, are read if the wall clock says one is due.
No TensorFlow here: the step probe asks, and reads.
"""

from __future__ import annotations

#: Records whose losses (and in-graph input wait) are read whatever the sampling period: a short
#: run's diagnostics see every step.
READ_ALL_FIRST = 256


#: The most the reads of a run's first records may cost, as a share of its training time (the
#: first call, which traces, left out).
READ_SHARE = 0.01


#: What the first records' reads cost the training in all, over what the reads themselves took:
#: they slow the step calls beside them too, not only the one after a read. Measured on this
#: project's 2-core CPU box (the TF tutorial's loop, epochs of first records against epochs after
#: them): at 4 replicas ~0.20 ms of reads a record (0.29 ms a read, on 68 of 99 records) and the
#: calls 0.52 ms a record longer, ~3.6 times the reads' time in all; at 2 replicas ~2 times; plain
#: TensorFlow reading four replicas' losses after every step, 2.3 times; reading after every call
#: against the steady pace (bench/first_records.py's ``every``), 2.8 times at 4 replicas.
#: Counting each read at its time alone, the first records cost 1.04-1.06x at 2 and 4 replicas
#: (1.03x at 1). Budgeting each read with the next call's time over the calls that
#: followed none measured ~0 (the calls are slower throughout): a factor, 3, within what was
#: measured. Not measured on a TPU (where a read is a transfer, likely nearer 1: the reads there
#: are then rarer than they need be). The reads after the first records are budgeted (STEADY_SHARE,
#: READ_STEP_S) at this factor too: counted at their own time, a 0.33 ms read after the tiny 3.3 ms
#: step was made three times a second, ~3 µs a step of its own and ~10 µs in all. (Among the first
#: records, the reads beyond READ_SHARE's are paced at their own time: a short run's rules, the
#: replica skew's 16 reads in particular, need its steps read.)
READ_COST_FACTOR = 3.0


#: After a run's first records, reads cost at most this share of the training time: the least
#: training time between two reads is LOSS_EVERY_S, or a read's cost (times READ_COST_FACTOR)
#: over this share where that is longer (the tiny custom step here, ~0.33 ms a read after a
#: 3.3 ms step: one read a second, ~3 µs a step in all; a TPU host's ~0.1 ms a replica, 0.8 ms
#: for 8: one every 2.4 s, the factor being unmeasured there).
STEADY_SHARE = 0.001


#: After a run's first records, reads cost at most this much a training step on average: the
#: least training time between two reads is also a read's cost (times READ_COST_FACTOR) over
#: this, times the step time (where that is longer than STEADY_SHARE's pace: steps longer than
#: READ_STEP_S / STEADY_SHARE, 10 ms). A share of the training alone is over the 50 µs budget a
#: step at long steps (0.1 % of a 50 ms step is 50 µs): a 0.27 ms read (four replicas' losses and
#: the accumulator after a 27 ms step, this project's 2-core box) was made every ~10 steps, ~30 µs
#: a step of its own; now once a second of training (MAX_PACE_S), every ~37 steps.
READ_STEP_S = 10e-6


#: The most training time between two reads that READ_STEP_S may ask for (a read is made at the
#: first step that reaches it: at most this and a step apart; STEADY_SHARE asks for more only
#: where a read costs over 1/3 ms, 1 ms counted at READ_COST_FACTOR): the loss shown stays
#: within the dashboard's stale limit, and the ``input-bound`` rule's 30 s window holds the 20
#: reads of the in-graph wait it needs at steps up to ~0.5 s (a 0.3 ms read once a second is
#: 30 µs a step of its own at 100 ms steps); where reads are dearer, that rule reaches further
#: back for its 20.
MAX_PACE_S = 1.0


#: The least training time between two reads after a run's first READ_ALL_FIRST records: a 4 Hz
#: sample, the agent's default sampling rate. A read of every replica's loss and the accumulator
#: costs 0.3-0.9 ms on this project's 2-core CPU box right after a step (an eager op there costs
#: ~100 µs while tf.data refills), ~0.1 ms a replica of transfers on a TPU: at 10 Hz that was
#: ~100 µs a step at 20 ms steps. People read a number at 1-2 Hz; every step is still counted.
LOSS_EVERY_S = 0.25


def _loss_every_s() -> tuple[float, int]:
    """TPUWATCH_LOSS_EVERY_S: the least training time between two reads of the replicas' losses
    and the in-graph input wait, and how many first records are read regardless. Default: every
    record of the first READ_ALL_FIRST, then at most every LOSS_EVERY_S. Set, it applies from the
    first record (0 reads after every step call)."""
    from tpuwatch import settings

    raw = settings.LOSS_EVERY_S.get()
    if not raw:
        return LOSS_EVERY_S, READ_ALL_FIRST
    try:
        return max(0.0, float(raw)), 0
    except ValueError:
        return LOSS_EVERY_S, READ_ALL_FIRST


class ReadPacer:
    """Training time so far, and when the losses and the accumulator were last read (on the
    training thread only). Times are seconds: training time as :meth:`trained` adds it up, the
    wall clock as the probe's ``perf`` gives it."""

    def __init__(self, every_s: float, read_all_first: int, steady_share: float | None = None) -> None:
        self.every_s = every_s
        self.steady_share = steady_share  # None: every_s is the pace, whatever a read costs
        self._read_cost: float | None = None  # what a read costs, smoothed (from spent())
        self._step_s: float | None = None  # training time a step between two reads, smoothed
        self._mark: tuple[float, int | None] = (0.0, None)  # (training time, step) of the last read
        self.read_all_left = read_all_first  # records still read whatever the pace
        self.trained_s = 0.0
        self._first_s: float | None = None  # the first record's training time (its trace)
        self._spent_s = 0.0  # time the reads took so far
        self._loss_read_trained = float("-inf")
        self._loss_read_at = float("-inf")  # wall clock of the last loss read: pauses use it
        self._acc_read_trained = float("-inf")

    @classmethod
    def from_settings(cls) -> "ReadPacer":
        """The pace ``TPUWATCH_LOSS_EVERY_S`` asks for (see :func:`_loss_every_s`)."""
        every_s, first = _loss_every_s()
        return cls(every_s, first, STEADY_SHARE if first else None)

    @property
    def pace_s(self) -> float:
        """The least training time between two reads now: ``every_s``, or longer where the reads
        cost more than ``steady_share`` of it, or more than READ_STEP_S a step (up to MAX_PACE_S),
        each read counted at READ_COST_FACTOR times its own time once the first records are
        over (while they last, the share read_all leaves is read at this pace, each read at its
        own time: a short run's rules need its steps read)."""
        cost, share = self._read_cost, self.steady_share
        if cost is None or share is None:
            return self.every_s
        if self.read_all_left <= 0:  # after the first records: a read at what it costs in all
            cost *= READ_COST_FACTOR  # (during them, a short run's rules need the steps read)
        step_s = self._step_s
        per_step = min(cost * step_s / READ_STEP_S, MAX_PACE_S) if step_s is not None else 0.0
        return max(self.every_s, cost / share, per_step)

    @property
    def read_all(self) -> bool:
        """The next record is one of the run's first and the reads' budget allows: everything in
        it is read."""
        if self.read_all_left <= 0:
            return False
        first = self._first_s
        return first is None or READ_COST_FACTOR * self._spent_s <= READ_SHARE * (self.trained_s - first)

    def trained(self, seconds: float) -> float:
        """A step's ``seconds`` of training (its wait for its batch included); the total so far."""
        if self._first_s is None:
            self._first_s = seconds
        self.trained_s += seconds
        return self.trained_s

    def spent(self, seconds: float) -> None:
        """The reads of one record took ``seconds``. The first record's are not counted: its call
        traced, and its time is not in the budget either."""
        if self.trained_s != self._first_s:
            self._spent_s += seconds
            cost = self._read_cost
            self._read_cost = seconds if cost is None else cost + 0.2 * (seconds - cost)

    def recorded(self) -> None:
        """A record was made: one fewer of the first records left to read whatever the pace."""
        if self.read_all_left > 0:
            self.read_all_left -= 1

    def last_reads(self, acc: bool) -> tuple[float, float, float] | None:
        """``(losses read at, accumulator read at, pace)`` in training time, so that a caller can
        tell that no read is due exactly as :meth:`loss_due` and :meth:`acc_due` would (``trained -
        at < pace`` for both; the losses' time twice without ``acc``); None while the run's first
        records may all be read."""
        if self.read_all_left > 0:
            return None
        loss_at = self._loss_read_trained
        return loss_at, self._acc_read_trained if acc else loss_at, self.pace_s

    def loss_due(self, trained: float) -> bool:
        """The losses are to be read at training time ``trained`` (read_all aside)."""
        return trained - self._loss_read_trained >= self.pace_s

    def _measure(self, trained: float, step: int) -> None:
        """A read at training time ``trained`` after the run's ``step``-th step: the training time
        a step since the last read (of either), smoothed."""
        last_trained, last_step = self._mark
        self._mark = (trained, step)
        if last_step is not None and step > last_step and trained > last_trained:
            per = (trained - last_trained) / (step - last_step)
            step_s = self._step_s
            self._step_s = per if step_s is None else step_s + 0.2 * (per - step_s)

    def loss_read(self, trained: float, now: float, step: int) -> None:
        """The losses were read at training time ``trained``, wall clock ``now``, after the run's
        ``step``-th step."""
        self._measure(trained, step)
        self._loss_read_trained = trained
        self._loss_read_at = now

    def acc_due(self, trained: float) -> bool:
        """The accumulator is to be read at training time ``trained`` (read_all aside)."""
        return trained - self._acc_read_trained >= self.pace_s

    def acc_read(self, trained: float, step: int | None) -> None:
        """The accumulator was read at training time ``trained``, after the run's ``step``-th step
        (None: not known yet, a loop whose steps the read counts)."""
        if step is not None:
            self._measure(trained, step)
        self._acc_read_trained = trained

    def pause_read_due(self, now: float) -> bool:
        """Training paused at wall clock ``now``: a held-back loss may be read (at most one every
        ``every_s``)."""
        return now - self._loss_read_at >= self.every_s

    def paused_read(self, now: float) -> None:
        """A held-back loss was read at wall clock ``now``."""
        self._loss_read_at = now
