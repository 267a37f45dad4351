"""``tpuwatch report RUN``: what a run did, from its run directory.

:func:`build_model` reads ``run.json`` and streams the whole recording through a
:class:`~tpuwatch.monitor.monitor.Monitor` (the run state, the diagnostics engine, the step figures),
merging the engine's findings with any Finding messages recorded live, into one typed
:class:`~tpuwatch.console.report_model.Report`. :func:`render_text`, :func:`render_markdown` and
:func:`render_json` render that model; :func:`build_report` is its JSON-ready form (non-finite
floats become the strings "NaN"/"Infinity", as on the wire), which ``compare`` and
``run --baseline`` read::

    {"run": {...}, "summary": {...}, "pipelines": [...], "findings": [...], "ledger": {...}}

 ``tpuwatch ls`` lives in :mod:`tpuwatch.monitor.runs` (what each run is) and
:mod:`tpuwatch.console.run_list` (its table).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from tpuwatch import rundir, units
from tpuwatch.console.report_model import (
    CommandDone,
    DevicePeak,
    FindingRow,
    InputWait,
    KerasEpochLoss,
    Memory,
    ReplicaLoss,
    Report,
    Retraces,
    RunInfo,
    StrategyUse,
    Summary,
    WorkerRow,
    json_safe,
)
from tpuwatch.monitor.diagnostics.pipeline_doctor import pipeline_notes
from tpuwatch.monitor.group import WorkerDir, read_group, worker_dirs
from tpuwatch.monitor.ledger import as_dict as ledger_dict
from tpuwatch.monitor.ledger import note_of, teardown_lines
from tpuwatch.monitor.ledger import rows as ledger_rows
from tpuwatch.monitor.monitor import Monitor
from tpuwatch.monitor.recording import iter_recording, recording_problem
from tpuwatch.monitor.runs import run_alive
from tpuwatch.monitor.snapshot import RunSnapshot, keras_loss, mean_loss, worker_exit_codes
from tpuwatch.printable import one_line, printable
from tpuwatch.protocol import SEVERITY_RANK, Finding, Step
from tpuwatch.units import (
    UNKNOWN,
    fmt_duration,
    fmt_rate,
    fmt_seconds,
    function_label,
    percent,
)


class ReportError(ValueError):
    """The run directory cannot be reported on (one line: what is wrong)."""


#: Files a finding's evidence points at (taken by the agent by itself), listed under it.
EVIDENCE_FILES = (("stacks", "stacks"), ("profile", "profile_path"))


def _finding_row(f: Finding) -> FindingRow:
    return FindingRow(rule=f.rule, severity=f.severity, message=f.message, evidence=dict(f.evidence),
                      advice=f.advice, first_step=f.first_step, last_step=f.last_step, worker=f.worker, t=f.t)


def build_report(run_dir: str | Path, on_step: Callable[[Step], None] | None = None) -> dict[str, Any]:
    """The report of one run directory as JSON-ready values (:meth:`Report.as_json`)."""
    return build_model(run_dir, on_step).as_json()


def build_model(run_dir: str | Path, on_step: Callable[[Step], None] | None = None) -> Report:
    """The report of one run directory. Raises :class:`ReportError` when it holds no run.
    ``on_step`` sees every step record the run's figures are computed from (``compare``
    keeps the step times and losses).

    A multi-worker group directory (``tpuwatch run --workers N``) is reported merged: every
    worker's recording goes into one state, each message tagged with its worker, and the report
    gains a ``workers`` section (each worker's end, steps, step time, input wait, memory)."""
    run_dir = Path(run_dir)
    events = run_dir / rundir.EVENTS
    if not run_dir.is_dir():
        raise ReportError(f"no run directory at {run_dir}")
    meta = rundir.read_meta(run_dir)
    workers = worker_dirs(run_dir)
    if workers is not None:
        return _build_group_report(run_dir, meta, workers, on_step)
    problem = recording_problem(run_dir, missing_ok=True)
    if problem:
        raise ReportError(problem)
    if not events.is_file() and not meta:
        if (run_dir / rundir.META).exists():
            raise ReportError(f"{run_dir / rundir.META} is unreadable or not valid JSON and there is no "
                              f"{rundir.EVENTS}: nothing to report")
        raise ReportError(f"{run_dir} is not a tpuwatch run (no {rundir.EVENTS}, no {rundir.META})")

    monitor = _monitor(on_step)
    state = monitor.state
    stats = None
    if events.is_file():
        messages, reader = iter_recording(events)
        for m in messages:
            monitor.take(m)
        stats = reader.stats
        state.note_read_stats(malformed=stats.malformed, unknown=stats.unknown,
                              truncated_tail=stats.truncated_tail)

    running = not state.ended and run_alive(meta)
    if not state.ended and not running and state.last_message_t is not None:
        state.set_lost("the process is gone and left no exit record")
    return _finish_report(monitor, meta, run_dir, running, stats)[0]


def _monitor(on_step: Callable[[Step], None] | None, steps_of: str | None = None) -> Monitor:
    """The run as the report reads it: its rules judge it by its own clock (its newest message)."""
    monitor = Monitor(lambda: monitor.state.last_message_t or 0.0, on_step=on_step, steps_of=steps_of)
    return monitor


def _finish_report(monitor: Monitor, meta: dict[str, Any], run_dir: Path, running: bool,
                   stats: Any) -> tuple[Report, RunSnapshot]:
    """The report, and the one snapshot it was made from."""
    state, times = monitor.state, monitor.steps
    assert times is not None  # the report's monitor keeps the step figures
    # A finished run is described as of its last message; a live one as of now.
    now = time.time() if running or state.last_message_t is None else state.last_message_t
    end_t = state.last_message_t or 0.0
    monitor.evaluate(end_t, force=True)
    for f in monitor.feed.engine.findings():  # current ones too, not only those new at the end
        state.add_finding(f, f.worker)
    snap = monitor.snapshot(now)

    p50, p95 = times.percentiles()
    steps_per_s = times.steps_per_s()
    findings = sorted(snap.findings, key=lambda f: (-SEVERITY_RANK.get(f.severity, -1),
                                                    f.first_step if f.first_step is not None
                                                    else 1 << 62, f.rule))
    report = Report(
        run=_run_section(snap, meta, run_dir, running),
        summary=_summary_section(snap, p50, p95, steps_per_s, times.examples_per_s(), stats),
        pipelines=_pipelines(snap),
        findings=[_finding_row(f) for f in findings],
        ledger=_ledger_section(snap),
    )
    return report, snap


def _ledger_section(snap: RunSnapshot) -> dict[str, Any] | None:
    """Where the wall time went (monitor/ledger.py), with the finding that explains each bucket."""
    lg = snap.ledger
    if lg is None:
        return None
    out = ledger_dict(lg)
    rules = {f.rule for f in snap.findings if f.severity != "info"}
    out["rows"] = [{"bucket": r.bucket, "label": r.label, "seconds": round(r.seconds, 6),
                    "share": round(r.share, 6), "finding": r.rule} for r in ledger_rows(lg, rules, all_buckets=True)]
    return out


def _teardown_lines(teardowns: Any) -> list[str]:
    """What each long iterator teardown was, with the stack line (monitor/ledger.py)."""
    notes = [note_of(d) for d in teardowns if isinstance(d, dict)]
    return teardown_lines(notes)


def _pipelines(snap: RunSnapshot) -> list[dict[str, Any]]:
    """The pipeline map: each dataset the training iterated, its stages from the source on."""
    return [{"worker": worker, "dataset": p.dataset, "consumer": p.consumer, "elements": p.elements,
             "stages": [{"stage": st, "site": site, "settings": settings, "code": code,
                         "holds_bytes": held, "added_by": by}
                        for st, site, settings, code, held, by in zip(p.stages, p.sites, p.settings, p.code,
                                                                      p.holds_bytes, p.added_by)],
             "consumer_site": p.consumer_site, "tf_prefetch": p.tf_prefetch, "notes": pipeline_notes(p),
             "use": p.use}
            for worker, p in snap.pipelines]


def pipeline_lines(p: dict[str, Any], same: Sequence[dict[str, Any]] = ()) -> list[str]:
    """One line per stage: ``train.py:41  .map(decode)  num_parallel_calls=AUTOTUNE``, under a
    head naming the dataset, what it is for and how it is consumed; ``same``: the datasets with
    these very stages (``p`` among them), named together under one head."""
    group = list(same) or [p]
    numbers = [q["dataset"] for q in group]
    if len(numbers) == 1:
        name = f"dataset {numbers[0]}"
    elif numbers == list(range(numbers[0], numbers[0] + len(numbers))) and len(numbers) > 3:
        name = f"datasets {numbers[0]}-{numbers[-1]}"
    else:
        name = "datasets " + ", ".join(map(str, numbers))
    uses = [q.get("use") or "" for q in group]
    if len(set(uses)) == 1 and len(uses) > 1:
        what = f"{uses[0]} x{len(uses)}" if uses[0] else ""
    else:
        what = ", ".join(u or "?" for u in uses) if any(uses) else ""
    counts = [q.get("elements") for q in group]
    per_pass = ""
    if all(counts):
        shown = counts if len(set(counts)) > 1 else counts[:1]
        per_pass = f", {', '.join(f'{c:,}' for c in shown)} batch{'es' if shown != [1] else ''} per pass"
    out = [f"{name} ({what + '; ' if what else ''}{p['consumer']}){per_pass}"]
    prev = ""
    for st in p["stages"]:
        extra = [x for x in (f"added by {st['added_by']}" if st["added_by"] else "",
                             f"holds up to {units.size(st['holds_bytes'])}" if st["holds_bytes"] > 0 else "") if x]
        code = st["code"] if st["code"] != prev and not st["added_by"] else ""
        prev = st["code"]
        out.append(f"  {st['site'] or '?':<28} .{st['stage']}({st['settings']})"
                   + (f" [{'; '.join(extra)}]" if extra else "") + (f"   {code}" if code else ""))
    out += [f"  ({note})" for note in p.get("notes", ())]
    return out


def pipeline_groups(pipelines: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The datasets with the same stages, settings, lines and notes, each group in the order its
    first dataset came: a script's train, validation and test datasets made by one function, or
    Keras' own pipeline for each ``predict`` call, are one block, not one each."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in pipelines:
        key = json.dumps([p.get("worker"), p["consumer"], p["stages"], p.get("consumer_site"), p.get("notes")],
                         sort_keys=True, default=str)
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def _build_group_report(run_dir: Path, meta: dict[str, Any], workers: list[WorkerDir],
                        on_step: Callable[[Step], None] | None = None) -> Report:
    tagged, stats = read_group(workers)
    if not tagged and not meta:
        raise ReportError(f"{run_dir} holds no recording of any worker")
    # every worker runs the same global steps: the figures are the first worker's
    monitor = _monitor(on_step, steps_of=workers[0].name if workers else "")
    state = monitor.state
    for name, m in tagged:
        monitor.take(m, name)
    state.note_read_stats(malformed=stats.malformed, unknown=stats.unknown,
                          truncated_tail=stats.truncated_tail)
    alive = {w.name: run_alive(rundir.read_meta(w.path)) for w in workers}
    running = any(alive.values()) and not state.ended
    for view in monitor.snapshot(state.last_message_t or time.time()).workers:
        if view.status not in ("finished", "crashed") and not alive.get(view.name, False):
            state.set_lost("the process is gone and left no exit record", worker=view.name)
    report, snap = _finish_report(monitor, meta, run_dir, running, stats)
    if running:  # the workers of a live run as of their last message, as a finished one's
        snap = monitor.snapshot(state.last_message_t or time.time())
    run = replace(report.run, id=meta.get("run_id") or run_dir.name)
    if isinstance(meta.get("exit_code"), int) and not running:
        # The launcher knows which worker failed first (the others' ends follow from it).
        run = replace(run, exit_code=meta["exit_code"])
    # Each worker's Step.loss is the mean over its own replicas; the job's loss (what
    # strategy.reduce(MEAN) gives every worker) is the mean over all replicas of one step.
    summary = report.summary
    rows = summary.replica_losses
    if rows and len({r.step for r in rows}) == 1 and all(r.finite for r in rows):
        summary = replace(summary, last_loss=mean_loss([r.loss for r in rows]))  # the one mean
    return replace(report, run=run, summary=summary, workers=_workers_section(snap, workers))


def _workers_section(snap: RunSnapshot, workers: list[WorkerDir]) -> list[WorkerRow]:
    by_name = {v.name: v for v in snap.workers}
    codes = worker_exit_codes(snap)
    out = []
    for w in workers:
        v = by_name.get(w.name)
        wmeta = rundir.read_meta(w.path)
        rss = [h.rss_bytes for h in snap.host_memory if h.worker == w.name]
        out.append(WorkerRow(
            name=w.name,
            index=w.index,
            dir=str(w.path),
            host=v.host if v else wmeta.get("host", ""),
            pid=v.pid if v else wmeta.get("child_pid"),
            status=v.status if v else ("crashed" if wmeta.get("exit_code") not in (None, 0) else "waiting"),
            exit_code=codes.get(w.name, wmeta.get("exit_code")),
            stopped=bool(wmeta.get("stopped")),
            steps=v.step if v else 0,
            step_time_p50_s=v.step_p50_s if v else None,
            input_wait_share=v.input_wait_frac if v else None,
            rss_bytes=rss[0] if rss else None,
            replicas=[r.index for r in snap.replica_losses if r.worker == w.name],
        ))
    return out


def _run_section(snap: RunSnapshot, meta: dict[str, Any], run_dir: Path,
                 running: bool) -> RunInfo:
    start = snap.started_t if snap.started_t is not None else meta.get("started")
    end = snap.ended_t
    if end is None and not running:
        end = meta.get("ended") if isinstance(meta.get("ended"), (int, float)) else snap.last_message_t
    duration = (end - start) if isinstance(start, (int, float)) and end is not None else None
    status = snap.status
    if not running and status == "waiting" and meta.get("state") in ("finished", "stopped", "crashed"):
        status = meta["state"]  # no recording, but the launcher saw the end
    exit_code = snap.exit_code if snap.exit_code is not None else meta.get("exit_code")
    return RunInfo(
        id=snap.run_id or meta.get("run_id") or run_dir.name,
        dir=str(run_dir),
        script=snap.script or meta.get("script", ""),
        argv=list(snap.argv) or list(meta.get("argv", [])),
        host=snap.host or meta.get("host", ""),
        status=status,
        strategy=snap.strategy,
        strategies=[StrategyUse(strategy=name, replicas=replicas, training_steps=steps)
                    for name, replicas, steps in snap.strategies],
        replicas=snap.replicas,
        device_kind=snap.device_kind,
        devices=list(snap.devices),
        num_workers=snap.num_workers,
        tf_version=snap.tf_version,
        keras_version=snap.keras_version,
        mixed_precision=snap.mixed_precision,
        global_batch_size=snap.global_batch_size,
        start=start,
        end=end,
        duration_s=duration,
        exit_code=exit_code,
        exit_signal=snap.exit_signal,
        exception=snap.exception,
        traceback=snap.exception_traceback,
        lost_reason=snap.lost_reason,
    )


def _summary_section(snap: RunSnapshot, p50: float | None, p95: float | None,
                     steps_per_s: float | None, examples_per_s: float | None, stats: Any) -> Summary:
    return Summary(
        steps=snap.step,
        step_records=snap.steps_total,
        total_steps=snap.total_steps,
        step_time_p50_s=p50,
        step_time_p95_s=p95,
        steps_per_s=steps_per_s,
        examples_per_s=examples_per_s,
        input_wait_share=snap.input_wait_frac_total,
        # the input-bound rule's own figures over every eligible step (docs/diagnostics.md)
        input_wait=None if snap.input_run is None else InputWait(
            share=snap.input_run.share,
            wait_per_step_s=snap.input_run.wait_per_step_s,
            step_time_s=snap.input_run.step_time_s,
            steps=snap.input_run.steps,
            verdict=snap.input_run.verdict,
        ),
        last_loss=snap.loss,
        # the epoch as Keras prints it ("Epoch 3/3"), as the text says it
        keras_epoch_loss=None if (kl := keras_loss(snap)) is None else KerasEpochLoss(
            epoch=kl.epoch + 1, loss=kl.loss, note=kl.note),
        retraces=[
            # the function's own name (its display label says "(evaluation)"; the flag is here)
            Retraces(name=f.name, traces=f.traces, instances=f.instances,
                     last_change=f.last_change, last_step=f.last_step, evaluation=f.evaluation)
            for f in snap.functions
        ],
        memory=Memory(
            devices=[
                DevicePeak(worker=w, device=d, peak_bytes=peak,
                           limit_bytes=next((m.limit_bytes for m in snap.device_memory
                                             if m.worker == w and m.device == d), None))
                for w, d, peak in snap.device_peaks
            ],
            host_rss_peak_bytes=snap.host_rss_peak_bytes,
            tpu_metrics_note=snap.tpu_metrics_note,
        ),
        replica_losses=[
            ReplicaLoss(index=r.index, device=r.device, worker=r.worker, loss=r.loss,
                        deviation=r.deviation, finite=r.finite, step=r.step)
            for r in snap.replica_losses
        ],
        commands=[
            CommandDone(id=c.id, action=c.action, status=c.status, message=c.message,
                        details=dict(c.details), t=c.t)
            for c in snap.commands
        ],
        truncated_tail=snap.truncated_tail,
        recording_gaps=list(snap.recording_gaps),
        dropped_bytes=stats.dropped_bytes if stats else 0,
        malformed_lines=snap.malformed,
        unknown_lines=snap.unknown,
        messages=snap.messages,
        disabled_probes=dict(snap.disabled_probes),
    )


# --- rendering -------------------------------------------------------------------------------


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity"):
        return float(v.lower().replace("infinity", "inf"))
    return None


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return UNKNOWN
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):  # a crafted 1e300, NaN: no date
        return UNKNOWN


def _lines(report: Report) -> list[tuple[str, str, list[str]]]:
    """(section title, key/value rows as "key\tvalue", extra lines) shared by both renderers."""
    run, s, findings = report.run, report.summary, report.findings
    outcome = run.status
    if run.exit_code is not None:
        outcome += f" (exit {run.exit_code})"
    # Names from the run are one line each: a newline or a tab in them would break the rows.
    rows_run = [
        f"run\t{one_line(run.id)}",
        f"script\t{one_line(' '.join(run.argv) or run.script)}",
        f"host\t{one_line(run.host or UNKNOWN)}",
        f"status\t{outcome}",
        f"strategy\t{run.strategy or UNKNOWN}"
        + (f", {units.replicas(run.replicas)} on {run.device_kind}" if run.replicas else ""),
        *(["strategies\t" + "; ".join(f"{u.strategy} ({u.replicas} replicas): {u.training_steps:,} "
                                         "training steps" for u in run.strategies)]
          if len(run.strategies) > 1 else []),
        f"TensorFlow\t{run.tf_version or UNKNOWN}",
        f"started\t{_when(run.start)}",
        f"ended\t{_when(run.end)}",
        f"duration\t{fmt_duration(_num(run.duration_s))}",
    ]
    if run.exception:
        first = next((ln for ln in run.exception.splitlines() if ln.strip()), "")
        rows_run.append(f"exception\t{first}")
    if run.lost_reason:
        rows_run.append(f"lost\t{one_line(run.lost_reason)}")
    rows_sum = [
        f"steps\t{s.steps:,}" + (f" of {s.total_steps:,}" if s.total_steps else ""),
        f"step time\tp50 {fmt_seconds(_num(s.step_time_p50_s))}, "
        f"p95 {fmt_seconds(_num(s.step_time_p95_s))}",
        f"speed\t{fmt_rate(_num(s.steps_per_s))}"
        + (f", {fmt_rate(_num(s.examples_per_s), 'examples/s')}" if s.examples_per_s is not None else "")
        + " (after the first step)",
        f"input wait\t{units.percent(_num(s.input_wait_share))} of step time"
        + (f" ({s.input_wait.verdict})" if s.input_wait else ""),
        f"loss\t{units.loss(_num(s.last_loss))} (last step, the mean over replicas)",
    ]
    if s.keras_epoch_loss:
        k = s.keras_epoch_loss
        rows_sum.append(f"Keras loss\tepoch {k.epoch} mean {units.keras_value(_num(k.loss))}"
                        + (f" ({k.note})" if k.note else ""))
    mem = s.memory
    if mem.devices:
        top = max(mem.devices, key=lambda d: d.peak_bytes)
        rows_sum.append(f"device peak\t{units.size(top.peak_bytes)} on {top.device}"
                        + (f" of {units.size(top.limit_bytes)}" if top.limit_bytes else ""))
    rows_sum.append(f"host RSS peak\t{units.size(mem.host_rss_peak_bytes)}")
    if mem.tpu_metrics_note:
        rows_sum.append(f"TPU metrics\t{mem.tpu_metrics_note}")
    health = []
    if s.truncated_tail:
        health.append(f"last line cut ({s.dropped_bytes} bytes dropped)")
    if s.malformed_lines:
        health.append(f"{s.malformed_lines} malformed lines")
    if s.unknown_lines:
        health.append(f"{s.unknown_lines} lines of unknown kind")
    health.extend(s.recording_gaps)
    rows_sum.append(f"recording\t{'; '.join(health) or 'complete'}")
    if s.disabled_probes:
        rows_sum.append("disabled probes\t" + ", ".join(
            f"{k} ({v})" for k, v in sorted(s.disabled_probes.items())))
    traces = [f"{function_label(r.name, r.evaluation)}: {r.traces} trace(s), {r.instances} object(s)"
              + (f"; last change {r.last_change}" if r.last_change else "")
              for r in s.retraces]
    losses = [f"replica {r.index} ({(r.worker + ' ') if report.workers else ''}"
              f"{r.device or '?'}): {units.loss(_num(r.loss))}"
              + ("" if r.finite else "  NON-FINITE")
              for r in s.replica_losses]
    out: list[tuple[str, str, list[str]]] = [("Run", "\n".join(rows_run), []), ("Summary", "\n".join(rows_sum), [])]
    if report.workers:
        out.append(("Workers", "", [_worker_line(w) for w in report.workers]))
    if traces:
        out.append(("Functions", "", traces))
    pipes = [line for same in pipeline_groups(json_safe(report.pipelines)) for line in pipeline_lines(same[0], same)]
    if pipes:
        out.append(("Input pipeline", "", pipes))
    if losses:
        out.append(("Replica losses (last step)", "", losses))
    lg = json_safe(report.ledger)
    if lg and lg.get("wall_s"):
        goodput = lg.get("goodput")
        head = (f"goodput {100 * goodput:.1f}% of {fmt_duration(_num(lg['wall_s']))} wall time"
                if goodput is not None else f"wall time {fmt_duration(_num(lg['wall_s']))}")
        if lg.get("ideal_step_s") is not None:
            head += f" (ideal step {fmt_seconds(_num(lg['ideal_step_s']))}, {lg['steps']:,} steps)"
        shown = [r for r in lg["rows"] if abs(r["share"]) >= 0.0005 or r["bucket"] == "training"]
        per_worker = [
            f"worker {name}: goodput {100 * w['goodput']:.1f}% of {fmt_duration(_num(w['wall_s']))}; "
            + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(w["buckets_s"].items(), key=lambda kv: -kv[1])[:3])
            for name, w in (lg.get("workers") or {}).items() if w.get("goodput") is not None]
        out.append(("Goodput", "", [head] + [
            f"{r['label']:<20}{r['seconds']:>10.2f} s {100 * r['share']:>6.1f}%"
            + (f"  -> finding {r['finding']}" if r["finding"] else "") for r in shown] + per_worker
            + _teardown_lines(lg.get("teardowns") or ())))
    if s.commands:
        out.append(("Commands", "", [command_line(json_safe(asdict(c))) for c in s.commands]))
    out.append(("Findings", "", [] if findings else ["none"]))
    if run.traceback:
        out.append(("Traceback", "", run.traceback.rstrip().splitlines()))
    return out


