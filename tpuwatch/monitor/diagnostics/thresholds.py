"""Every number the diagnostics rules decide with, with its default and the reason for it.

Pass overrides to :class:`~tpuwatch.monitor.diagnostics.Engine` as keyword arguments
(``Engine(input_warning_frac=0.3)``) or as a whole ``Thresholds(...)``. The rationale for each
default is also in ``docs/diagnostics.md``; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from tpuwatch import figures


@dataclass(frozen=True)
class Thresholds:
    # --- shared step windows -------------------------------------------------------------
    #: Step records kept per worker for windowed statistics (bounded memory: ~100 B each).
    window_records: int = 1024
    #: Records at the start of each worker that never count: the first calls trace and compile
    #: (seconds each) and Keras may trace a second time for the first evaluation.
    warmup_records: int = 5
    #: Records skipped after a retrace or an epoch boundary (a new iterator fills its shuffle
    #: buffer, a retrace compiles): one-off slow steps that are not the steady state.
    boundary_skip_records: int = 2
    #: Windowed rules are re-checked every this many step records, inside ``apply``, so a
    #: replayed recording finds the same episodes that a live viewer would have. At most the
    #: shortest window (``skew_window_steps``) so every step lies in some checked window.
    check_every_records: int = 512

    # --- input-bound ---------------------------------------------------------------------
    #: xprof's input-pipeline verdict: >= 5 % of step time waiting is "moderately", >= 20 %
    #: "highly" input-bound (``tpuwatch.figures``: the agent's automatic profile starts at 5 %).
    input_info_frac: float = figures.INPUT_INFO_FRAC
    input_warning_frac: float = figures.INPUT_WARNING_FRAC
    #: Mean wait per step below this is noise, whatever its share: timing a fetch from a ready
    #: prefetch buffer costs tens of microseconds. Kept far below a step's usual wait: a TPU
    #: step of 2-5 ms that waits 3 ms for its batch is input-bound, and so is a custom loop's
    #: eager fetch of a distributed batch (2-3 ms, time the step waits; the advice moves it
    #: into the compiled step).
    input_min_wait_s: float = figures.INPUT_MIN_WAIT_S
    #: Minimum evidence: eligible steps (the worst one left out) that measured their wait. A
    #: share over 20 steps is already stable to a few percent; seconds of step time say nothing
    #: more (a 100-step run asking "am I input-bound?" must get its answer).
    input_min_records: int = 20
    #: The live verdict's window: the eligible records of the last 30 s (at most the telemetry
    #: window, at least ``input_min_records`` + 1). Short enough that a pipeline that slowed
    #: down a minute ago shows its real share now; about the step-time panel's 200 records at
    #: 150 ms steps. Windowed rules are also re-checked every this many seconds of step time,
    #: so a replayed recording sees every window a live viewer saw.
    input_recent_s: float = 30.0

    # --- retrace-storm / function-recreated ------------------------------------------------
    #: Re-traces of existing objects allowed per object (``traces - instances`` up to
    #: ``instances``): Keras and custom loops retrace once for the last partial batch; with
    #: ``reduce_retracing`` the relaxed trace then covers every later shape.
    retrace_allowed_per_instance: int = 1
    #: Extra traces beyond that allowance that make a storm (warning) / a severe one (critical).
    retrace_warning_excess: int = 3
    retrace_critical_excess: int = 30
    #: Keras makes two objects named ``multi_step_on_iterator`` (train, test) per compile, so
    #: re-compiling a few times is legitimate; a tf.function built inside a loop passes 10
    #: within 10 iterations, so a higher bar costs almost no detection delay.
    recreated_warning_instances: int = 10
    recreated_critical_instances: int = 100

    # --- host-memory-growth --------------------------------------------------------------
    #: RSS samples are reduced to one point per bucket; the window is the latest points.
    rss_bucket_s: float = 5.0
    rss_window_points: int = 120  # 10 minutes of 5 s buckets
    #: Ignored at the start: imports, graph building, allocator pools, shuffle buffers.
    rss_warmup_s: float = 60.0
    #: With Keras epochs, memory that only grows during the first epoch is dataset.cache()
    #: filling; wait for the first epoch to end unless it lasts longer than this.
    rss_first_epoch_wait_s: float = 600.0
    #: The trend must span this long ("over minutes", not a burst).
    rss_min_span_s: float = 120.0
    rss_min_points: int = 12
    #: Theil-Sen slope and total growth over the window that count as a leak.
    rss_warning_mb_per_min: float = 10.0
    rss_min_growth_mb: float = 50.0
    #: Share of point pairs that increase (Kendall-like): a steady climb, not a step up.
    rss_min_increasing_pairs: float = 0.7
    #: Critical when at this slope the available host memory is gone within this long.
    rss_critical_exhaust_s: float = 1800.0
    #: The fit against steps (short runs): RSS at every host sample with the step it was at,
    #: after the first steps (allocator pools, the first traces) and, with Keras epochs, after
    #: the first epoch (dataset.cache() fills during epoch 0). Growth with every step over 50+
    #: steps and 6+ samples is evidence whatever the seconds: a leak of MiB per step.
    rss_warmup_steps: int = 10
    rss_min_span_steps: int = 50
    #: The step fit's growth floor, above the time fit's: seconds of a run can climb steadily
    #: while allocator arenas and autotuned buffers warm up (+50 MB over 638 steps, 10 s, every
    #: sample higher, with no leak in the script), where minutes level off. Leaks planted in short
    #: runs grow 300-900 MB; a slower one is the time fit's once the run has minutes. Growth
    #: between the two floors that would exhaust the host's memory within
    #: ``rss_critical_exhaust_s`` is reported all the same (critical).
    rss_min_step_growth_mb: float = 100.0
    rss_min_step_points: int = 6
    rss_step_points: int = 240  # bounded: thinned by half when full

    # --- host-bound ----------------------------------------------------------------------
    #: The goodput ledger's *host between steps* as a share of the training time (the wall time
    #: less *starting* and *finishing*) that makes a warning: a fifth of the time in the
    #: script's Python between steps is time the accelerator sits idle, as xprof's "highly"
    #: input-bound is a fifth of the step waiting.
    host_warning_frac: float = 0.20
    #: Minimum evidence: samples of the training thread taken between steps (20 a second: half
    #: a second of host time gives ~10; the share is the ledger's, the samples only find the
    #: line), and seconds of host time between steps (1 s while the agent sampled 4 times a
    #: second: a 300-step fit spending 0.98-1.75 s between steps, 30-42 % of its training, got
    #: the finding in some runs and not in others).
    host_min_samples: int = 4
    host_min_s: float = 0.5
    #: Share of those samples, at least, that a frame of the script's was on: below it the time
    #: is Keras' or TensorFlow's own between steps, with no line of the script's to change.
    host_min_script_frac: float = 0.5

    # --- device-memory-headroom ----------------------------------------------------------
    device_warning_frac: float = 0.90
    device_critical_frac: float = 0.98

    # --- replica-loss-skew ---------------------------------------------------------------
    #: Steps with every replica's loss (aligned across workers) kept; the steps of the run those
    #: reads must span (first to last), and the reads required, a quarter of them in each half of
    #: the span. The agent reads a short run's losses on some steps only where a read is dear next
    #: to a step (within a hundredth of the training, a read counted at three times its time: a few
    #: of the 80 steps of a planted 6 ms step here), and at most every 0.25 s of training after its
    #: first records: a gap is judged on the steps that were read, spread over 50 of the run's.
    #: 16 reads: z >= 5 over 15 degrees of freedom alone passes a replica's noise about 8 times in
    #: 100,000 a check; with the gap's floors and its same sign, no synthetic run of 10 or 50 %
    #: noise read 20 times gets a finding (tests/diagnostics/test_diag_loss.py; none either at 6
    #: reads, nor at 100 % noise, in 400 such runs measured once).
    skew_window_steps: int = 512
    skew_min_steps: int = 50
    skew_min_reads: int = 16
    #: The mean gap to the other replicas' median must beat all three: absolute, relative to
    #: the loss scale, and its own standard error (a z-score over time, not over 3 peers).
    skew_min_abs_gap: float = 0.01
    skew_min_rel_gap: float = 0.10
    skew_min_z: float = 5.0
    #: Share of steps on which the gap has the same sign: persistent, not a few outliers.
    skew_min_same_sign: float = 0.8
    #: Before a non-finite loss: a replica whose loss is this many times the others' median
    #: on the last finite steps is named as the origin (however few steps the run has).
    skew_origin_ratio: float = 10.0
    #: Finite steps kept per worker to look back from the first non-finite loss.
    skew_origin_lookback: int = 64

    # --- stall ---------------------------------------------------------------------------
    #: Live floor: a gap still going on is a stall only after this long (or 20 x the median
    #: interval, whichever is longer) -- a live alarm must not fire on a pause about to end.
    stall_min_s: float = 60.0
    stall_median_factor: float = 20.0
    #: Cadence limit: a gap of this many p95 step intervals (at least ``stall_gap_min_s``) is
    #: a stall by the run's own measure. It judges gaps that ended (the steps resumed) when it
    #: is below the live limit, so a 1 ms-step loop that hung 40 s is named in the report.
    #: 300 x p95 is thousands of median intervals.
    stall_p95_factor: float = 300.0
    stall_gap_min_s: float = 10.0
    #: Long gaps remembered per worker for the finding's evidence (the longest are kept).
    stall_max_gaps: int = 8
    #: A gap at an epoch boundary (validation, checkpoints) gets this much before the first
    #: boundary gap was measured, then 3x the longest boundary gap seen.
    stall_boundary_min_s: float = 300.0
    stall_boundary_factor: float = 3.0
    #: A stall this many times the threshold is critical.
    stall_critical_factor: float = 10.0

    # --- step-time-jitter ----------------------------------------------------------------
    jitter_min_records: int = 100
    jitter_min_window_s: float = 5.0
    jitter_info_ratio: float = 2.0  # p95 / p50
    jitter_warning_ratio: float = 4.0
    #: p95 - p50 must also exceed this: a few ms of OS noise on a 5 ms CPU step is not jitter.
    jitter_min_spread_s: float = 0.020
    #: Rising trend: median of the latest ``jitter_min_records`` eligible records vs the median of
    #: the first ones after warm-up.
    trend_info_ratio: float = 1.5
    trend_warning_ratio: float = 3.0
    trend_min_rise_s: float = 0.020

    # --- TPU configuration ---------------------------------------------------------------
    #: The MXU is 128 wide; XLA pads the batch dimension to a multiple of 8 at least.
    tpu_batch_multiple: int = 128
    tpu_batch_min_multiple: int = 8

    # --- straggler-host ------------------------------------------------------------------
    straggler_min_records: int = 30
    straggler_mad_factor: float = 3.0
    #: MAD is floored at this share of the median so identical workers do not make any
    #: difference an outlier.
    straggler_min_mad_frac: float = 0.05
    #: The excess over the others must be at least this, absolute and relative to step time.
    straggler_min_excess_s: float = 0.005
    straggler_min_excess_frac: float = 0.10
    #: With exactly two workers there is no median to stand out from: the slower one must be
    #: this many times the faster.
    straggler_pair_ratio: float = 1.5

    @classmethod
    def with_overrides(cls, base: "Thresholds | None" = None, **overrides: float) -> "Thresholds":
        base = base or cls()
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown diagnostics threshold(s): {', '.join(unknown)}")
        return cls(**{**{n: getattr(base, n) for n in names}, **overrides})
