"""What the OOM guard tells on-call (pure): a note per GPU whose memory risk or health changed since
the last run (before -> after), each in its own incident, and a resolution when it clears."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from gpufleet.domain.notification import Link, Notification, NotificationKind, Severity, console_links, link, note
from gpufleet.guard.core import Forecast, GpuRef, GuardState, HealthFinding, Replacement, Risk
from gpufleet_node import schema

SOURCE = "oom_guard"


def metric_link(region: str, gpu: GpuRef) -> Link | None:
    """The GPU's (or the host's) memory graph in the CloudWatch console."""
    series = (
        f'~"{schema.HOST_MEMORY_USED_PERCENT.name}~"{schema.DIM_INSTANCE_ID}~"{gpu.instance_id}'
        if gpu.is_host
        else f'~"{schema.GPU_MEMORY_USED.name}~"{schema.DIM_INSTANCE_ID}~"{gpu.instance_id}~"'
        f'{schema.DIM_GPU_INDEX}~"{gpu.gpu_index}'
    )
    source = f'~(metrics~(~(~"{schema.NAMESPACE}{series}))~period~60~stat~"Maximum)'
    return link(
        "host memory graph" if gpu.is_host else "GPU memory graph",
        f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#metricsV2:graph={quote(source)}",
    )


@dataclass(frozen=True)
class GuardTeller:
    """Builds one GPU's note with what all of a run's notes share."""

    group: str
    now: datetime
    event_id: str
    region: str

    def __call__(
        self,
        gpu: GpuRef,
        kind: NotificationKind,
        severity: Severity,
        title: str,
        facts: dict[str, str],
        reason: str,
        resolved: bool = False,
    ) -> Notification:
        graph = metric_link(self.region, gpu)
        return note(
            kind,
            severity,
            self.group,
            f"{self.group}: {title}",
            at=self.now,
            source=SOURCE,
            id_parts=(self.event_id, gpu.key, str(kind), str(severity), str(resolved)),
            reason=reason,
            facts=facts,
            incident_key=f"{self.group}|{kind}|{gpu.key}",
            links=((graph,) if graph else ()) + console_links(self.group, self.region),
            resolved=resolved,
        )


def _host_facts(f: Forecast) -> dict[str, str]:
    """A host's memory is read in percent only (the publisher sends no size)."""
    facts = {"instance": f.gpu.instance_id, "host memory": f"{f.used_percent or 0:.1f}% used"}
    if f.slope_mib_per_min is not None:
        facts["trend"] = f"{f.slope_mib_per_min:+.2f} %/min over {f.points_used} min"
    if f.minutes_to_full is not None:
        facts["forecast"] = f"full in ~{f.minutes_to_full:.0f} min"
    return facts


def _what(gpu: GpuRef) -> str:
    return "host memory" if gpu.is_host else "GPU memory"


def _risk_facts(f: Forecast) -> dict[str, str]:
    if f.gpu.is_host:
        return _host_facts(f)
    facts = {
        "instance": f.gpu.instance_id,
        "GPU": str(f.gpu.gpu_index),
        "memory": f"{(f.used_mib or 0) / 1024:.1f} / {(f.total_mib or 0) / 1024:.1f} GiB ({f.used_percent or 0:.1f}%)",
    }
    if f.slope_mib_per_min is not None:
        facts["trend"] = f"{f.slope_mib_per_min:+.0f} MiB/min over {f.points_used} min"
    if f.minutes_to_full is not None:
        facts["forecast"] = f"full in ~{f.minutes_to_full:.0f} min"
    if f.top_process_mib is not None:
        facts["top process"] = f"{f.top_process_mib / 1024:.1f} GiB"
    return facts


def risk_notes(tell: GuardTeller, before: GuardState, forecasts: Sequence[Forecast]) -> list[Notification]:
    """A note when a GPU's risk level changes (WARNING, CRITICAL), and one when it is back to normal."""
    out = []
    current = {f.gpu.key: f for f in forecasts}
    for key, f in current.items():
        if f.risk is not Risk.OK and before.risks.get(key) != f.risk:
            title = f"{_what(f.gpu)} {f.risk}: {key}"
            out.append(tell(f.gpu, NotificationKind.OOM, Severity(str(f.risk)), title, _risk_facts(f), f.reason))
    for key in before.risks:
        now_ok = current.get(key)
        if now_ok is None or now_ok.risk is Risk.OK:
            gpu = GpuRef.parse_key(tell.group, key)
            gone = "the host" if gpu.is_host else "the GPU"
            why = now_ok.reason if now_ok is not None else f"{gone} no longer reports memory (instance gone)"
            title, facts = f"{_what(gpu)} back to normal: {key}", {}
            if now_ok is not None and now_ok.silent_at_percent is not None:  # silence at risk: not normal
                silent = f"{now_ok.silent_at_percent:.0f} %"
                title = f"host memory: no reading since {silent} (node gone, thrashing or its publisher killed?): {key}"
                facts = {"instance": gpu.instance_id, "last host memory": f"{now_ok.silent_at_percent:.1f}% used"}
            out.append(tell(gpu, NotificationKind.OOM, Severity.INFO, title, facts, why, resolved=True))
    return out


def health_notes(
    tell: GuardTeller, before: GuardState, findings: Sequence[HealthFinding], choices: Sequence[Replacement]
) -> list[Notification]:
    """A CRITICAL note per newly failing GPU (with what is done about it), and one when it clears."""
    out = []
    action = {c.instance_id: c for c in choices}
    for h in findings:
        if h.gpu.key in before.unhealthy:
            continue
        facts = {"instance": h.gpu.instance_id, "GPU": str(h.gpu.gpu_index), "problems": "; ".join(h.problems)}
        if h.gpu.instance_id in action:
            facts["action"] = action[h.gpu.instance_id].reason
        out.append(
            tell(h.gpu, NotificationKind.GPU_HEALTH, Severity.CRITICAL, f"GPU failure on {h.gpu.key}", facts, h.reason)
        )
    told = {h.gpu.instance_id for h in findings if h.gpu.key not in before.unhealthy}
    for c in choices:  # a replacement held for want of corroboration, made now that the instance confirmed it
        confirmed = [h for h in findings if h.gpu.instance_id == c.instance_id]
        if c.act and c.instance_id in before.unconfirmed and c.instance_id not in told and confirmed:
            h = confirmed[0]
            facts = {"instance": c.instance_id, "GPU": str(h.gpu.gpu_index), "action": c.reason}
            title = f"GPU failure confirmed by {c.instance_id} itself: {h.gpu.key}"
            out.append(tell(h.gpu, NotificationKind.GPU_HEALTH, Severity.CRITICAL, title, facts, h.reason))
    current = {h.gpu.key for h in findings}
    for key in before.unhealthy:
        if key not in current:
            gpu = GpuRef.parse_key(tell.group, key)
            why = "no new errors in the lookback window"
            out.append(
                tell(
                    gpu, NotificationKind.GPU_HEALTH, Severity.INFO, f"GPU health clear: {key}", {}, why, resolved=True
                )
            )
    return out
