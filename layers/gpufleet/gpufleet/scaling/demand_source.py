"""Each managed group's demand this tick (glue): its source read through the adapters, matched to the
group, and handed to the core as `Demand` on the observation, with the instances that run GPU pods.

- Kubernetes (EKS node groups): one pod listing per cluster however many of its groups have a source. A
  waiting pod is matched to the groups whose node shape it fits (nodeSelector, required node affinity,
  taints, GPUs per node) and counted once: for the group with the fewest GPUs per node that fits it (the
  least room left idle), then by name. Pods no managed group fits are nobody's demand here.
- SQS (ASGs): visible messages (and in-flight ones when asked), each `gpus_per_message` GPUs.
- Metric (ASGs): the GPUs waiting jobs request, the latest datum; none within 5 minutes: nothing waits.

A source that cannot be read: one WARNING per cause (again only once it has read well in between), and
the group's Demand says why, so the core falls back to its utilization rules. Nothing here decides.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aws_lambda_powertools import Logger

from gpufleet.aws.backlog import BacklogUnreadable, latest_values, queue_messages
from gpufleet.aws.clients import AWS_FAILURES, error_code
from gpufleet.aws.eks_nodes import ShapeUnknown
from gpufleet.aws.metrics import group_dimensions
from gpufleet.domain.models import Demand, GroupKind, GroupObservation, WaitingWork
from gpufleet.domain.policy import DemandSource, GroupSettings
from gpufleet.events.kubernetes import ClusterPods, ClusterUnreadable, WaitingPod
from gpufleet.scaling.demand import NodeShape, as_work, fits

Pair = tuple[GroupObservation, GroupSettings]


@dataclass
class DemandReader:
    """`attach(pairs, now)`: the same pairs, each observation with its group's demand (where it has a
    source) and its instances' `runs_gpu_work`."""

    sqs: Any
    cloudwatch: Any
    cluster_pods: Callable[[str, Mapping[str, float]], ClusterPods]  # cluster, GPU resources -> its pods
    node_shape: Callable[[str, str], NodeShape]  # cluster, node group -> what its nodes offer
    instances_of: Callable[[Iterable[str]], dict[str, str]]  # node names -> instance ids
    logger: Logger
    _warned: dict[str, str] = field(default_factory=dict)  # source -> the cause last told

    def attach(self, pairs: Sequence[Pair], now: datetime) -> list[Pair]:
        sourced = [(obs, s, s.demand) for obs, s in pairs if s.demand is not None]
        if not sourced:
            return list(pairs)
        found: dict[str, GroupObservation] = {}
        found.update(self._kubernetes([(o, d) for o, _, d in sourced if d.kubernetes is not None]))
        found.update(self._queues([(o, d) for o, _, d in sourced if d.sqs is not None]))
        found.update(self._metrics([(o, d) for o, _, d in sourced if d.metric is not None], now))
        return [(found.get(obs.ref.key, obs), s) for obs, s in pairs]

    # ---- one WARNING per cause ----

    def _unreadable(
        self, obs: GroupObservation, source: str, cause: str, gpus_per_node: float = 1.0
    ) -> GroupObservation:
        self._warn_once(source, cause, "demand source unreadable: the group falls back to its utilization rules")
        demand = Demand(source=source, gpus_per_node=gpus_per_node, unreadable=cause)
        return obs.model_copy(update={"demand": demand})

    def _warn_once(self, source: str, cause: str, message: str) -> None:
        """One WARNING per source and cause, again only once the source has read well in between."""
        if self._warned.get(source) != cause:
            self._warned[source] = cause
            self.logger.warning(message, extra={"source": source, "cause": cause})

    def _read_well(self, source: str) -> None:
        self._warned.pop(source, None)

    # ---- Kubernetes ----

    def _kubernetes(self, groups: Sequence[tuple[GroupObservation, DemandSource]]) -> dict[str, GroupObservation]:
        by_cluster: defaultdict[str, list[tuple[GroupObservation, DemandSource]]] = defaultdict(list)
        for obs, d in groups:
            if obs.ref.kind is GroupKind.EKS_NODEGROUP and obs.ref.cluster:
                by_cluster[obs.ref.cluster].append((obs, d))
        out: dict[str, GroupObservation] = {}
        for cluster, members in by_cluster.items():
            out.update(self._cluster(cluster, members))
        return out

    def _cluster(
        self, cluster: str, members: list[tuple[GroupObservation, DemandSource]]
    ) -> dict[str, GroupObservation]:
        source = f"cluster {cluster}"
        resources: dict[str, float] = {}
        for _, d in members:
            resources.update(d.kubernetes.gpu_resources if d.kubernetes else {})
        try:
            pods = self.cluster_pods(cluster, resources)
        except ClusterUnreadable as err:
            return {o.ref.key: self._unreadable(o, source, err.cause) for o, _ in members}
        self._read_well(source)
        shapes: dict[str, NodeShape] = {}
        out: dict[str, GroupObservation] = {}
        for obs, _ in members:
            try:
                shapes[obs.ref.key] = self.node_shape(cluster, obs.ref.name)
            except ShapeUnknown as err:
                out[obs.ref.key] = self._unreadable(obs, f"node group {obs.ref.key}", str(err))
        owners = assign(pods.waiting, shapes)
        running = self._running(cluster, pods)
        for obs, _ in members:
            shape = shapes.get(obs.ref.key)
            if shape is None:
                continue
            waiting = tuple(as_work(p) for p in owners.get(obs.ref.key, ()))
            ids = {i.instance_id for i in obs.instances}
            busy = ids if running is None else running & ids  # unknown: every node counts as running work
            instances = tuple(i.model_copy(update={"runs_gpu_work": i.instance_id in busy}) for i in obs.instances)
            # An InService node without a GPU pod is room: a pod that still waits beside it will not be
            # placed by one more node either (it waits for CPU, a volume's zone, ...): no runaway scale-out.
            free = tuple(shape.gpus for i in instances if i.in_service and not i.runs_gpu_work)
            demand = Demand(source=source, waiting=waiting, gpus_per_node=shape.gpus, free_gpus=free, knows_nodes=True)
            out[obs.ref.key] = obs.model_copy(update={"demand": demand, "instances": instances})
        return out

    def _running(self, cluster: str, pods: ClusterPods) -> set[str] | None:
        """Instance ids bound to GPU pods; None (fail closed: no node may go) when a node name cannot be
        mapped to an instance or EC2 cannot be read."""
        if not pods.gpu_nodes:
            return set()
        source = f"nodes of cluster {cluster}"
        try:
            found = self.instances_of(pods.gpu_nodes)
        except AWS_FAILURES as err:
            why = f"DescribeInstances failed ({error_code(err)}): no node may be removed"
            self._warn_once(source, why, "demand source partly unreadable")
            return None
        unmapped = sorted(set(pods.gpu_nodes) - set(found))
        if unmapped:
            why = (
                f"{len(unmapped)} GPU node name(s) match no EC2 private DNS name ({unmapped[0]}...): "
                "no node may be removed"
            )
            self._warn_once(source, why, "demand source partly unreadable")
            return None
        self._read_well(source)
        return set(found.values())

    # ---- plain ASGs ----

    def _queues(self, groups: Sequence[tuple[GroupObservation, DemandSource]]) -> dict[str, GroupObservation]:
        out: dict[str, GroupObservation] = {}
        for obs, d in groups:
            assert d.sqs is not None
            name = d.sqs.queue_url.rstrip("/").rsplit("/", 1)[-1]
            source = f"queue {name}"
            if d.gpus_per_node is None:
                out[obs.ref.key] = self._unreadable(obs, source, "demand.gpus_per_node is not set for this ASG")
                continue
            try:
                count = queue_messages(self.sqs, d.sqs.queue_url, d.sqs.in_flight)
            except BacklogUnreadable as err:
                out[obs.ref.key] = self._unreadable(obs, source, err.why, d.gpus_per_node)
                continue
            self._read_well(source)
            waiting = (WaitingWork(name=source, gpus=d.sqs.gpus_per_message, count=count),) if count else ()
            demand = Demand(source=source, noun="message", waiting=waiting, gpus_per_node=d.gpus_per_node)
            out[obs.ref.key] = obs.model_copy(update={"demand": demand})
        return out

    def _metrics(
        self, groups: Sequence[tuple[GroupObservation, DemandSource]], now: datetime
    ) -> dict[str, GroupObservation]:
        if not groups:
            return {}
        specs = []
        for obs, d in groups:
            assert d.metric is not None
            dims = d.metric.dimensions if d.metric.dimensions is not None else group_dimensions(obs.ref)
            specs.append((d.metric.namespace, d.metric.metric_name, dims))
        try:
            values = latest_values(self.cloudwatch, specs, now)
        except BacklogUnreadable as err:
            return {o.ref.key: self._unreadable(o, _metric_source(d), err.why) for o, d in groups}
        out: dict[str, GroupObservation] = {}
        for (obs, d), value in zip(groups, values, strict=True):
            assert d.metric is not None
            source = _metric_source(d)
            if d.gpus_per_node is None:
                out[obs.ref.key] = self._unreadable(obs, source, "demand.gpus_per_node is not set for this ASG")
                continue
            if value is None:  # a dead publisher must not read as "nothing waits" (and mute the band)
                why = "no datum in the last 5 minutes: is its publisher running?"
                out[obs.ref.key] = self._unreadable(obs, source, why, d.gpus_per_node)
                continue
            self._read_well(source)
            gpus = math.ceil(value or 0)
            waiting = (WaitingWork(name=source, gpus=1, count=gpus),) if gpus else ()
            demand = Demand(source=source, noun="GPU", waiting=waiting, gpus_per_node=d.gpus_per_node)
            out[obs.ref.key] = obs.model_copy(update={"demand": demand})
        return out


def _metric_source(d: DemandSource) -> str:
    return f"metric {d.metric.namespace}/{d.metric.metric_name}" if d.metric else "metric"


def assign(waiting: Iterable[WaitingPod], shapes: Mapping[str, NodeShape]) -> dict[str, list[WaitingPod]]:
    """Each waiting pod to one group it fits: the fewest GPUs per node, then the group's key."""
    owners: defaultdict[str, list[WaitingPod]] = defaultdict(list)
    for pod in waiting:
        fitting = sorted((shape.gpus, key) for key, shape in shapes.items() if fits(pod, shape))
        if fitting:
            owners[fitting[0][1]].append(pod)
    return owners
