"""What ``tpuwatch run --headless`` prints: a progress line every few seconds, one line per new
diagnostics finding, and a summary at the end.

``follow`` tails the run's recording (it never talks to the agent's socket), so it shows the same
numbers a dashboard or ``tpuwatch report`` would. Output goes to stderr by default, leaving the
terminal's stdout to the script's own output when the launcher mirrors it. Every line goes
through :func:`~tpuwatch.printable.printable` (names, messages and exception text come from the
run); the script's own output, mirrored, stays as the script wrote it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

from tpuwatch import rundir, units
from tpuwatch.monitor.baseline import Baseline, deltas
from tpuwatch.monitor.diskspace import full_note
from tpuwatch.monitor.ledger import goodput_line, phase_text
from tpuwatch.monitor.ledger import rows as ledger_rows
from tpuwatch.monitor.monitor import Monitor
from tpuwatch.monitor.recording import RecordingReader, append
from tpuwatch.monitor.snapshot import (
    LAST_STEP,
    RunSnapshot,
    keras_loss,
    training_retraces,
    worker_exit_codes,
    worker_status_text,
)
from tpuwatch.monitor.stats import RunSteps
from tpuwatch.printable import one_line, printable
from tpuwatch.protocol import DISK_FULL_SOURCE, OUTPUT_SOURCE, Event, Finding
from tpuwatch.sources.file_source import FileSource
from tpuwatch.sources.source import RecordingSource, Tagged
from tpuwatch.units import (
    UNKNOWN,
    fmt_duration,
    fmt_rate,
    fmt_seconds,
    percent,
)

#: Phases whose progress line is repeated while they last (their duration moves).
BUSY_PHASES = ("evaluating", "checkpointing", "iterator", "compiling")


def _loss_range(snap: RunSnapshot) -> str:
    """The replicas' losses (their range when there are several), with the step they belong to
    when newer steps carried none: a loss is never shown as current when it is not."""
    rows = snap.replica_losses
    if not rows:
        return f"loss {units.loss(snap.loss)}"
    bad = [r.index for r in rows if not r.finite]
    finite = [r.loss for r in rows if r.finite]
    if len(rows) == 1:
        text = f"loss {units.loss(rows[0].loss)}"
    else:
        text = f"loss {units.loss(min(finite))}..{units.loss(max(finite))} ({len(rows)} replicas)" if finite else "loss"
    if bad:
        text += f" NON-FINITE on replica{'s' if len(bad) > 1 else ''} {','.join(map(str, bad))}"
    if snap.loss_step is not None and snap.loss_step < snap.step:
        text += f" at step {snap.loss_step:,}, none since"
    return text


def progress_line(snap: RunSnapshot) -> str:
    """One compact line: step, speed, step p50, input-wait share, replica loss range, retraces,
    device and host memory, ETA; the status when it is not "running"."""
    step = f"step {snap.step:,}"
    if snap.total_steps:
        step += f"/{snap.total_steps:,} ({100 * min(1.0, snap.step / snap.total_steps):.0f}%)"
    parts = [step, fmt_rate(snap.steps_per_s), f"p50 {fmt_seconds(snap.step_p50_s)}",
             f"input {percent(snap.input_wait_frac)}", _loss_range(snap)]
    if not parts[-1].endswith("none since"):  # a stale loss already says which step it is
        parts[-1] += f" ({LAST_STEP})"
    if (keras := keras_loss(snap)) is not None:
        parts.append(keras.describe())
    retraces = training_retraces(snap.functions)
    parts.append(f"retraces {retraces}")
    if snap.device_memory:
        worst = max(snap.device_memory, key=lambda d: d.current_bytes)
        dev = f"dev {units.size(worst.current_bytes)}"
        if worst.limit_bytes:
            dev += f"/{units.size(worst.limit_bytes)}"
        parts.append(dev)
    if snap.host_memory:
        parts.append(f"host {units.size(max(h.rss_bytes for h in snap.host_memory))}")
    if snap.eta_s is not None:
        parts.append(f"ETA {fmt_duration(snap.eta_s)}")
    if snap.phase:
        parts.append(phase_text(snap.phase, snap.phase_since, snap.now))
    if snap.ledger is not None and snap.ledger.goodput is not None:
        parts.append(f"goodput {100 * snap.ledger.goodput:.1f}%")
    if snap.status in ("running", "stalled") and (vs := deltas(snap)):
        parts.append(" · ".join(vs))
    if snap.status != "running":
        parts.append(f"[{snap.status}]")
    return "  ".join(parts)


def finding_line(f: Finding) -> str:
    """``[severity] rule: message`` (the rule is not repeated when the message starts with it)."""
    text = f.message if f.message.startswith(f.rule) else f"{f.rule}: {f.message}"
    return f"[{f.severity}] {text}"


def summary(snap: RunSnapshot, run_steps: RunSteps | None = None, last_output: str = "") -> str:
    """The end-of-run summary, several lines. ``run_steps``: every step record read, for the
    whole run's p50, p95 and steps/s (the report's); without, the snapshot's recent ones.
    ``last_output``: the script's last line of output, said when it failed with no exception
    recorded (``sys.exit(2)`` after argparse's "error: ..." line)."""
    name = one_line(snap.script) or "run"  # one line: the summary's first line names it
    if snap.status == "finished":
        head = f"{name} finished (exit 0)"
    elif snap.status in ("crashed", "stopped"):
        head = f"{name} {snap.status}" + (f" (exit {snap.exit_code})" if snap.exit_code is not None else "")
    elif snap.status == "lost":
        head = f"{name} lost: {snap.lost_reason or 'no exit record'}"
    else:
        head = f"{name} {snap.status}"
    if snap.started_t is not None:
        end = snap.ended_t if snap.ended_t is not None else snap.last_message_t
        if end is not None:
            head += f" after {fmt_duration(end - snap.started_t)}"
    lines = [f"tpuwatch: {head}"]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<10}{one_line(text)}")  # a run id or a message may hold a newline

    ident = snap.run_id or UNKNOWN
    if snap.strategy:
        ident += f"  {snap.strategy}, {units.replicas(snap.replicas or 0)} on {snap.device_kind or '?'}"
    if snap.tf_version:
        ident += f"  TF {snap.tf_version}"
    row("run", ident)
    if snap.step:
        p50, p95, rate = snap.step_p50_s, snap.step_p95_s, snap.steps_per_s
        span = "recent"  # the progress lines' figures
        if run_steps is not None and run_steps.values:
            (p50, p95), rate = run_steps.percentiles(), run_steps.steps_per_s()
            span = "over the whole run"
        row("steps", f"{snap.step:,}  {fmt_rate(rate)} {span}  step p50 {fmt_seconds(p50)}  p95 {fmt_seconds(p95)}")
        if snap.input_run is not None:
            # the input-bound rule's own numbers and verdict, over every eligible step
            row("input", f"{snap.input_run.describe()}: {snap.input_run.verdict}")
        elif snap.input_wait_frac_total is not None:
            row("input", f"{percent(snap.input_wait_frac_total)} of step time waiting for input "
                         f"(last {percent(snap.input_wait_frac)})")
        at = f"step {snap.loss_step:,}" if snap.loss_step is not None else "the last step"
        row("loss", f"{units.loss(snap.loss)}, the mean over replicas at {at} ({LAST_STEP})"
                    + (f"; replicas {_loss_range(snap).removeprefix('loss ')}" if len(snap.replica_losses) > 1 else ""))
        if (keras := keras_loss(snap)) is not None:
            row("", keras.describe())
    else:
        row("steps", "no training step recorded")
    if snap.functions:
        fn = ", ".join(f"{f.label} {f.traces} trace{'s' if f.traces != 1 else ''}"
                       + (f"/{f.instances} objects" if f.instances > 1 else "")
                       for f in snap.functions[:4])
        row("traces", fn)
    mem = []
    if snap.device_peaks:
        w, dev, peak = max(snap.device_peaks, key=lambda x: x[2])
        mem.append(f"device peak {units.size(peak)} ({units.device_name(dev)})")
    if snap.host_rss_peak_bytes:
        mem.append(f"host RSS peak {units.size(snap.host_rss_peak_bytes)}")
    if mem:
        row("memory", "  ".join(mem))
    if snap.ledger is not None and snap.ledger.wall_s > 0:
        row("goodput", goodput_line(snap.ledger))
        rules = {f.rule for f in snap.findings if f.severity != "info"}
        row("time", ", ".join(f"{r.label} {fmt_duration(r.seconds)} ({100 * r.share:.0f}%)"
                              + (f" -> {r.rule}" if r.rule else "") for r in ledger_rows(snap.ledger, rules)))
    for f in snap.findings:
        row("finding", finding_line(f))
    if snap.disabled_probes:
        row("probes", "disabled: " + ", ".join(f"{k} ({v})" for k, v in
                                               sorted(snap.disabled_probes.items())))
    if snap.exception:
        # A TF error's message runs to many lines (the graph node's "defined at" stack), and the
        # record keeps its first 2000 characters: its first line, whole, and where the rest is.
        said = [line for line in snap.exception.splitlines() if line.strip()]
        more = f" (+{len(said) - 1} more lines: the script's output, `tpuwatch report`)" if len(said) > 1 else ""
        row("error", said[0].rstrip() + more if said else snap.exception)
    elif snap.status == "crashed" and last_output:
        row("output", f"{last_output} (the script's last line)")
    health = []
    if snap.truncated_tail:
        health.append("last line cut (truncated tail)")
    if snap.malformed:
        health.append(f"{snap.malformed} malformed line(s)")
    if snap.unknown:
        health.append(f"{snap.unknown} line(s) of unknown kind")
    health.extend(snap.recording_gaps)
    if health:
        row("recording", "; ".join(health))
    return "\n".join(lines)


