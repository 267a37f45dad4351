"""``stall`` and ``step-time-jitter``: whether steps keep coming, and how regularly."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tpuwatch.figures import quantile
from tpuwatch.protocol import SEVERITY_RANK, Finding, Message, Severity, StackDump, Step
from tpuwatch.units import finding_duration, finding_ms

from .robust_stats import median, sig
from .rule import Rule
from .telemetry import Telemetry, Worker
from .thresholds import Thresholds


@dataclass(frozen=True)
class StallLimit:
    seconds: float
    why: str  # which bound set it


class Stall(Rule):
    """A gap between step records far beyond the run's own cadence.

    Two limits. A gap still going on (live) is a stall after max(60 s, 20 x the median interval
    between records): a viewer must not alarm on a pause about to end. A gap that ended (the
    next step record arrived) is judged by the run's own cadence, max(10 s, 300 x the p95
    interval) when that is less: a 1 ms-step loop that hung 40 s is a stall whatever the live
    floor says.
    Gaps at epoch boundaries (validation, checkpoints) get a larger, learned allowance; after
    the last planned step (Config.total_steps) the script is finishing, not stalled.

    A gap is judged by its phases (the agent's ``Phase`` messages): what counts against the limit
    is its longest stretch with nothing progressing. A checkpoint save or a new iterator over a
    distributed dataset progress while they last; TensorFlow deleting an iterator (the agent's
    ``Teardown``, which the ledger books as *teardown*) or a trace for up to 300 s after it
    began; an evaluation while its calls keep coming (an evaluation whose calls stop is quiet,
    so it can stall); host time between steps is quiet. A recording without phases is judged by
    the whole gap, as before.

    "Lives": the agent's sampler keeps sending samples (then the gap is measured up to the
    latest message, on the agent's clock, so a replay or a remote viewer with a skewed clock
    sees the same gap), or, without samples, no exit was seen (measured up to ``now``). A run
    killed by a signal while stalled keeps its stall. Every long gap is listed in the
    evidence with the step before it and its length.
    """

    id = "stall"
    observes = (Step,)

    def __init__(self, th: Thresholds) -> None:
        super().__init__(th)
        #: worker -> long gaps that ended: (step before, seconds, step after, (start, seconds) of
        #: its longest stretch with nothing progressing)
        self.gaps: dict[str, list[tuple[int, float, int, tuple[float, float]]]] = {}

    def limit(self, w: Worker, tel: Telemetry, live: bool, spe: int | None = -1,
              step: int | None = None) -> StallLimit | None:
        """The stall threshold for a gap after step ``step`` of ``w`` (default: its newest;
        None: no stall). ``live``: the gap is still going on (the live floor applies). ``spe``:
        the run's steps per epoch when the caller has it (-1: read it here)."""
        th = self.th
        if step is None:
            step = w.step
        total = tel.config.get("total_steps")
        if isinstance(total, int) and total > 0 and step >= total:
            return None
        limit = StallLimit(th.stall_min_s, "live minimum")
        if len(w.intervals) >= 5:
            med = median(w.intervals)
            if th.stall_median_factor * med > limit.seconds:
                limit = StallLimit(th.stall_median_factor * med,
                                   f"{th.stall_median_factor:g} x median step interval")
            if not live:
                # a gap that ended is judged by the run's own cadence (never more strictly
                # than 10 s, never more leniently than the live limit)
                p95 = quantile(sorted(w.intervals), 0.95)
                cadence = max(th.stall_gap_min_s, th.stall_p95_factor * p95)
                if cadence < limit.seconds:
                    limit = StallLimit(cadence, f"{th.stall_p95_factor:g} x p95 step interval "
                                                f"({finding_ms(p95)}), at least {th.stall_gap_min_s:g} s")
        if spe == -1:
            spe = tel.steps_per_epoch()
        if w.boundary_since_step or (spe and step % spe == 0):
            if w.longest_boundary_gap_s > 0:
                b = StallLimit(th.stall_boundary_factor * w.longest_boundary_gap_s,
                               f"{th.stall_boundary_factor:g} x longest epoch-boundary gap")
            else:
                b = StallLimit(th.stall_boundary_min_s, "epoch boundary allowance")
            if b.seconds > limit.seconds:
                limit = b
        return limit

    def observe(self, msg: Message, w: Worker, tel: Telemetry) -> None:
        # called before the windows take the step in: w.prev_step is the step before it
        prev = w.prev_step
        if prev is None:
            return
        gap = msg.t - prev.t  # type: ignore[attr-defined]
        if gap <= self.th.stall_gap_min_s:
            return  # the fast path: below the smallest possible limit
        span = w.quiet_span(msg.t)  # type: ignore[attr-defined]
        quiet = span[1]
        limit = self.limit(w, tel, live=False, step=prev.step)
        seen = self._found.get(w.name)
        was_ongoing = (seen is not None and seen.evidence.get("ongoing") == 1
                       and seen.evidence.get("last_step") == prev.step)
        if limit is not None and (quiet >= limit.seconds or was_ongoing):
            # an episode once reported stays reported, whatever the cadence says when it ends
            gaps = self.gaps.setdefault(w.name, [])
            gaps.append((prev.step, gap, msg.step, span))  # type: ignore[attr-defined]
            if len(gaps) > self.th.stall_max_gaps:  # keep the longest, in step order
                gaps.remove(min(gaps, key=lambda g: g[1]))
            self._record(w, prev, gap, limit, ongoing=False, resumed_at=msg.step, quiet=quiet,  # type: ignore
                         resumed=msg)  # type: ignore[arg-type]
            self._name_missing_workers(tel)

    def current(self, tel: Telemetry, now: float) -> dict[str, Finding]:
        spe = tel.steps_per_epoch()  # once: it looks at every worker, and a pod has a thousand
        for w in tel.step_workers():
            last = w.last_step
            if last is None:
                continue
            if w.ended:
                ex = w.exit
                killed = ex is not None and (ex.signal is not None or ex.exit_code >= 128)
                if not killed:
                    self._finished_after_last_step(w)
                    continue
                end = ex.t if ex is not None else now  # killed: ex is there
            else:
                end = w.last_t if w.samples_seen and w.last_t else now
            gap = end - last.t
            if gap <= self.th.stall_gap_min_s:
                continue
            quiet = w.quiet_s(end)
            limit = self.limit(w, tel, live=not w.ended, spe=spe)
            if limit is not None and quiet >= limit.seconds:
                self._record(w, last, gap, limit, ongoing=not w.ended, resumed_at=None, quiet=quiet)
        self._name_missing_workers(tel)
        return self._found

    def episodes(self, worker: str, tel: Telemetry | None = None, now: float | None = None
                 ) -> list[tuple[float, float]]:
        """(start, end) unix times of the stretches with nothing progressing in ``worker``'s stall
        episodes that ended, and in the one going on (up to ``now``) if its finding says so: the
        goodput ledger's *stalled* time."""
        out = [(start, start + quiet) for _, _, _, (start, quiet) in self.gaps.get(worker, [])]
        f = self._found.get(worker)
        if f is not None and f.evidence.get("ongoing") == 1 and tel is not None:
            w = tel.workers.get(worker)
            if w is not None and w.last_step_t is not None:
                end = now if now is not None else (w.last_t or w.last_step_t)
                start, quiet = w.quiet_span(end)
                out.append((start, start + quiet))
        return out

    def _finished_after_last_step(self, w: Worker) -> None:
        """A live stall after the last step that ended with the script finishing cleanly was
        the script's own end (saving, TF destroying a distributed iterator, which can take
        minutes at exit): say so as an info, in place of the warning seen while it lasted."""
        f = self._found.get(w.name)
        ex = w.exit
        if (f is None or ex is None or ex.exit_code != 0 or f.severity == "info"
                or not f.evidence.get("ongoing") or f.evidence.get("last_step") != w.step):
            return
        gap = ex.t - (w.last_step_t or ex.t)
        self._found[w.name] = replace(
            f, severity="info", t=ex.t,
            message=(f"the script took {finding_duration(gap)} to finish after its last step "
                     f"({w.step}), then exited cleanly"),
            advice=("Nothing to fix in training. If the wait at the end matters: TF can take "
                    "minutes destroying a live distributed iterator at exit (break out of "
                    "`for x in dist_dataset` early and delete the iterator, or iterate a "
                    "finite dataset to its end); a final save or evaluation also shows here"),
            evidence={**f.evidence, "gap_s": sig(gap, 2), "ongoing": 0, "finished_cleanly": 1})

    def _record(self, w: Worker, after: Step, gap: float, limit: StallLimit, *, ongoing: bool,
                resumed_at: int | None, quiet: float | None = None, resumed: Step | None = None) -> None:
        """A gap of ``gap`` seconds after the step record ``after`` of ``w`` (``resumed``: the
        step record that ended it)."""
        th = self.th
        severity: Severity = "critical" if gap >= th.stall_critical_factor * limit.seconds else "warning"
        if ongoing:
            state = "still no step (the process is alive)"
        elif resumed_at is not None:
            state = f"resumed at step {resumed_at}"
        else:
            state = "then the process was killed"
        evidence: dict[str, float | int | str] = {
            "last_step": after.step,
            "gap_s": sig(gap, 2),
            "limit_s": sig(limit.seconds, 2),
            "limit_reason": limit.why,
            "ongoing": int(ongoing),
        }
        if w.phase is not None and w.phase.phase:
            evidence["phase"] = w.phase.phase
        if quiet is not None and quiet < gap - 0.5:
            evidence["quiet_s"] = sig(quiet, 2)
            state += (f"; {finding_duration(gap - quiet)} of it in evaluations, saves, new iterators, "
                      f"iterator teardowns or traces that progressed, {finding_duration(quiet)} "
                      "with nothing progressing")
        gaps = self.gaps.get(w.name, [])
        if gaps:
            evidence["long_gaps"] = len(gaps)
            evidence["gaps"] = "; ".join(f"after step {a}: {finding_duration(g)}" for a, g, _, _ in gaps)
        others = f" ({len(gaps)} long gaps in all: {evidence['gaps']})" if len(gaps) > 1 else ""
        kept = self._found.get(w.name)
        if kept is not None and SEVERITY_RANK[kept.severity] > SEVERITY_RANK[severity] and gaps:
            # a worse episode stays the headline; this one still joins its list (every episode
            # stays in the report)
            head = kept.message.split(" (", 1)[0] if "long gaps in all" in kept.message else kept.message
            self._found[w.name] = replace(
                kept, message=f"{head} ({len(gaps)} long gaps in all: {evidence['gaps']})",
                evidence={**kept.evidence, "long_gaps": len(gaps), "gaps": evidence["gaps"]})
            return
        what, advice = self._what_stalled(w, after, gap, resumed, evidence)
        self._keep(w.name, Finding(
            t=after.t + gap, rule=self.id, severity=severity,
            message=(f"stall: no step for {finding_duration(gap)} after step {after.step} "
                     f"(limit {finding_duration(limit.seconds)}); {state}{what}{others}"),
            advice=advice,
            evidence=evidence,
            first_step=after.step, last_step=resumed_at if resumed_at is not None else after.step,
            worker=w.name,
        ))


    def _what_stalled(self, w: Worker, after: Step, gap: float, resumed: Step | None,
                      evidence: dict[str, float | int | str]) -> tuple[str, str]:
        """(the message's clause, the advice) for what stopped: the input pipeline (the step that
        ended the gap waited for its input most of it, or the stacks show the wait), the script's
        own Python (the line, from the stacks the agent took), or the step itself (TensorFlow's
        native code: a collective, with several workers). Evidence from the stacks goes into
        ``evidence``."""
        dump = next((d for d in reversed(w.stall_stacks) if d.step == after.step), None)
        waited = None
        if resumed is not None and resumed.input_wait_s is not None:
            waited = resumed.input_wait_s * max(1, resumed.steps)
        if dump is not None:
            evidence["stacks"] = dump.path
            if dump.headline:
                evidence["waiting_at"] = dump.headline
            if dump.input_line:
                evidence["input_line"] = dump.input_line
        stalled_in = dump.stalled_in if dump is not None else ""
        if waited is not None and waited >= 0.5 * gap:
            stalled_in = "input"
            evidence["input_wait_s"] = sig(waited, 2)
        if stalled_in:
            evidence["stalled_in"] = stalled_in
        taken = f" (stacks the agent took {finding_duration(dump.gap_s)} into it: {dump.path})" if (
            dump is not None and dump.gap_s is not None) else ""
        if stalled_in == "input":
            where = self._input_where(w, dump)
            waited_s = f": the step waited {finding_duration(waited)} for its batch" if waited is not None else ""
            return (f"; the input pipeline stopped{waited_s}{where}",
                    f"The input pipeline stopped delivering batches after step {after.step}{where}{taken}. "
                    "Look at what that stage waits for (a file or network read, a lock, a queue fed by "
                    "another process); the training itself was waiting, not hung")
        if dump is not None and stalled_in == "script":
            return (f"; the training thread was {dump.headline}",
                    f"The script's own Python held the training thread after step {after.step}: "
                    f"{dump.headline}{taken}. Fix or bound that wait (a timeout, a check that the "
                    "other side is alive); TensorFlow was idle")
        if dump is not None and stalled_in == "step":
            return (f"; the training thread was {dump.headline}",
                    f"The step called after step {after.step} never finished: {dump.headline}{taken}. "
                    "With several workers, a collective waits for a worker that has not arrived (see "
                    "the other workers' stall findings: the one not in the step is the cause); with one, "
                    "a step this long is a hung device or an in-graph input fetch that waits")
        if dump is not None and dump.headline:
            return (f"; the training thread was {dump.headline}",
                    f"Training stopped making progress after step {after.step}: {dump.headline}{taken}")
        return ("", f"Training stopped making progress after step {after.step}: take a stack "
                    "dump (the dashboard's stack-dump key, or the stack_dump command) to see where "
                    "every thread waits - a hung collective or a dead worker in multi-worker "
                    "runs, a blocked input pipeline (a generator waiting on I/O or a lock), or "
                    "a deadlock in user code")

    @staticmethod
    def _input_where(w: Worker, dump: StackDump | None) -> str:
        """Where the pipeline stopped, as far as the stacks and the pipeline map know."""
        if dump is not None and dump.input_line:
            file = dump.input_line.split(":", 1)[0]
            stage = ""
            for p in reversed(w.pipelines):
                for api, site in zip(p.stages, p.sites):
                    if api in ("from_generator", "py_function", "numpy_function", "map") and site.startswith(file):
                        stage = f" (its `{api}` stage, made at {site})"
                        break
                if stage:
                    break
            return f", at {dump.input_line}{stage}"
        if w.pipelines:
            p = w.pipelines[-1]
            if p.stages and p.sites and p.sites[0]:
                return f"; its source stage is `{p.stages[0]}`, made at {p.sites[0]}"
        return ""

    def _name_missing_workers(self, tel: Telemetry) -> None:
        """With several workers stalled together, those waiting inside the step (a collective)
        wait for the ones that are not: say which worker has not arrived, and its line."""
        found = [f for f in self._found.values() if f.worker and f.severity != "info"]
        if len(found) < 2:
            return
        waiting = [f for f in found if f.evidence.get("stalled_in") == "step"]
        absent = [f for f in found if f.evidence.get("stalled_in") in ("script", "input", "tensorflow")]
        if not waiting or not absent:
            return

        def span(f: Finding) -> tuple[float, float]:
            gap = f.evidence.get("gap_s", 0.0)
            return f.t - (gap if isinstance(gap, (int, float)) else 0.0), f.t

        for f in waiting:
            start, end = span(f)
            late = [a for a in absent if span(a)[0] < end and start < span(a)[1]]
            if not late:
                continue
            names = "; ".join(f"worker {a.worker} {a.evidence.get('waiting_at', '')}".rstrip() for a in late)
            if f.evidence.get("not_arrived") == names:
                continue
            self._found[f.worker] = replace(
                f, message=f"{f.message}; it waits for {names}",
                advice=(f"This worker waits in the step's collective for a worker that has not arrived: "
                        f"{names}. Fix that worker's wait; this one is only waiting for it"),
                evidence={**f.evidence, "not_arrived": names})
        for a in absent:
            start, end = span(a)
            peers = [f.worker for f in waiting if span(f)[0] < end and start < span(f)[1]]
            if peers and a.evidence.get("others_wait") != ", ".join(peers):
                self._found[a.worker] = replace(
                    a, message=f"{a.message}; the other workers ({', '.join(peers)}) wait for it in the step",
                    evidence={**a.evidence, "others_wait": ", ".join(peers)})