def command_line(c: dict[str, Any]) -> str:
    """``checkpoint done at step 150: checkpoint saved at step 150 -> /runs/x/checkpoints/ckpt-1``:
    what was asked, how it ended, and where its result is when the message does not say."""
    details = c.get("details") or {}
    step = details.get("step")
    path = details.get("path")
    message = one_line(str(c.get("message") or ""))
    line = f"{_when(c.get('t'))}  {c['action']} {c['status']}"
    if isinstance(step, int) and not isinstance(step, bool) and f"step {step}" not in message:
        line += f" at step {step:,}"
    if message:
        line += f": {message}"
    if isinstance(path, str) and path and path not in message:
        line += f" -> {one_line(path)}"
    return line


def _worker_line(w: WorkerRow) -> str:
    state = w.status
    if w.exit_code is not None and state in ("finished", "stopped", "crashed"):
        state += f" (exit {w.exit_code}{', stopped' if w.stopped else ''})"
    return (f"{w.name} on {w.host or UNKNOWN} pid {w.pid or UNKNOWN}: {state}; {w.steps:,} steps, "
            f"step p50 {fmt_seconds(_num(w.step_time_p50_s))}, input wait "
            f"{percent(_num(w.input_wait_share))}, RSS {units.size(_num(w.rss_bytes))}, "
            f"replicas {','.join(map(str, w.replicas)) or UNKNOWN}")


