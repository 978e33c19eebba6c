"""How far the scaler believes a group's GPU series before it acts on it (pure).

Any node may write any datum in the `GPUFleet` namespace: IAM scopes PutMetricData by namespace
(`cloudwatch:namespace`) and nothing finer, so a node of group `train` can write on group `infer`'s series
or on another instance's. A datum with a large SampleCount (Values=[100], Counts=[10^6]) outweighs every
honest sample in the series' Average. What a forger cannot do is put more samples into a series than the
series' own publishers could have, unseen: the members of a group are known (DescribeAutoScalingGroups),
their GPUs too (DescribeInstanceTypes), and a publisher puts one sample per GPU per sampling second into
the group series and its instance series (layers/node/gpufleet_node/aggregate.py: `Scopes.for_metric`).

So, before the scaler acts on a group's GPU series (the utilization band, an alarm on the series):
- the group series over the lookback must hold no more samples than its members can publish,
  `samples_bound` = sum over members of GPUs x samples per GPU-second x (lookback + one publish window),
  and only values in [0, 100] (Maximum, Minimum);
- if it fails, each InService member's own series (dimension InstanceId, published in every detail mode)
  is checked the same way against one member's bound; the clean members' mean is used when they are a
  majority of the InService members, else the group holds and on-call is told the numbers.

What is left to a forger under the bound: the room between what members could publish and what they did.
With every member publishing the whole lookback that is the slack of one window per member, a share of
`window / (lookback + window)` of the series' weight (60 / 360 = 1/6 at the defaults): it moves a group's
mean by at most that share of the distance to 0 or 100 (a 5 % group reads at most 20.8 %), never past a
band whose edge is further away. Members that published less (booting, the newest minute not in yet)
leave the forger their missing samples too. Forging every member's own series as well makes the group
hold (a denial of scaling, told), never scale. A forged datum over the bound is never used.

AWS alone also offers trimmed statistics with absolute bounds (`TM(0:100)`, `TC(0:100)`): they drop
values outside [0, 100] but still weigh by SampleCount, and moto cannot answer them; the bound above is
what limits the weight.

Scale-in victims are picked by their own series' Maximum (`GpuMetricsReader.instance_gpu`): beside an
honest publisher a forger can only raise a node's figure there, which keeps that node, so that read is
unchanged (a node whose own publisher is down has no figure unless a forger gives it one: docs/scaler.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpufleet.domain import defaults
from gpufleet.domain.models import Action, Decision, Frozen, GroupRef, MetricRef, SeriesStats, TriggerKind
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


class Verdict(Frozen):
    """What the scaler may decide on: `utilization` (None: no data), or `held` with the numbers why."""

    utilization: float | None = None
    source: str = "group series"
    held: str | None = None
    dropped: tuple[str, ...] = ()  # series seen forged and left out (for the notice)

    @property
    def trusted(self) -> bool:
        return self.held is None


def samples_bound(
    gpus: int,
    lookback_s: int,
    window_s: int = defaults.NODE_PUBLISH_WINDOW_S,
    per_gpu_s: float = defaults.NODE_SAMPLES_PER_GPU_S,
) -> float:
    """The most samples `gpus` GPUs publish into one series over the lookback: one per GPU per sampling
    second, plus one publish window of slack (a window that lands in the lookback's first, partial minute)."""
    return gpus * per_gpu_s * (lookback_s + window_s)


def series_problem(stats: SeriesStats, bound: float) -> str | None:
    """Why the series cannot be believed (more samples than its publishers can write, a value outside
    0-100), or None."""
    if stats.samples > bound:
        return f"{stats.name}: {stats.samples:,.0f} samples, more than the {bound:,.0f} its publishers can write"
    if stats.maximum is not None and stats.maximum > defaults.PERCENT_MAX:
        return f"{stats.name}: maximum {stats.maximum:g}, above {defaults.PERCENT_MAX:g}"
    if stats.minimum is not None and stats.minimum < defaults.PERCENT_MIN:
        return f"{stats.name}: minimum {stats.minimum:g}, below {defaults.PERCENT_MIN:g}"
    return None


def unknown_gpus(members: Sequence[Member]) -> str | None:
    """Why no bound can be set (an instance type whose GPUs are not known), or None."""
    unknown = sorted(m.instance_id for m in members if m.gpus is None)
    if unknown:
        return f"GPUs of {', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''} unknown: no bound to check"
    return None


def group_bound(members: Sequence[Member], lookback_s: int) -> float:
    """Every listed member may publish (InService, Pending:Wait, Standby, Terminating:Wait all run)."""
    return sum(samples_bound(m.gpus or 0, lookback_s, per_gpu_s=m.samples_per_gpu_s) for m in members)


def check_group(stats: SeriesStats, members: Sequence[Member], lookback_s: int) -> Verdict | None:
    """The group series' verdict when it can be believed (its sample-weighted mean), else None: read the
    members' own series (`from_members`)."""
    if unknown_gpus(members) is not None:
        return None
    if series_problem(stats, group_bound(members, lookback_s)) is not None:
        return None
    return Verdict(utilization=stats.mean, source=stats.name)


def from_members(
    group: SeriesStats, members: Sequence[Member], own: Mapping[str, SeriesStats], lookback_s: int
) -> Verdict:
    """The group's mean from its InService members' own series, each checked against one member's
    bound; used when the clean ones are a majority of the InService members, else held with the numbers."""
    gpus_unknown = unknown_gpus(members)
    why_group = gpus_unknown or series_problem(group, group_bound(members, lookback_s)) or ""
    serving = [m for m in members if m.in_service]
    clean: list[SeriesStats] = []
    dropped: list[str] = []
    for m in serving:
        stats = own.get(m.instance_id) or SeriesStats(name=f"instance {m.instance_id}")
        bound = samples_bound(m.gpus or 0, lookback_s, per_gpu_s=m.samples_per_gpu_s)
        problem = unknown_gpus([m]) or series_problem(stats, bound)
        if problem is None:
            clean.append(stats)
        else:
            dropped.append(problem)
    if not serving or 2 * len(clean) <= len(serving):
        held = (
            f"{why_group}; and {len(dropped)} of {len(serving)} InService members' own series fail too "
            f"({'; '.join(dropped[:3]) or 'no InService member'}): the GPU series cannot be believed"
        )
        return Verdict(held=held, source="none", dropped=(why_group, *dropped))
    samples = sum(s.samples for s in clean)
    total = sum(s.total or 0.0 for s in clean)
    mean = total / samples if samples > 0 else None
    source = f"{len(clean)} of {len(serving)} InService members' own series ({why_group})"
    return Verdict(utilization=mean, source=source, dropped=(why_group, *dropped))


def combine(name: str, points: Mapping[str, Sequence[float]]) -> SeriesStats:
    """One series' per-period SampleCount, Sum, Maximum and Minimum over the lookback as one summary."""
    counts, sums = points.get("SampleCount", ()), points.get("Sum", ())
    highs, lows = points.get("Maximum", ()), points.get("Minimum", ())
    return SeriesStats(
        name=name,
        samples=float(sum(counts)),
        total=float(sum(sums)) if sums else None,
        maximum=max(highs) if highs else None,
        minimum=min(lows) if lows else None,
    )


def alarm_series(metrics: Sequence[MetricRef], ref: GroupRef) -> schema.Metric | None:
    """The group's own percent series an alarm reads, if it reads one (what any node could write on).
    Alarms on other series (another namespace, an instance's) are not checked here."""
    for m in metrics:
        if m.namespace == schema.NAMESPACE and m.name in PERCENT_SERIES and m.dimensions == ref.metric_dimensions:
            return PERCENT_SERIES[m.name]
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
