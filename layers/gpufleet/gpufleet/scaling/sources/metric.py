"""A backlog metric a scheduler publishes (`demand.metric`): the GPUs waiting jobs request, the latest
datum; none within 5 minutes, or one that is no count: unreadable. The groups that read one series split
it in order (`scaling.demand_share`); a scheduler's pending jobs already found no room on their nodes."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from gpufleet.aws.backlog import BacklogUnreadable, latest_values
from gpufleet.aws.metrics import group_dimensions
from gpufleet.domain.models import GroupObservation
from gpufleet.policy.fleet import DemandSource, MetricDemand
from gpufleet.scaling.demand_rules import Member, Tick, backlog_problem, shared
from gpufleet.scaling.demand_share import bounded_count
from gpufleet.scaling.sources.base import Sizes, SourceDeps, Warnings


@dataclass(frozen=True)
class MetricReader:
    """One metric series' groups from one read of its latest datum."""

    cloudwatch: Any
    sizes: Sizes
    told: Warnings

    @classmethod
    def of(cls, deps: SourceDeps) -> MetricReader:
        return cls(deps.cloudwatch, deps.sizes, deps.told)

    def unit_of(self, obs: GroupObservation, d: DemandSource) -> Hashable:
        metric = _metric(d)
        return (metric.namespace, metric.metric_name, tuple(sorted(_dimensions(obs, metric).items())))

    def source(self, d: DemandSource) -> str:
        return f"metric {_metric(d).namespace}/{_metric(d).metric_name}"

    def read(self, unit: list[Member], run: Tick) -> dict[str, GroupObservation]:
        obs, _, d = unit[0]
        metric, source = _metric(d), self.source(d)
        out, sized = self.sizes.sized(unit, self.told, source, "demand.gpus_per_node is not set for this group")
        if not sized:
            return out
        namespace, why = self.sizes.groups.metric_namespace(obs, metric.namespace)
        if namespace is None:  # a scheduler's report whose writer cannot be told (HyperPod: no controller)
            return out | self.told.all_unreadable(sized, source, why)
        try:
            series = (namespace, metric.metric_name, _dimensions(obs, metric))
            [value] = latest_values(self.cloudwatch, [series], run.now)
        except BacklogUnreadable as err:
            return out | self.told.all_unreadable(sized, source, err.why)
        problem = backlog_problem(value)
        if problem is not None or value is None:
            return out | self.told.all_unreadable(sized, source, problem or "")
        self.told.read_well(source)
        per = {m[0].ref.key: 1.0 for m, _ in sized}
        return out | shared(sized, run, source, "GPU", per, bounded_count(value), 0, room=False)


def _metric(d: DemandSource) -> MetricDemand:
    """The series of a group this reader was handed (the hub hands it only groups of `demand.metric`)."""
    spec = d.source
    assert isinstance(spec, MetricDemand), spec
    return spec


def _dimensions(obs: GroupObservation, metric: MetricDemand) -> dict[str, str]:
    """The series' dimensions: the rule's, else the group's own (as the node publisher sends them)."""
    return metric.dimensions if metric.dimensions is not None else group_dimensions(obs.ref)