def render_text(report: Report) -> str:
    """Plain text for a terminal (control characters from the run shown escaped)."""
    parts: list[str] = []
    for title, rows, extra in _lines(report):
        parts.append(title)
        for row in rows.splitlines():
            k, _, v = row.partition("\t")
            parts.append(f"  {k:<16}{v}")
        for line in extra:
            parts.append(f"  {line}")
        if title == "Findings":
            for f in report.findings:
                where = ""
                if f.first_step is not None:
                    where = f" (steps {f.first_step}..{f.last_step})" \
                        if f.last_step not in (None, f.first_step) else f" (step {f.first_step})"
                parts.append(f"  [{f.severity}] {f.rule}{where}")
                parts.append(f"      {f.message}")
                if f.advice:
                    parts.append(f"      advice: {f.advice}")
                evidence = json_safe(f.evidence)
                for label, key in EVIDENCE_FILES:
                    if evidence.get(key):
                        parts.append(f"      {label}: {evidence[key]}")
        parts.append("")
    return printable("\n".join(parts).rstrip() + "\n")


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fence(lines: list[str]) -> str:
    """A code fence longer than any run of backticks in ``lines`` (CommonMark closes a block only
    on a fence at least as long as the opening one)."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)


def render_markdown(report: Report) -> str:
    """GitHub-flavoured Markdown (tables), e.g. for an issue or a pull request; control
    characters from the run shown escaped (it is printed to a terminal as often as pasted)."""
    parts = [f"# tpuwatch report: {report.run.id}", ""]
    for title, rows, extra in _lines(report):
        parts.append(f"## {title}")
        parts.append("")
        if rows:
            parts += ["| | |", "|---|---|"]
            for row in rows.splitlines():
                k, _, v = row.partition("\t")
                parts.append(f"| {_md_escape(k)} | {_md_escape(v)} |")
            parts.append("")
        if title == "Traceback":
            fence = _fence(extra)
            parts += [fence, *extra, fence, ""]
            continue
        for line in extra:
            parts.append(f"- {line}" if line != "none" else "None.")
        if title == "Findings":
            for f in report.findings:
                steps = ""
                if f.first_step is not None:
                    last_finite = f.evidence.get("last_finite_step")  # loss-nonfinite between two reads
                    steps = (f" — steps {last_finite + 1}-{f.first_step}" if isinstance(last_finite, int)
                             else f" — from step {f.first_step}")
                parts.append(f"### {f.severity.upper()}: {f.rule}{steps}")
                parts.append("")
                parts.append(f.message)
                parts.append("")
                if f.advice:
                    parts.append(f"**Advice:** {f.advice}")
                    parts.append("")
                if f.evidence:
                    parts.append("Evidence: " + ", ".join(
                        f"`{k}={v}`" for k, v in json_safe(f.evidence).items()))
                    parts.append("")
        if extra:
            parts.append("")
    return printable("\n".join(parts).rstrip() + "\n")


def render_json(report: Report) -> str:
    return json.dumps(report.as_json(), indent=2, allow_nan=False)


