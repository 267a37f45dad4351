"""``batch-size-alignment`` and ``float32-on-tpu``: TPU configuration that wastes the chip."""

from __future__ import annotations

from tpuwatch.protocol import Finding, Severity

from .rule import Rule
from .telemetry import Telemetry


def per_replica_batch(tel: Telemetry) -> tuple[int, str] | None:
    """The per-replica batch size and where it came from, or None if unknown."""
    cfg = tel.config
    prb = cfg.get("per_replica_batch_size")
    if isinstance(prb, int) and prb > 0:
        return prb, "Config.per_replica_batch_size"
    gbs = cfg.get("global_batch_size")
    topo = tel.topology
    if isinstance(gbs, int) and gbs > 0 and topo and topo.replicas > 0 and gbs % topo.replicas == 0:
        return gbs // topo.replicas, f"Config.global_batch_size {gbs} / {topo.replicas} replicas"
    for w in tel.step_workers():
        if w.examples and w.latest_topology and w.latest_topology.local_replicas > 0:
            ex, _ = w.examples.most_common(1)[0]  # the common batch, not the last partial one
            if ex % w.latest_topology.local_replicas == 0:
                return (ex // w.latest_topology.local_replicas,
                        f"Step.examples {ex} / {w.latest_topology.local_replicas} local replicas")
    return None


class BatchSizeAlignment(Rule):
    """On TPU, a per-replica batch that is not a multiple of 128 leaves MXU rows idle.

    Not a multiple of 8: XLA pads the batch dimension, so compute is spent on padding
    (warning). A multiple of 8 but not of 128: the 128-wide matrix units are partly idle
    (info: fine for small models, worth knowing for big ones).
    """

    id = "batch-size-alignment"

    def check(self, tel: Telemetry) -> None:
        th = self.th
        if not tel.is_tpu:
            return
        found = per_replica_batch(tel)
        if found is None:
            return
        b, source = found
        m, m_min = th.tpu_batch_multiple, th.tpu_batch_min_multiple
        if b % m == 0:
            return
        lower, upper = (b // m) * m, (b // m + 1) * m
        suggest = f"{upper}" if lower == 0 else f"{lower} or {upper}"
        padded = -(-b // m_min) * m_min
        severity: Severity = "warning" if b % m_min else "info"
        replicas = tel.topology.replicas if tel.topology else None
        gsuggest = (f" (global {upper * replicas}" + (f" or {lower * replicas})" if lower else ")")
                    if replicas else "")
        evidence: dict[str, int | str | float] = {
            "per_replica_batch": b,
            "source": source,
            "suggested_lower": lower,
            "suggested_upper": upper,
            "multiple": m,
        }
        if b % m_min:
            evidence["padded_to"] = padded
            evidence["padding_waste_pct"] = round(100 * (padded - b) / padded)
        self._keep("run", Finding(
            t=tel.topology.t if tel.topology else 0.0, rule=self.id, severity=severity,
            message=(f"per-replica batch {b} is not a multiple of {m} on TPU"
                     + (f" (nor of {m_min}: padded to {padded})" if b % m_min else "")),
            advice=f"Use a per-replica batch of {suggest}{gsuggest}; scale the learning rate "
                   "with the batch size",
            evidence=evidence,
        ))


class Float32OnTpu(Rule):
    """On TPU with a float32 (or no) mixed-precision policy: bf16 halves memory and traffic."""

    id = "float32-on-tpu"

    def check(self, tel: Telemetry) -> None:
        if not tel.is_tpu:
            return
        policy = tel.config.get("mixed_precision")
        if policy is None and not tel.steps_seen:
            return  # the agent may still report a policy before training starts
        if policy is not None and policy != "float32":
            return
        shown = policy or "unset (float32)"
        self._keep("run", Finding(
            t=tel.topology.t if tel.topology else 0.0, rule=self.id, severity="info",
            message=f"training in float32 on TPU (Keras dtype policy: {shown})",
            advice=("Call keras.mixed_precision.set_global_policy('mixed_bfloat16') before "
                    "building the model: TPUs compute in bfloat16 natively, it halves activation "
                    "memory and HBM traffic; keep the final layer/softmax in float32 "
                    "(dtype='float32')"),
            evidence={"policy": shown,
                      "device_kind": tel.topology.device_kind if tel.topology else ""},
        ))
