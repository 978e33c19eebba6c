"""How far the scaler believes a group's GPU series before it acts on it (pure).

Any node may write any datum in the `GPUFleet` namespace: IAM scopes PutMetricData by namespace
(`cloudwatch:namespace`) and nothing finer, so a node of group `train` can write on group `infer`'s series
or on another instance's. A datum with a large SampleCount (Values=[100], Counts=[10^6]) outweighs every
honest sample in the series' Average. What a forger cannot do is put more samples into a series than the
series' own publishers could have, unseen: the members of a group are known (DescribeAutoScalingGroups),
their GPUs too (DescribeInstanceTypes), and a publisher puts one sample per GPU per sampling second into
the group series and its instance series (layers/node/gpufleet_node/aggregate.py: `Scopes.for_metric`), in
60 s windows that start on the epoch's minute and are stamped with their start (`window_start`,
publisher.py `_roll`): each window lands whole in one of GetMetricData's 60 s periods.

So, before the scaler acts on a group's GPU series (the utilization band, an alarm on the series):
- the group series must hold no more samples than its listed members can publish, over the lookback
  (`samples_bound`: GPUs x samples per GPU-second x (lookback + one publish window)) and in every one
  of its minutes (`minute_bound`: GPUs x samples per GPU-second x 60, + 2 % for one extra sampling round,
  defaults.NODE_MINUTE_JITTER), and only values in [0, 100] (Maximum, Minimum). The per-minute counts are
  the SampleCount datapoints the lookback read already returns (Period 60): no metric more is requested;
- if it fails, each InService member's own series (dimension InstanceId, published in every detail mode)
  is checked the same way against that member's bounds. If every one is clean their mean decides, and
  on-call is not paged: a member that just left (spot reclaim, scale-in) leaves its samples in the group
  series for the lookback, so a group series over its current members' bound is no evidence by itself
  (the decision's reason says it). It is told when no member that left can explain it: a value outside
  0-100, or more samples than the group's max size of members of its largest type could publish
  (`past_ceiling`). If any member's own series fails the group holds and on-call is told which series:
  taking the clean members only would let a forger choose which members count.
- an alarm acts only with the Average statistic (`statistic_problem`): a Maximum, Minimum, percentile or
  trimmed statistic of a node-writable series follows one datum inside any bound. Where only the
  members' own series pass, their mean is weighed against the alarm's threshold (`alarm_checked`).

What is left to a forger under the bounds. In a minute every member published in full, 2 % of that
minute's samples: the minute's mean moves by at most 2/102 of its distance to 0 or 100 (a 5 % minute
reads at most 6.9 %). A minute the members have not published (the newest, whose windows are sent after
it closes; a booting node; a publisher that is down) has room up to the listed members' minute bound, and
the forger can fill it: that minute reads what the forger wants. The lookback bound caps the total at one
window per member, `window / (lookback + window)` of the lookback's weight (1/6 at the defaults: a 5 %
group's lookback mean reads at most 20.8 %, never past a band whose edge is further away); an alarm that
evaluates that one minute alone may fire on it, and passes the check if the members' samples for it
are not in yet when the scaler reads. Forging a member's own series makes the group hold (a denial of
scaling, told), never scale. A forged datum over a bound is never used.

A fleet whose nodes publish in windows longer than 60 s (`window_s: 120` or `300`) puts a whole window
into one minute: the policy's `node_window_s` says so (the minute bound is then one window's samples). A
duplicated PutMetricData of a window (a retry of a send that had landed) reads as over the minute bound
(held, told as a member's series failing). `high_resolution: true`
needs the policy's `node_samples_per_gpu_s: 2`, as for the lookback bound.

AWS alone also offers trimmed statistics with absolute bounds (`TM(0:100)`, `TC(0:100)`): they drop
values outside [0, 100] but still weigh by SampleCount, and moto cannot answer them; the bounds above are
what limit the weight.

Scale-in victims are picked by their own series' Maximum (`GpuMetricsReader.instance_gpu`): beside an
honest publisher a forger can only raise a node's figure there, which keeps that node, so that read is
unchanged (a node whose own publisher is down has no figure unless a forger gives it one: docs/scaler.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gpufleet.domain import defaults
from gpufleet.domain.models import (
    Action,
    AlarmCondition,
    Decision,
    Frozen,
    GroupRef,
    MetricRef,
    SeriesStats,
    TriggerKind,
)
from gpufleet_node import schema

# Percent series sampled once per GPU per second: the ones the sample bound holds for.
PERCENT_SERIES = {m.name: m for m in (schema.GPU_UTILIZATION, schema.GPU_MEMORY_USED_PERCENT)}
_ACTS = (Action.SCALE_OUT, Action.SCALE_IN)


class Member(Frozen):
    """One instance of the group as Auto Scaling lists it, with its GPUs (None: its type is unknown)."""

    instance_id: str
    gpus: int | None
    in_service: bool = True
    # Samples its publisher puts into a series per GPU-second: 1 at the defaults, 2 with `high_resolution:
    # true` (its 10 s datums repeat the minute's samples): the policy's `node_samples_per_gpu_s`.
    samples_per_gpu_s: float = defaults.NODE_SAMPLES_PER_GPU_S
    # Its publisher's window (`window_s`): a window longer than a minute lands in one minute whole. The
    # policy's `node_window_s`.
    window_s: int = defaults.NODE_PUBLISH_WINDOW_S


class Verdict(Frozen):
    """What the scaler may decide on: `utilization` (None: no data), or `held` with the numbers why."""

    utilization: float | None = None
    source: str = "group series"
    held: str | None = None
    dropped: tuple[str, ...] = ()  # the series' problems seen (for the reason and the notice)
    # Tell on-call: a node wrote what no member could (a member's own series fails, a value outside 0-100),
    # or the series cannot be checked at all. A group series over its current members' bound alone is not
    # told: a member that just left (spot reclaim, scale-in) leaves its samples there for the lookback.
    tell: bool = False
    forged: bool = False  # the told reason is evidence of forgery (else: the series cannot be checked)
    note: str = ""  # what a decision on the members' own series adds to its reason

    @property
    def trusted(self) -> bool:
        return self.held is None

    @property
    def from_group(self) -> bool:
        """The group series itself was believed (no series dropped, nothing held)."""
        return self.trusted and not self.dropped


def samples_bound(
    gpus: int,
    lookback_s: int,
    window_s: int = defaults.NODE_PUBLISH_WINDOW_S,
    per_gpu_s: float = defaults.NODE_SAMPLES_PER_GPU_S,
) -> float:
    """The most samples `gpus` GPUs publish into one series over the lookback: one per GPU per sampling
    second, plus one publish window of slack (a window that lands in the lookback's first, partial minute)."""
    return gpus * per_gpu_s * (lookback_s + window_s)


def minute_bound(
    gpus: int,
    per_gpu_s: float = defaults.NODE_SAMPLES_PER_GPU_S,
    period_s: int = defaults.METRIC_PERIOD_S,
    window_s: int = defaults.NODE_PUBLISH_WINDOW_S,
) -> float:
    """The most samples `gpus` GPUs publish into one period of a series: a window lands whole in the
    period its start falls in (windows start on the epoch's minute), with NODE_MINUTE_JITTER for one
    extra sampling round."""
    return gpus * per_gpu_s * max(period_s, window_s) * (1 + defaults.NODE_MINUTE_JITTER)


def out_of_range(stats: SeriesStats) -> str | None:
    """A value no percent series can hold (evidence of a forged datum), or None."""
    if stats.maximum is not None and stats.maximum > defaults.PERCENT_MAX:
        return f"{stats.name}: maximum {stats.maximum:g}, above {defaults.PERCENT_MAX:g}"
    if stats.minimum is not None and stats.minimum < defaults.PERCENT_MIN:
        return f"{stats.name}: minimum {stats.minimum:g}, below {defaults.PERCENT_MIN:g}"
    return None


def series_problem(stats: SeriesStats, bound: float, minute: float = math.inf) -> str | None:
    """Why the series cannot be believed (more samples over the lookback, or in one minute, than its
    publishers can write; a value outside 0-100), or None."""
    if stats.samples > bound:
        return f"{stats.name}: {stats.samples:,.0f} samples, more than the {bound:,.0f} its publishers can write"
    if stats.busiest_minute > minute:
        return (
            f"{stats.name}: {stats.busiest_minute:,.0f} samples in one minute, more than the {minute:,.0f} "
            "its publishers can write in a minute"
        )
    return out_of_range(stats)


def unknown_gpus(members: Sequence[Member]) -> str | None:
    """Why no bound can be set (an instance type whose GPUs are not known), or None."""
    unknown = sorted(m.instance_id for m in members if m.gpus is None)
    if unknown:
        return f"GPUs of {', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''} unknown: no bound to check"
    return None


def group_bound(members: Sequence[Member], lookback_s: int) -> float:
    """Every listed member may publish (InService, Pending:Wait, Standby, Terminating:Wait all run)."""
    return sum(samples_bound(m.gpus or 0, lookback_s, m.window_s, m.samples_per_gpu_s) for m in members)


def group_minute_bound(members: Sequence[Member]) -> float:
    """What every listed member may publish into one minute of the group series."""
    return sum(minute_bound(m.gpus or 0, m.samples_per_gpu_s, window_s=m.window_s) for m in members)


def member_problem(stats: SeriesStats, m: Member, lookback_s: int) -> str | None:
    """Why one member's own series cannot be believed, checked against that member's bounds, or None."""
    bound = samples_bound(m.gpus or 0, lookback_s, m.window_s, m.samples_per_gpu_s)
    minute = minute_bound(m.gpus or 0, m.samples_per_gpu_s, window_s=m.window_s)
    return unknown_gpus([m]) or series_problem(stats, bound, minute)


def group_problem(stats: SeriesStats, members: Sequence[Member], lookback_s: int) -> str | None:
    return unknown_gpus(members) or series_problem(stats, group_bound(members, lookback_s), group_minute_bound(members))


def check_group(stats: SeriesStats, members: Sequence[Member], lookback_s: int) -> Verdict | None:
    """The group series' verdict when it can be believed (its sample-weighted mean), else None: read the
    members' own series (`from_members`)."""
    if group_problem(stats, members, lookback_s) is not None:
        return None
    return Verdict(utilization=stats.mean, source=stats.name)


# Why a group series over its members' bound is no alarm by itself (the decision's reason says it).
MEMBER_LEFT = (
    "the group series holds more samples than its current members publish (a member left, or a node wrote "
    "on it): decided on the members' own series"
)


def past_ceiling(group: SeriesStats, members: Sequence[Member], lookback_s: int, max_size: int | None) -> str | None:
    """More samples than even `max_size` members of the group's largest listed type could publish over
    the lookback: no member that left explains that (evidence, told), or None."""
    if max_size is None or not members:
        return None
    # Members that left may have been larger than any listed now (a mixed-instances group losing its one
    # 8-GPU node), and the max size may have been lowered within the lookback: count every member at the
    # most GPUs an instance type has, and twice the max size.
    widest = max(members, key=lambda m: m.window_s * m.samples_per_gpu_s)
    one = samples_bound(defaults.MAX_GPUS_PER_INSTANCE, lookback_s, widest.window_s, widest.samples_per_gpu_s)
    if group.samples > defaults.CEILING_MAX_SIZE_FACTOR * max_size * one:
        return (
            f"{group.samples:,.0f} samples, more than even {defaults.CEILING_MAX_SIZE_FACTOR * max_size} members "
            f"of {defaults.MAX_GPUS_PER_INSTANCE} GPUs could publish (its max size {max_size})"
        )
    return None


def from_members(
    group: SeriesStats,
    members: Sequence[Member],
    own: Mapping[str, SeriesStats],
    lookback_s: int,
    max_size: int | None = None,
) -> Verdict:
    """The group's mean from its InService members' own series, used only when every one of them is
    clean (within its bounds, values in 0-100): a forger that spoils one member's series could otherwise
    pick which members count. Any member failing holds the group, told with the series. With them all
    clean, on-call is told only on evidence: a value outside 0-100, or more samples than the group's max
    size of members could publish (`past_ceiling`); else a member that left explains it."""
    why_group = group_problem(group, members, lookback_s) or ""
    if unknown_gpus(members) is not None:
        return Verdict(held=why_group, source="none", dropped=(why_group,), tell=True)
    serving = [m for m in members if m.in_service]
    if not serving:
        held = f"{why_group}; and the group has no InService member to check it against"
        return Verdict(held=held, source="none", dropped=(why_group,))
    stats = [own.get(m.instance_id) or SeriesStats(name=f"instance {m.instance_id}") for m in serving]
    failed = [p for m, s in zip(serving, stats, strict=True) if (p := member_problem(s, m, lookback_s))]
    if failed:
        held = (
            f"{why_group}; and {len(failed)} of {len(serving)} InService members' own series fail too "
            f"({'; '.join(failed[:3])}): a node wrote on them, the GPU series cannot be believed"
        )
        return Verdict(held=held, source="none", dropped=(why_group, *failed), tell=True, forged=True)
    samples = sum(s.samples for s in stats)
    mean = sum(s.total or 0.0 for s in stats) / samples if samples > 0 else None
    source = f"{len(serving)} of {len(serving)} InService members' own series ({why_group})"
    forged = out_of_range(group) is not None or past_ceiling(group, members, lookback_s, max_size) is not None
    note = f"{why_group}: decided on the members' own series" if forged else f"{MEMBER_LEFT} ({why_group})"
    return Verdict(utilization=mean, source=source, dropped=(why_group,), tell=forged, forged=forged, note=note)


def alarm_series(metrics: Sequence[MetricRef], ref: GroupRef) -> schema.Metric | None:
    """The group's own percent series an alarm reads, if it reads one (what any node could write on).
    Alarms on other series (another namespace, an instance's) are not checked here."""
    for m in metrics:
        if m.namespace == schema.NAMESPACE and m.name in PERCENT_SERIES and m.dimensions == ref.metric_dimensions:
            return PERCENT_SERIES[m.name]
    return None


def series_audited(decision: Decision, minute: int) -> schema.Metric | None:
    """The group series behind a utilization-band hold, checked every SERIES_AUDIT_EVERY_MIN minutes: a
    flood that pulls the group's Average into the band holds it without acting, so the acting-tick check
    alone would never see it (a silent denial of scaling). None on other ticks and decisions."""
    band_hold = decision.action is Action.HOLD and decision.trigger.kind is TriggerKind.UTILIZATION_BAND
    if band_hold and minute % defaults.SERIES_AUDIT_EVERY_MIN == 0:
        return schema.GPU_UTILIZATION
    return None


def series_acted_on(
    decision: Decision, ref: GroupRef, alarm_metrics: Mapping[str, Sequence[MetricRef]]
) -> schema.Metric | None:
    """The GPU series a decision would act on (scale out or in), or None: nothing to check."""
    if decision.action not in _ACTS:
        return None
    if decision.trigger.kind is TriggerKind.UTILIZATION_BAND:
        return schema.GPU_UTILIZATION
    if decision.trigger.kind is TriggerKind.ALARM:
        return alarm_series(alarm_metrics.get(decision.trigger.name or "", ()), ref)
    return None


def statistic_problem(metrics: Sequence[MetricRef]) -> str | None:
    """An alarm that reads a node-writable series (namespace GPUFleet) with a statistic other than
    Average: Maximum, Minimum, a percentile or a trimmed statistic follows one datum inside any sample
    bound, so such an alarm is never acted on. A statistic the delivery does not say (None) is not judged."""
    for m in metrics:
        if m.namespace == schema.NAMESPACE and m.stat and m.stat.lower() != defaults.ALARM_TRUSTED_STAT.lower():
            return (
                f"its statistic {m.stat} (on {m.name}) can be set by one datum any node may write; "
                f"use {defaults.ALARM_TRUSTED_STAT} (gpufleet alarms does)"
            )
    return None


def hold(decision: Decision, why: str) -> Decision:
    """A decision that would have acted on a GPU series that cannot be believed: a hold saying why."""
    update = {"action": Action.HOLD, "desired": decision.current, "victims": (), "needs_instance_metrics": False}
    return decision.model_copy(update={**update, "reason": f"{decision.reason}, but {why}: held"})


def doubted(decision: Decision, verdict: Verdict) -> Decision:
    """`decision` held because its series failed (the verdict's reason, or the series it dropped)."""
    return hold(
        decision, verdict.held or f"its GPU series holds data no member could publish ({'; '.join(verdict.dropped)})"
    )


def alarm_checked(decision: Decision, verdict: Verdict, condition: AlarmCondition | None) -> Decision:
    """An alarm's decision against the verdict on the series it read: as decided when the group series
    was believed; held when the series cannot be; when only the members' own series can be, it acts if
    their mean is on the alarm's side of its threshold (DescribeAlarms' Threshold and ComparisonOperator),
    else holds saying so (without a condition to weigh: the next tick decides)."""
    if verdict.from_group:
        return decision
    if verdict.held is not None:
        return doubted(decision, verdict)
    mean = verdict.utilization
    side = condition.breached(mean) if condition is not None and mean is not None else None
    if side is None or condition is None or mean is None:
        return hold(
            decision,
            f"{verdict.note}; their mean cannot be weighed against the alarm's threshold, the next tick decides",
        )
    weighed = f"their mean {mean:.1f}% {'is' if side else 'is not'} {condition.comparison} {condition.threshold:g}"
    if side:
        return decision.model_copy(update={"reason": f"{decision.reason}; {verdict.note}: {weighed}"})
    return hold(decision, f"{verdict.note}: {weighed}")