class StepTimeJitter(Rule):
    """Irregular (p95/p50) or rising (latest vs first window) step times, per step function.

    Only eligible records count: warm-up, the records right after a retrace and the first
    records of an epoch are left out, so tracing and iterator restarts are not jitter.
    """

    id = "step-time-jitter"

    def check(self, tel: Telemetry) -> None:
        for w in tel.step_workers():
            by_fn: dict[str, list[tuple[Any, ...]]] = {}
            for r in w.window:
                if not r[6]:  # not a step of an automatic capture (the profiler slowed it)
                    by_fn.setdefault(r[5], []).append(r)
            for fn, recs in by_fn.items():
                self._check_fn(w, fn, recs)

    def _check_fn(self, w: Worker, fn: str, recs: list[tuple[Any, ...]]) -> None:
        th = self.th
        if len(recs) < th.jitter_min_records:
            return
        times = sorted(r[2] for r in recs)
        if sum(times) < th.jitter_min_window_s:
            return
        p50, p95 = quantile(times, 0.5), quantile(times, 0.95)
        label = f"'{fn}'" if fn else "the step function"
        advice = ("Find what makes some steps slow: input waits (see input-bound; prefetch), "
                  "host contention (other processes, too few CPU cores for tf.data), retraces "
                  "(see retrace-storm), Python garbage collection (gc.freeze() after setup), "
                  "or periodic work in callbacks (logging, checkpoints) every few steps")
        ratio = p95 / p50 if p50 > 0 else 0.0
        if ratio >= th.jitter_info_ratio and p95 - p50 >= th.jitter_min_spread_s:
            severity: Severity = "warning" if ratio >= th.jitter_warning_ratio else "info"
            self._keep(f"{w.name}|{fn}|jitter", Finding(
                t=recs[-1][1], rule=self.id, severity=severity,
                message=(f"irregular step time in {label}: p95 {finding_ms(p95)} is "
                         f"{ratio:.2g}x the median {finding_ms(p50)}"),
                advice=advice,
                evidence={
                    "function": fn,
                    "p50_ms": sig(p50 * 1000, 3),
                    "p95_ms": sig(p95 * 1000, 3),
                    "p95_over_p50": sig(ratio, 2),
                    "records": len(recs),
                    "info_threshold_ratio": th.jitter_info_ratio,
                },
                first_step=recs[0][0], last_step=recs[-1][0], worker=w.name,
            ))
        # rising trend: the latest records against the first ones after warm-up (fixed once
        # seen, so every check, live or in a report, compares with the same baseline); needs a
        # latest window that does not overlap the baseline window
        first = w.first_times.get(fn)
        if w.eligible < 3 * th.jitter_min_records or first is None or len(first) < th.jitter_min_records:
            return
        base = quantile(sorted(first), 0.5)
        latest = sorted(r[2] for r in recs[-th.jitter_min_records:])
        cur = quantile(latest, 0.5)
        rise = cur / base if base > 0 else 0.0
        if rise >= th.trend_info_ratio and cur - base >= th.trend_min_rise_s:
            severity = "warning" if rise >= th.trend_warning_ratio else "info"
            self._keep(f"{w.name}|{fn}|trend", Finding(
                t=recs[-1][1], rule=self.id, severity=severity,
                message=(f"step time of {label} is rising: median {finding_ms(cur)} now vs "
                         f"{finding_ms(base)} after warm-up ({rise:.2g}x)"),
                advice=advice + "; a steady rise often means growing Python state per step "
                                "(see host-memory-growth) or a filling cache/queue",
                evidence={
                    "function": fn,
                    # its own identity beside the spread finding of the same function (the run
                    # state keys findings by rule, worker and subject)
                    "subject": f"{fn} trend",
                    "median_now_ms": sig(cur * 1000, 3),
                    "median_start_ms": sig(base * 1000, 3),
                    "rise_ratio": sig(rise, 2),
                    "info_threshold_ratio": th.trend_info_ratio,
                },
                first_step=recs[-th.jitter_min_records][0], last_step=recs[-1][0], worker=w.name,
            ))
