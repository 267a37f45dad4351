"""``host-bound``: the time between steps, in the script's Python, to its line.

The share is the goodput ledger's *host between steps* over the training time (the wall time
less *starting*, *finishing* and the host time after the last step: from the first step to the
last); the lines come from the
agent's samples of the training thread taken between step calls
(:class:`~tpuwatch.protocol.HostSites`). Samples are grouped by where their line runs: a
generator of the script's (the batches are built in Python), one Keras callback method, or
the loop's own function; the group with the most samples is the cause, its line with the most
samples the one named, and what that line spends its time on (NumPy, reading tensors back,
logging, Python) picks the fix.
"""

from __future__ import annotations

from tpuwatch.protocol import Finding, HostSites

from .robust_stats import sig
from .rule import Rule
from .telemetry import Telemetry, Worker

#: Batches built with NumPy or Python: the same work as TF ops in tf.data, in parallel.
PIPELINE_FIX = ("build the batches in tf.data: tf.data.Dataset.from_tensor_slices over the raw arrays, "
                "the per-example work as TF ops in .map(fn, num_parallel_calls=tf.data.AUTOTUNE), then "
                ".batch(...) and .prefetch(tf.data.AUTOTUNE), and iterate the dataset "
                "(tf.data.Dataset.from_generator alone is not enough: the generator's Python still runs "
                "one element at a time, holding the GIL)")
#: Work done by a callback after every batch.
CALLBACK_FIX = ("do it every N batches (start the method with `if batch % 100: return`) or once per "
                "epoch (in on_epoch_end)")
#: Logging every step.
LOGGING_FIX = ("log every N steps (`if step % 100 == 0:`); under Keras, "
               "compile(steps_per_execution=N) runs N steps per call, so callbacks and logs run once per N")
#: The loop's own Python between steps.
LOOP_FIX = ("move the work into the tf.function step (as TF ops), or do it every N steps; a value read "
            "back with .numpy() waits for the step to finish")

_SHOWN_LINES = 3


def _group_key(role: str, function: str, kind: str) -> tuple[str, str, str]:
    # a generator or a callback is one cause whatever its lines do; the loop's lines are
    # grouped by what they do (its NumPy batch building apart from its logging)
    return (role, function, "" if role in ("generator", "callback") else kind)


def _fix(role: str, kind: str) -> str:
    if kind == "logging":
        return LOGGING_FIX
    if role == "callback":  # whatever it computes, a callback's work can run less often
        return CALLBACK_FIX
    if role == "generator" or kind == "numpy":
        return PIPELINE_FIX
    return LOOP_FIX


class HostBound(Rule):
    """The script's Python between steps holds a large share of the training time."""

    id = "host-bound"

    def check(self, tel: Telemetry) -> None:
        th = self.th
        for name, w in tel.workers.items():
            hs = w.host_sites
            if hs is None or hs.samples < th.host_min_samples or hs.script_samples < th.host_min_script_frac * hs.samples:
                continue
            lg = w.ledger.ledger()
            # between steps only: the script's Python after the last step is host too, not this
            after = lg.host_after_last_s
            training_s = lg.wall_s - lg.buckets.get("starting", 0.0) - lg.buckets.get("finishing", 0.0) - after
            host_s = lg.buckets.get("host", 0.0) - after
            if training_s <= 0 or host_s < th.host_min_s or host_s < th.host_warning_frac * training_s:
                continue
            f = self._finding(hs, w, host_s, training_s)
            if f is not None:
                self._keep(name, f)

    def _finding(self, hs: HostSites, w: Worker, host_s: float, training_s: float) -> Finding | None:
        rows = list(zip(hs.sites, hs.counts, hs.kinds, hs.roles, hs.functions, hs.callers, hs.code))
        if not rows:
            return None
        groups: dict[tuple[str, str, str], list[tuple[str, int, str, str, str, str, str]]] = {}
        for row in rows:
            groups.setdefault(_group_key(row[3], row[4], row[2]), []).append(row)
        (role, function, _), lines = max(groups.items(), key=lambda kv: sum(r[1] for r in kv[1]))
        lines.sort(key=lambda r: -r[1])
        site, _count, kind, _role, _fn, caller, code = lines[0]
        # what the group's lines spend their time on: the kind with the most samples
        by_kind: dict[str, int] = {}
        for r in lines:
            by_kind[r[2]] = by_kind.get(r[2], 0) + r[1]
        kind = max(by_kind, key=lambda k: by_kind[k])
        group_n = sum(r[1] for r in lines)
        pct = round(100 * host_s / training_s)
        group_pct = round(100 * group_n / hs.samples)
        where = {"generator": f"in the generator {function}()" + (f", consumed at {caller}" if caller else ""),
                 "callback": f"in the callback {function}",
                 "loop": f"in {function}" if function != "<module>" else "in the script's loop"}[role]
        what = {"numpy": "NumPy", "tensor read": "reading tensors back to the host", "logging": "logging",
                "python": "Python"}.get(kind, kind)
        if role == "generator":  # NumPy's C calls leave no frame: a line with none may be NumPy's too
            what = "building batches in " + ("NumPy" if "numpy" in by_kind else "Python")
        shown = "; ".join(f"{r[0]} ({round(100 * r[1] / hs.samples)}%)" for r in lines[:_SHOWN_LINES])
        message = (f"host between steps: {pct}% of the training time ({sig(host_s)} s of {sig(training_s)} s); "
                   f"{group_pct}% of it {where}, {what}, most at {site}")
        advice = f"{site}: `{code}` ({what}, {where}): {_fix(role, kind)}"
        evidence: dict[str, str | int | float | bool | None] = {
            "host_between_steps_pct": pct, "host_between_steps_s": round(host_s, 2),
            "training_s": round(training_s, 2), "samples_between_steps": hs.samples,
            "samples_in_script": hs.script_samples, "samples_in_steps": hs.step_samples,
            "sample_interval_ms": round(hs.sample_interval_s * 1000, 1),
            "culprit_site": site, "culprit_code": code, "culprit_role": role, "culprit_function": function,
            "culprit_kind": kind, "culprit_caller": caller, "culprit_share_pct": group_pct, "lines": shown,
        }
        return Finding(t=hs.t, rule=self.id, severity="warning", message=message, advice=advice,
                       evidence=evidence, first_step=None, last_step=w.step, worker=w.name)
