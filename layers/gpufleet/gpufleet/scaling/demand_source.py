"""Each managed group's demand this tick (glue, the tick's hub): every group with a source handed to its
source's reader (`scaling.sources`, one per source, registered once in `READERS` under the policy's
name for it), a unit at a time, and handed to the core as `Demand` on the observation, with the instances
that run GPU pods. What the readers' answers make of each group is `scaling.demand_rules`.

Every group is read in isolation: one source's failure is its groups' alone, and the tick finishes.
A new node is room only once it is GPU-ready (`scaling.demand_share.not_gpu_ready`): the hub probes
the groups' starting nodes once per tick for every source.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger

from gpufleet.aws.clients import AWS_FAILURES, error_code
from gpufleet.aws.groups.provider import GroupShapes
from gpufleet.domain.demand_sources import SourceName
from gpufleet.domain.errors import one_line
from gpufleet.domain.models import GroupObservation
from gpufleet.domain.nodes import NodeReadiness
from gpufleet.scaling.demand_rules import READY_WITHIN, Member, Pair, Tick, keys, units
from gpufleet.scaling.demand_share import NotReady, not_gpu_ready
from gpufleet.scaling.sources import DemandSourceReader
from gpufleet.scaling.sources.base import ClusterPodsReader, InstancesOf, SourceDeps, TypeGpus, Warnings
from gpufleet.scaling.sources.kubernetes import KubernetesReader
from gpufleet.scaling.sources.metric import MetricReader
from gpufleet.scaling.sources.queue import QueueReader

# Each source's reader, registered once under the policy's name for it, in the order a tick reads them.
READERS: Mapping[SourceName, Callable[[SourceDeps], DemandSourceReader]] = {
    SourceName.KUBERNETES: KubernetesReader.of,
    SourceName.SQS: QueueReader.of,
    SourceName.METRIC: MetricReader.of,
}
# instance ids, now, within -> launch time and whether GPUs were reported within
Readiness = Callable[[Sequence[str], datetime, timedelta], Mapping[str, NodeReadiness]]


@dataclass
class DemandReader:
    """`attach(pairs, now)`: the same pairs, each observation with its group's demand (where it has a
    source) and its instances' `runs_work`."""

    sqs: Any
    cloudwatch: Any
    cluster_pods: ClusterPodsReader  # one cluster's pods, for the groups of one tick
    groups: GroupShapes  # what a group's kind says: the cluster it joins, its node shape, its GPUs per node
    instances_of: InstancesOf  # node names -> instance ids
    logger: Logger
    readiness: Readiness | None = None  # None: not probed
    tick_started: Callable[[], None] | None = None  # starts the time every cluster of one tick shares
    # instance types -> the fewest GPUs any of them has (None: not all known or GPU-less): a HyperPod
    # instance group's GPUs per node when the policy does not say it
    type_gpus: TypeGpus | None = None
    _gpu_ready: set[str] = field(default_factory=set, init=False)  # nodes that have reported GPUs
    _told: Warnings = field(init=False)
    _readers: dict[SourceName, DemandSourceReader] = field(init=False)

    def __post_init__(self) -> None:
        self._told = Warnings(self.logger)
        deps = SourceDeps(
            self.sqs, self.cloudwatch, self.cluster_pods, self.groups, self.instances_of, self.type_gpus, self._told
        )
        self._readers = {name: build(deps) for name, build in READERS.items()}

    def attach(self, pairs: Sequence[Pair], now: datetime, fallbacks: frozenset[str] = frozenset()) -> list[Pair]:
        """`fallbacks`: keys of groups that are another group's spot fallback (served after it)."""
        sourced: list[Member] = [(obs, s, s.demand) for obs, s in pairs if s.demand is not None]
        weighted = {o.ref.key: self._told.weighted(o) for o, _, _ in sourced if o.demand_refused}
        sourced = [m for m in sourced if m[0].ref.key not in weighted]
        if not sourced:
            return [(weighted.get(obs.ref.key, obs), s) for obs, s in pairs]
        if self.tick_started is not None:
            self.tick_started()
        ready = self._readiness([(o, s) for o, s, _ in sourced], now)
        run = Tick(now, fallbacks, ready)
        found: dict[str, GroupObservation] = dict(weighted)
        by_source: defaultdict[SourceName, list[Member]] = defaultdict(list)
        for m in sourced:
            by_source[m[2].source.name].append(m)
        for name, reader in self._readers.items():
            for unit in units(by_source[name], reader.unit_of):
                found.update(self._isolated(unit, reader, run))
        return [(found.get(obs.ref.key, obs), s) for obs, s in pairs]

    def _isolated(self, unit: list[Member], reader: DemandSourceReader, run: Tick) -> dict[str, GroupObservation]:
        """One source's groups read together; anything it raises makes those groups unreadable, no more."""
        try:
            return reader.read(unit, run)
        except Exception as err:  # a bug or an answer nobody foresaw: this source's groups alone
            self.logger.exception("demand source failed; its groups fail closed", extra={"groups": keys(unit)})
            why = one_line(f"reading it failed ({type(err).__name__}: {err})", limit=200)
            return {o.ref.key: self._told.unreadable(o, reader.source(d), why) for o, _, d in unit}

    def _readiness(self, groups: Sequence[Pair], now: datetime) -> dict[str, list[NotReady]]:
        """Per group, its InService nodes that are not GPU-ready (a probe that fails: none known). A node
        that has reported GPUs once is ready for good in this container and is not asked about again, so
        the probe costs a series only for nodes that are starting or never became ready."""
        if self.readiness is None:
            return {}
        serving = {i.instance_id for obs, _ in groups for i in obs.instances if i.in_service}
        self._gpu_ready &= serving  # bounded: only nodes that still serve are remembered
        ids = sorted(serving - self._gpu_ready)
        if not ids:
            return {}
        try:
            probed = self.readiness(ids, now, READY_WITHIN)
        except Exception as err:  # the probe is advice: without it every node counts as ready, as before
            why = f"failed ({error_code(err) if isinstance(err, AWS_FAILURES) else type(err).__name__})"
            self._told.warn_once("gpu-ready probe", why, "GPU-ready probe unreadable")
            return {}
        self._told.read_well("gpu-ready probe")
        self._gpu_ready |= {iid for iid, r in probed.items() if r.gpus_reported}
        return {obs.ref.key: not_gpu_ready(obs.instances, probed, now, s.gpu_ready_timeout_s) for obs, s in groups}
