"""GPU memory risk and GPU health: pure rules over metric series. No boto3, no clock, no environment.

Forecasting: a robust trend (Tukey's resistant line: medians of the first and last thirds) over the points since the
last jump (more than `jump_percent` of the GPU's memory within a minute: a process exiting or loading),
trusted only with enough points and a consistent direction (the thirds' medians rising in order), so noise and
gaps do not raise false alarms. Time to full = headroom / slope.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import Field

from gpufleet.domain.models import Frozen
from gpufleet.policy.guard import HealthSettings, OomSettings


class Risk(StrEnum):
    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"


# ---- observations ----


HOST_INDEX = -1  # a GpuRef for the host's own memory (key "INSTANCE/host"), forecast like a GPU's
HOST_SUFFIX = "/host"


class GpuRef(Frozen):
    group: str
    instance_id: str
    gpu_index: int

    @property
    def is_host(self) -> bool:
        return self.gpu_index == HOST_INDEX

    @property
    def key(self) -> str:
        return f"{self.instance_id}{HOST_SUFFIX}" if self.is_host else f"{self.instance_id}/gpu{self.gpu_index}"

    @classmethod
    def parse_key(cls, group: str, key: str) -> GpuRef:
        """Inverse of `key` (the guard state remembers GPUs, and hosts, by key)."""
        if key.endswith(HOST_SUFFIX) and len(key) > len(HOST_SUFFIX):
            return cls(group=group, instance_id=key[: -len(HOST_SUFFIX)], gpu_index=HOST_INDEX)
        instance, sep, index = key.rpartition("/gpu")
        if not sep or not instance or not index.isdigit():
            raise ValueError(f"not a GPU key: {key!r} (expected 'INSTANCE/gpuN' or 'INSTANCE/host')")
        return cls(group=group, instance_id=instance, gpu_index=int(index))


def instance_of(key: str) -> str:
    """The instance of a GPU or host key ("i-1/gpu3", "i-1/host" -> "i-1")."""
    return key[: -len(HOST_SUFFIX)] if key.endswith(HOST_SUFFIX) else key.rpartition("/gpu")[0]


class MemorySeries(Frozen):
    gpu: GpuRef
    points: tuple[tuple[datetime, float], ...]  # (minute, MiB used), oldest first, gaps allowed
    total_mib: float | None = None
    top_process_mib: float | None = None


class Forecast(Frozen):
    gpu: GpuRef
    risk: Risk
    used_mib: float | None = None
    total_mib: float | None = None
    used_percent: float | None = None
    slope_mib_per_min: float | None = None
    minutes_to_full: float | None = None
    top_process_mib: float | None = None
    points_used: int = 0
    reason: str
    # A host whose own series stopped at or above the warning level (no reading in the trend window): its
    # last reading. Told as silence, never as "back to normal" (thrashing, OOM-killed publisher, gone).
    silent_at_percent: float | None = None


def resistant_slope(points: Sequence[tuple[float, float]]) -> tuple[float, bool]:
    """Tukey's resistant line: the slope between the medians of the first and last thirds of the points,
    and whether the medians of the three thirds rise in order (a consistent trend, not one noisy end).
    Medians make it robust to spikes and noise; it is O(n), so 10,000 GPUs fit the evaluation budget."""
    n = len(points)
    third = max(1, n // 3)
    first, middle, last = points[:third], points[third : n - third], points[n - third :]
    if not middle:
        return 0.0, False
    x1, y1 = _median([x for x, _ in first]), _median([y for _, y in first])
    x3, y3 = _median([x for x, _ in last]), _median([y for _, y in last])
    y2 = _median([y for _, y in middle])
    if x3 == x1:
        return 0.0, False
    return (y3 - y1) / (x3 - x1), y1 < y2 < y3


def _median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def since_last_jump(
    points: Sequence[tuple[datetime, float]], total: float, jump_percent: float
) -> list[tuple[datetime, float]]:
    """The points after the last jump bigger than jump_percent of total, either way: a drop is a process
    exiting (a reset), a rise is a process loading its model. A leak is gradual; jumps are not trends."""
    threshold = total * jump_percent / 100
    start = 0
    for i in range(1, len(points)):
        if abs(points[i][1] - points[i - 1][1]) > threshold:
            start = i
    return list(points[start:])


def forecast_gpu(series: MemorySeries, now: datetime, s: OomSettings) -> Forecast:
    gpu = series.gpu
    if not series.points or not series.total_mib:
        return Forecast(gpu=gpu, risk=Risk.OK, reason="no memory data (insufficient data): not judged")
    total = series.total_mib
    since = now - timedelta(minutes=s.window_minutes)
    recent = [p for p in series.points if p[0] >= since]
    if not recent:
        return Forecast(gpu=gpu, risk=Risk.OK, total_mib=total, reason="no recent memory data: not judged")
    used = recent[-1][1]
    pct = 100.0 * used / total
    base = {
        "gpu": gpu,
        "used_mib": used,
        "total_mib": total,
        "used_percent": pct,
        "top_process_mib": series.top_process_mib,
    }
    # Points are at least a minute apart, so no trend over them rises faster than (max - min) per minute.
    # If even that cannot fill the GPU within the warning horizon and the level is below warning, the
    # GPU is OK without looking for jumps or fitting a trend (most GPUs, most of the time).
    values = [v for _, v in recent]
    if pct < s.warning_percent and (max(values) - min(values)) * s.warning_minutes < total - used:
        reason = f"{_used(pct, total)}; no rise that could fill it within {s.warning_minutes:g} min"
        return Forecast(**base, risk=Risk.OK, points_used=len(recent), reason=reason)
    trend = since_last_jump(recent, total, s.jump_percent)
    slope = minutes = None
    if len(trend) >= s.min_points:
        t0 = trend[0][0]
        slope, consistent = resistant_slope([((t - t0).total_seconds() / 60, v) for t, v in trend])
        if slope > 0 and consistent:
            minutes = (total - used) / slope
    base.update(slope_mib_per_min=slope, minutes_to_full=minutes, points_used=len(trend))
    trend_text = (
        f"rising {slope:.0f} MiB/min over {len(trend)} min, full in ~{minutes:.0f} min"
        if minutes is not None and slope is not None
        else (
            f"no consistent rise over {len(trend)} min" if len(trend) >= s.min_points else "too few points for a trend"
        )
    )
    level = Risk.OK
    if pct >= s.critical_percent or (minutes is not None and minutes <= s.critical_minutes):
        level = Risk.CRITICAL
    elif pct >= s.warning_percent or (minutes is not None and minutes <= s.warning_minutes):
        level = Risk.WARNING
    reason = f"{_used(pct, total)}; {trend_text}"
    return Forecast(**base, risk=level, reason=reason)


def forecast_host(ref: GpuRef, points: Sequence[tuple[datetime, float]], now: datetime, s: OomSettings) -> Forecast:
    """A host's memory, forecast like a GPU's (same thresholds, trend and jumps) from its used percent;
    the reason in percent, since the publisher sends the host in percent only. `points` oldest first and
    may reach back before the trend window: a host with no reading in the window whose last one was at
    or above the warning level went silent at risk (OK, not judged, with `silent_at_percent`)."""
    f = forecast_gpu(MemorySeries(gpu=ref, points=tuple(points), total_mib=100.0), now, s)
    if f.used_percent is None and points and points[-1][1] >= s.warning_percent:
        at, last = points[-1]
        reason = (
            f"host memory: no reading since {last:.1f}% at {at:%H:%M} UTC (node gone, thrashing or its "
            "publisher killed?): not judged"
        )
        return f.model_copy(update={"reason": reason, "silent_at_percent": last})
    if f.used_percent is None:  # a node's own host series is sent only above 70 %, until below 60 %
        return f.model_copy(update={"reason": "host memory: no recent reading of its own (below 60 % or gone)"})
    if f.minutes_to_full is not None and f.slope_mib_per_min is not None:
        trend = f"rising {f.slope_mib_per_min:.2f} %/min over {f.points_used} min, full in ~{f.minutes_to_full:.0f} min"
    else:
        trend = f"no rise that could fill it within {s.warning_minutes:g} min"
    return f.model_copy(update={"reason": f"host memory {f.used_percent:.1f}% used; {trend}"})


def _used(pct: float, total_mib: float) -> str:
    """How full, with the size when it is known (a series read in percent only has a nominal 100 MiB)."""
    return f"{pct:.1f}% of {total_mib / 1024:.0f} GiB used" if total_mib >= 1024 else f"{pct:.1f}% used"


MIN_AVERAGE_RISE = 0.05  # percent per minute: below this an average is flat, whatever its thirds say


def rising(points: Sequence[tuple[datetime, float]], min_points: int, instances: int = 1) -> bool:
    """A consistent rise of the average (the thirds' medians in order): a leak hidden below a fuller,
    flat GPU still lifts the average of all of them, diluted but steady. Over a group the same leak is
    diluted by its `instances` too, so the bar is lowered by as much (a false alarm costs only the
    group's instance series, a missed leak an OOM)."""
    if len(points) < min_points:
        return False
    t0 = points[0][0]
    slope, consistent = resistant_slope([((t - t0).total_seconds() / 60, v) for t, v in points])
    steps = [b[1] - a[1] for a, b in itertools.pairwise(points)]
    mostly_up = sum(1 for d in steps if d >= 0) >= 2 * len(steps) / 3  # noise goes both ways, a leak does not
    return consistent and mostly_up and slope > MIN_AVERAGE_RISE / max(1, instances)


# ---- health ----


class HealthCounts(Frozen):
    """Sums over the lookback of the publisher's health counters for one GPU."""

    gpu: GpuRef
    xid_errors: float = 0
    ecc_double_bit: float = 0
    remapped_uncorrectable: float = 0
    lost: float = 0


class HealthFinding(Frozen):
    gpu: GpuRef
    problems: tuple[str, ...]
    reason: str


def health_findings(counts: Sequence[HealthCounts], s: HealthSettings) -> list[HealthFinding]:
    out = []
    for c in counts:
        problems = []
        if s.gpu_lost and c.lost > 0:
            problems.append("GPU lost (fell off the bus)")
        if s.xid and c.xid_errors > 0:
            problems.append(f"{c.xid_errors:.0f} critical XID error(s)")
        if s.ecc_double_bit and c.ecc_double_bit > 0:
            problems.append(f"{c.ecc_double_bit:.0f} uncorrectable ECC error(s)")
        if s.remapped_rows and c.remapped_uncorrectable > 0:
            problems.append(f"{c.remapped_uncorrectable:.0f} row(s) remapped after uncorrectable errors")
        if problems:
            out.append(
                HealthFinding(
                    gpu=c.gpu,
                    problems=tuple(problems),
                    reason=f"{c.gpu.instance_id} GPU {c.gpu.gpu_index}: " + "; ".join(problems),
                )
            )
    return out


class Replacement(Frozen):
    instance_id: str
    group: str
    act: bool
    reason: str


# ---- corroboration: a GPU fault the instance said itself ----
# Any node may write any InstanceId into the shared namespace (IAM has no condition key for dimensions);
# only an instance's own credentials may write its own namespace (gpufleet_node.schema.node_namespace).
# So a replacement needs the fault there too; the shared namespace alone could be another node's forgery.


def forgery_reason(instance_id: str) -> str:
    return (
        f"GPU fault reported for {instance_id} under the shared namespace but not by the instance itself: "
        "not replacing; possible forgery from another node"
    )


def corroborated(
    findings: Sequence[HealthFinding], own: Mapping[str, Sequence[HealthCounts]], s: HealthSettings
) -> set[str]:
    """The instances with a finding that their own namespace confirms: the same GPU reports a fault the
    policy checks for in the same window (`own`: instance id -> its own counters; absent = none found)."""
    out = set()
    for f in findings:
        mine = {c.gpu.gpu_index for c in health_findings(own.get(f.gpu.instance_id, ()), s)}
        if f.gpu.gpu_index in mine:
            out.add(f.gpu.instance_id)
    return out


def hold_unconfirmed(
    findings: Sequence[HealthFinding], confirmed: set[str], why: Mapping[str, str] | None = None
) -> tuple[list[HealthFinding], list[Replacement]]:
    """Findings of confirmed instances (to choose replacements from), and a held, non-acting replacement
    per other instance, with why (`why` overrides the forgery reason, e.g. a read that failed)."""
    ready = [f for f in findings if f.gpu.instance_id in confirmed]
    held: dict[str, Replacement] = {}
    for f in findings:
        iid = f.gpu.instance_id
        if iid not in confirmed and iid not in held:
            reason = (why or {}).get(iid) or forgery_reason(iid)
            held[iid] = Replacement(instance_id=iid, group=f.gpu.group, act=False, reason=reason)
    return ready, [held[k] for k in sorted(held)]


def _replacements_in_group(
    group: str, instances: list[str], budget: int, serving: int, floor: int, s: HealthSettings
) -> list[Replacement]:
    out = []
    healthy_after = serving
    for iid in sorted(instances):
        if not s.replace_unhealthy:
            act, reason = False, "replacement is off in the policy"
        elif budget <= 0:
            act, reason = False, f"blast radius: {s.max_replacements_per_hour} replacement(s) per hour already used"
        elif healthy_after - 1 < floor:
            act, reason = False, f"blast radius: would leave {healthy_after - 1} healthy, below {floor}"
        else:
            budget, healthy_after = budget - 1, healthy_after - 1
            act, reason = True, "unhealthy GPU: replace the instance"
        out.append(Replacement(instance_id=iid, group=group, act=act, reason=reason))
    return out


def choose_replacements(
    findings: Sequence[HealthFinding],
    in_service: dict[str, int],
    group_min: dict[str, int],
    recent_replacements: dict[str, Sequence[datetime]],
    now: datetime,
    s: HealthSettings,
) -> list[Replacement]:
    """Which unhealthy instances to hand to their ASG for replacement, within the blast radius: at most
    `max_replacements_per_hour` per group, and never fewer healthy in-service instances than
    max(group min, min_healthy_percent of in-service)."""
    by_group: dict[str, list[str]] = {}
    for f in findings:
        ids = by_group.setdefault(f.gpu.group, [])
        if f.gpu.instance_id not in ids:
            ids.append(f.gpu.instance_id)
    out = []
    hour_ago = now - timedelta(hours=1)
    for group, instances in sorted(by_group.items()):
        budget = s.max_replacements_per_hour - sum(1 for t in recent_replacements.get(group, ()) if t > hour_ago)
        serving = in_service.get(group, 0)
        floor = max(group_min.get(group, 0), int(-(-serving * s.min_healthy_percent // 100)))
        out += _replacements_in_group(group, instances, budget, serving, floor, s)
    return out


def group_pressure(
    forecasts: Sequence[Forecast], instances_per_group: dict[str, int], s: OomSettings
) -> dict[str, str]:
    """Groups where at least `pressure_share` of the in-service instances have a GPU at WARNING or worse
    -> the reason. Counted per instance: a GPU's series exist only while it matters, so the guard knows
    a group's instances, not how many GPUs it has."""
    at_risk: dict[str, set[str]] = {}
    for f in forecasts:
        if f.risk is not Risk.OK and not f.gpu.is_host:  # more GPUs help a GPU's memory, not a leaking host
            at_risk.setdefault(f.gpu.group, set()).add(f.gpu.instance_id)
    out = {}
    for group, instances in at_risk.items():
        total = instances_per_group.get(group, 0)
        if total and len(instances) / total >= s.pressure_share:
            out[group] = (
                f"memory pressure: {len(instances)} of {total} instances have a GPU at risk of running out of memory"
            )
    return out


# ---- what the guard remembers about a group between runs ----


class GuardState(Frozen):
    """Open memory risks and health findings (so each is told once, and resolved once) and when the
    group last had instances replaced (the blast-radius budget)."""

    version: int = 0
    risks: dict[str, Risk] = Field(default_factory=dict)  # GPU key -> risk level
    unhealthy: dict[str, str] = Field(default_factory=dict)  # GPU key -> what is wrong
    replacements: tuple[datetime, ...] = ()
    # Replacements begun (budget already counted) and not yet confirmed: instance id -> attempts. Saved
    # before SetInstanceHealth is called, cleared only after it succeeded, so a crash or an error in
    # between is retried by the next run instead of forgotten or counted twice.
    pending: dict[str, int] = Field(default_factory=dict)
    # Replacements held because the instance's own namespace did not confirm the fault: instance id ->
    # why. Told once (with the finding); checked again each run while the finding lasts.
    unconfirmed: dict[str, str] = Field(default_factory=dict)


MAX_REPLACEMENT_ATTEMPTS = 3


def begin_replacements(before: GuardState, acting: Sequence[str], now: datetime) -> GuardState:
    """The intent, saved before acting: these instances are being replaced (budget counted now)."""
    recent = tuple(t for t in before.replacements if t > now - timedelta(hours=1))
    pending = dict(before.pending)
    for iid in acting:
        pending.setdefault(iid, 0)
    return before.model_copy(update={"replacements": recent + tuple(now for _ in acting), "pending": pending})


def next_guard_state(
    begun: GuardState,
    forecasts: Sequence[Forecast],
    findings: Sequence[HealthFinding],
    failed: Sequence[str],
    held: Sequence[Replacement] = (),
) -> GuardState:
    """The group's memory after this run: what is at risk or unhealthy now; replacements whose call
    failed stay pending (one more attempt counted) until MAX_REPLACEMENT_ATTEMPTS; replacements `held`
    for want of corroboration are remembered while their instance still has a finding."""
    pending = {iid: begun.pending.get(iid, 0) + 1 for iid in failed}
    sick = {h.gpu.instance_id for h in findings}
    return begun.model_copy(
        update={
            "risks": {f.gpu.key: f.risk for f in forecasts if f.risk is not Risk.OK},
            "unhealthy": {h.gpu.key: h.reason for h in findings},
            "pending": {iid: n for iid, n in pending.items() if n < MAX_REPLACEMENT_ATTEMPTS},
            "unconfirmed": {r.instance_id: r.reason for r in held if r.instance_id in sick},
        }
    )