def follow(
    events_path: str | Path,
    is_alive: Callable[[], bool],
    out: TextIO = sys.stderr,
    every_s: float = 5.0,
    clock: Callable[[], float] = time.time,
    *,
    on_end: Callable[[], object] | None = None,
    exit_grace_s: float = 3.0,
    poll_s: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
    record_findings: bool = False,
    baseline: Baseline | None = None,
) -> RunSnapshot:
    """Tails ``events_path`` until the process is gone and the recording is drained; prints a
    progress line every ``every_s`` seconds, each new finding once, and the summary at the end.

    ``is_alive()`` says whether the training process still runs. When it turns False,
    ``on_end()`` is called once if given (the launcher's ``finish``, which writes an exit record
    when the agent could not); then the recording is read to its end. Without ``on_end``,
    follow waits up to ``exit_grace_s`` for the exit record. A run that ends with no exit record
    is reported "lost". ``record_findings``: append new findings to the recording (only the
    process that owns the run does, so several viewers do not write them twice). Returns the
    final snapshot.
    """
    recording = Path(events_path)
    source = FileSource(recording.parent, reader=RecordingReader(recording))
    unrecorded: list[OSError] = []

    def record(new: list[Finding]) -> None:
        """Findings into the recording; one that cannot take them (its run directory removed
        mid-run, a read-only disk) is said once, and the view goes on: they are derived data."""
        try:
            append(recording, new)
        except OSError as e:
            if not unrecorded:
                print(one_line(f"tpuwatch: cannot record findings in {recording} ({e.strerror or e}): they are "
                               "shown here only (`tpuwatch report` finds them again from what is recorded)"),
                      file=out, flush=True)
            unrecorded.append(e)

    return follow_group(
        source, is_alive, out, every_s, clock, on_end=on_end,
        exit_grace_s=exit_grace_s, poll_s=poll_s, sleep=sleep,
        record_findings=record if record_findings else None,
        watch_disk=recording.parent, baseline=baseline, output_log=recording.parent / "output.log")


