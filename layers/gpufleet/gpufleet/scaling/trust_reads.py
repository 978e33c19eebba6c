"""The metric-trust check run over what the metrics adapter reads: the series a decision would act on,
checked against what the group's members can publish (`metric_trust`), reading the members' own series
only where the group's fails. Glue: it calls CloudWatch through `aws.metrics`; the rule stays pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.domain import defaults
from gpufleet.domain.models import GroupObservation, InstanceObservation
from gpufleet.scaling.metric_trust import Member, Verdict, check_group, from_members
from gpufleet_node import schema


def members(
    metrics: GpuMetricsReader,
    instances: Sequence[InstanceObservation],
    per_gpu_s: float = defaults.NODE_SAMPLES_PER_GPU_S,
    window_s: int = defaults.NODE_PUBLISH_WINDOW_S,
) -> list[Member]:
    """The group's listed instances with their GPUs (None where the type cannot be told)."""
    types = sorted({i.instance_type for i in instances if i.instance_type})
    known: Mapping[str, int] = {}
    if types and metrics.gpus_per_type is not None:
        known = metrics.gpus_per_type(types)
    return [
        Member(
            instance_id=i.instance_id,
            gpus=known.get(i.instance_type) if i.instance_type else None,
            in_service=i.in_service,
            samples_per_gpu_s=per_gpu_s,
            window_s=window_s,
        )
        for i in instances
    ]


def verdicts(
    metrics: GpuMetricsReader,
    wanted: Mapping[str, tuple[GroupObservation, schema.Metric]],
    end: datetime,
    lookback_s: int,
    per_gpu_s: float = defaults.NODE_SAMPLES_PER_GPU_S,
    window_s: int = defaults.NODE_PUBLISH_WINDOW_S,
) -> dict[str, Verdict]:
    """Per group key: the series its decision would act on, checked (`metric_trust`): one batched read
    of the groups' series (4 metrics each), and of the InService members' own where a group's fails."""
    groups = metrics.group_checks({k: (obs.ref, m) for k, (obs, m) in wanted.items()}, end, lookback_s)
    listed = {k: members(metrics, obs.instances, per_gpu_s, window_s) for k, (obs, _) in wanted.items()}
    out: dict[str, Verdict] = {}
    failing: dict[str, schema.Metric] = {}
    for key in wanted:
        verdict = check_group(groups[key], listed[key], lookback_s)
        if verdict is None:
            failing[key] = wanted[key][1]
        else:
            out[key] = verdict
    for metric in {m.name: m for m in failing.values()}.values():
        keys = [k for k, m in failing.items() if m.name == metric.name]
        ids = [m.instance_id for k in keys for m in listed[k] if m.in_service]
        own = metrics.member_checks(ids, metric, end, lookback_s) if ids else {}
        for key in keys:
            out[key] = from_members(groups[key], listed[key], own, lookback_s, wanted[key][0].max_size)
    return out