def last_line(path: Path, tail_bytes: int = 4096) -> str:
    """The last non-blank line of a text file, from its last ``tail_bytes`` ("" when unreadable,
    and for anything but a regular file: a FIFO is never waited on, /dev/zero never read)."""
    try:
        with rundir.open_regular(path) as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            text = f.read(tail_bytes).decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return one_line(lines[-1]) if lines else ""


def workers_line(snap: RunSnapshot) -> str:
    """One line with every worker: ``worker:0 step 120 p50 150 ms input 2% | worker:1 ...``."""
    codes = worker_exit_codes(snap)
    parts = []
    for w in snap.workers:
        text = f"{w.name} step {w.step:,} p50 {fmt_seconds(w.step_p50_s)} input {percent(w.input_wait_frac)}"
        state = worker_status_text(snap, w.name, w.status, w.connected, codes)
        if state != "running":
            text += f" [{state}]"
        parts.append(text)
    return "  workers: " + " | ".join(parts)


#: Events a headless viewer prints as they come: the script's output late on its way to output.log,
#: and what a full or slow disk made the run lose.
SAID_SOURCES = (OUTPUT_SOURCE, DISK_FULL_SOURCE)


def follow_group(
    source: RecordingSource,
    is_alive: Callable[[], bool],
    out: TextIO = sys.stderr,
    every_s: float = 5.0,
    clock: Callable[[], float] = time.time,
    *,
    on_end: Callable[[], object] | None = None,
    exit_grace_s: float = 3.0,
    poll_s: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
    record_findings: Callable[[list[Finding]], None] | None = None,
    watch_disk: Path | None = None,
    baseline: Baseline | None = None,
    output_log: Path | None = None,
) -> RunSnapshot:
    """:func:`follow` over several workers' recordings merged into one state (``tpuwatch run
    --headless --workers N``): the merged progress line, then one line with each worker (step,
    step time, input wait, state); findings once; the summary at the end with each worker's end.

    ``source`` is a :class:`~tpuwatch.sources.group_source.GroupSource` (or, for :func:`follow`,
    a :class:`~tpuwatch.sources.file_source.FileSource`): tagged messages, read to the end.
    ``record_findings`` receives new findings to record (the owner writes them into the
    recording of the worker each concerns). A worker whose recording ends without an exit
    record is reported lost; the others keep their own end. ``watch_disk``: say once (a line)
    when the disk holding it fills up, and once when space returns (one statvfs a second, and
    one more at the end if the disk was last seen full). ``output_log``: the script's output,
    whose last line the summary says when the script failed without an exception.
    """
    # the step figures are the finished run's, as `tpuwatch report` gives them
    monitor = Monitor(clock, on_new=record_findings, baseline=baseline)
    state = monitor.state
    next_print = clock() + every_s
    last_key: tuple | None = None
    disk_note = ""
    next_disk_check = 0.0

    def say(text: str) -> None:
        # Names, messages and exception text come from the run: never terminal controls.
        print(printable(text), file=out, flush=True)

    def check_disk() -> None:
        nonlocal disk_note
        note = full_note(watch_disk) if watch_disk is not None else ""
        if note != disk_note:
            say(f"tpuwatch: {note}" if note else "tpuwatch: the disk has space again")
            disk_note = note

    def take(tagged: Sequence[Tagged]) -> None:
        for worker, msg in tagged:
            if not monitor.take(msg, worker):
                continue  # a finding this process recorded: in the state since it was found
            if isinstance(msg, Event) and msg.source in SAID_SOURCES:  # output late or lost: said as it happens
                say(f"tpuwatch: {msg.message}")
        for f in state.drain_new_findings():
            say(finding_line(f))

    while True:
        alive = is_alive()
        while True:
            take(source.poll_tagged())
            if source.caught_up:
                break
        if not alive:
            if disk_note:  # space that returned within the last check's second is said too
                check_disk()
            break
        now = clock()
        if now >= next_disk_check:
            next_disk_check = now + 1.0
            check_disk()
        if monitor.evaluate(now):
            take([])
        if now >= next_print:
            snap = monitor.snapshot(now)
            # A line only when something moved: a run that has ended (while TensorFlow tears
            # down) or waits says so once, not every few seconds.
            key = (snap.step, snap.status, tuple(w.status for w in snap.workers), snap.phase, snap.phase_since,
                   now if snap.phase in BUSY_PHASES else None)
            if key != last_key:
                say(progress_line(snap))
                if len(snap.workers) > 1:
                    say(workers_line(snap))
                last_key = key
            next_print = now + every_s
        sleep(poll_s)

    if on_end is not None:
        on_end()
    deadline = clock() + (0.0 if on_end is not None else exit_grace_s)
    while True:
        take(source.poll_tagged())
        if source.caught_up and (state.ended or clock() >= deadline):
            break
        if source.caught_up:
            sleep(poll_s)
    take(source.finish())
    stats = source.read_stats()
    if stats is not None:
        state.note_read_stats(malformed=stats.malformed, unknown=stats.unknown,
                              truncated_tail=stats.truncated_tail)
    workers = monitor.snapshot(clock()).workers
    for w in workers:
        if w.status not in ("finished", "crashed"):
            state.set_lost("the process ended without an exit record", worker=w.name)
    if not workers and not state.ended:
        state.set_lost("the process ended without an exit record")
    end_t = state.last_message_t if state.last_message_t is not None else clock()
    monitor.evaluate(end_t, force=True)
    take([])
    snap = monitor.snapshot(end_t)
    say(summary(snap, monitor.steps, last_line(output_log) if output_log is not None else ""))
    if len(snap.workers) > 1:
        say(workers_line(snap))
    return snap
