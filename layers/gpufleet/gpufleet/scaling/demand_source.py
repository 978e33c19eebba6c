"""Each managed group's demand this tick (glue): its source read through the adapters, matched to the
group, and handed to the core as `Demand` on the observation, with the instances that run GPU pods.

One model for every source, whose invariants are property-tested (tests/unit/scaling/test_demand_invariants.py):
- a node that may run work is never a victim: a source that cannot say which nodes run work (unreadable,
  a node name EC2 does not map, a throttled lookup) closes its groups for scale-in, and that never takes
  room away (protection and room are separate facts);
- running work is never counted as waiting; a unit of work counts for one group only; groups that share a
  source split it in a stated order (`scaling.demand_share`);
- every number from outside gives a bounded answer or one "unreadable" line;
- every group is read in isolation: one source's failure is its groups' alone, and the tick finishes.

Sources:
- Kubernetes (EKS managed node groups, and self-managed ASGs whose nodes join a cluster: `joined_cluster`):
  one pod listing per cluster however many of its groups have a source, whichever their kind. A waiting pod
  is matched to the groups whose node shape it fits and counted once (`assign`).
- SQS (ASGs, node groups): visible messages wait; in-flight ones run (they hold nodes, never ask for more).
- Metric: the GPUs waiting jobs request, the latest datum; none within 5 minutes: unreadable.
A new node is room only once it is GPU-ready (`scaling.demand_share.not_gpu_ready`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger

from gpufleet.aws.asg_shape import cluster_of
from gpufleet.aws.backlog import BacklogUnreadable, latest_values, queue_counts
from gpufleet.aws.clients import AWS_FAILURES, error_code
from gpufleet.aws.eks_nodes import ShapeUnknown
from gpufleet.aws.metrics import group_dimensions
from gpufleet.domain.errors import ClusterUnreadable, one_line
from gpufleet.domain.models import (
    Demand,
    GroupKind,
    GroupObservation,
    MarkChannel,
    NodeMark,
    NodeNotice,
    QueuedSource,
    UnfitWork,
    WaitingWork,
)
from gpufleet.domain.nodes import NodeReadiness, NodeShape
from gpufleet.kubernetes.pods import ClusterPods, NodeListing
from gpufleet.policy.fleet import Consolidation, DemandSource, GroupSettings
from gpufleet.scaling.core import effective_bounds
from gpufleet.scaling.demand_share import NotReady, Sharer, bounded_count, not_gpu_ready, split_backlog
from gpufleet.scaling.fit import Assignment, assign

Pair = tuple[GroupObservation, GroupSettings]
# A node that sent no GPU metric in this long has not reported its GPUs (CloudWatch bills the series read,
# not the window, so a long window costs what a short one does).
READY_WITHIN = timedelta(hours=3)
Member = tuple[GroupObservation, GroupSettings, DemandSource]
Sized = tuple[Member, float]  # a group of a backlog source, with its GPUs per node
_NO_GPN = "GPUs per node unknown: set demand.gpus_per_node (an ASG's is never guessed from the instances it runs)"


@dataclass
class _Warnings:
    """One WARNING per source and cause, and a group's demand when its source cannot be read."""

    logger: Logger
    _warned: dict[str, str] = field(default_factory=dict, init=False)  # source -> the cause last told

    def _unreadable(
        self, obs: GroupObservation, source: str, cause: str, gpus_per_node: float = 1.0
    ) -> GroupObservation:
        self._warn_once(source, cause, "demand source unreadable: no node of its groups may be removed")
        demand = Demand(source=source, gpus_per_node=gpus_per_node, unreadable=cause)
        return obs.model_copy(update={"demand": demand})

    def _warn_once(self, source: str, cause: str, message: str) -> None:
        """One WARNING per source and cause, again only once the source has read well in between."""
        if self._warned.get(source) != cause:
            self._warned[source] = cause
            self.logger.warning(message, extra={"source": source, "cause": cause})

    def _read_well(self, source: str) -> None:
        self._warned.pop(source, None)

    def _weighted(self, obs: GroupObservation) -> GroupObservation:
        """A group whose desired counts weight units: its demand is not read (told once, fails closed)."""
        return self._unreadable(obs, f"group {obs.ref.key}", str(obs.demand_refused))

    def _tell_shape(self, key: str) -> Callable[[str], None]:
        """Where a self-managed ASG's shape tells what its tags say that is not used: once per group."""
        return lambda line: self._warn_once(f"node template of {key}", line, "ASG tags not used for its node shape")

    def _listing(
        self,
        read: Callable[..., ClusterPods],
        cluster: str,
        resources: Mapping[str, float],
        attrition: bool,
        queued: tuple[frozenset[QueuedSource], datetime] | None = None,
    ) -> ClusterPods:
        """The cluster's pods (ClusterUnreadable raised), and its nodes: all of them when a group of it
        drains by attrition, else only those gpufleet labelled closed (so a switch to `consolidate: off`
        still finds and reopens them). A node listing that fails is told once and leaves the marks unknown.
        `queued`: the queueing systems whose jobs its groups count (and now), read with the pods."""
        source, marks = f"cluster {cluster}", f"node marks of cluster {cluster}"
        listing = NodeListing.ALL if attrition else NodeListing.DRAINED
        extra: dict[str, Any] = {"queued": queued[0], "now": queued[1]} if queued and queued[0] else {}
        pods = read(cluster, resources, nodes=listing, **extra)
        self._read_well(source)
        if pods.nodes is not None:
            self._read_well(marks)
        elif attrition or pods.nodes_unreadable:
            said = "no node of the cluster drains" if attrition else "a node gpufleet closed is not reopened"
            self._warn_once(
                marks, pods.nodes_unreadable or "the node listing was not read", f"node marks unknown: {said}"
            )
        return pods

    def _running(
        self, instances_of: Callable[[Iterable[str]], dict[str, str]], cluster: str, pods: ClusterPods
    ) -> tuple[dict[str, str], str | None, int]:
        """Node name -> instance id of the nodes bound to GPU pods, and why no node may be removed when that
        cannot be told for every GPU pod (a node name EC2 does not map, EC2 unreadable). The ids found
        still mark their nodes; the others' room is left as it is."""
        if not pods.gpu_nodes:
            return {}, None, 0
        source = f"nodes of cluster {cluster}"
        try:
            found = instances_of(pods.gpu_nodes)
        except AWS_FAILURES as err:
            why = f"DescribeInstances failed ({error_code(err)}): which nodes run GPU pods is unknown"
            self._warn_once(source, why, "demand source partly unreadable")
            return {}, why, 0
        unmapped = sorted(set(pods.gpu_nodes) - set(found))
        if unmapped:
            why = (
                f"{len(unmapped)} node name(s) with GPU pods match no EC2 private DNS name ({unmapped[0]}...): "
                "one of them may be this group's"
            )
            self._warn_once(source, why, "demand source partly unreadable")
            return dict(found), why, len(unmapped)
        self._read_well(source)
        return dict(found), None, 0


@dataclass
class DemandReader(_Warnings):
    """`attach(pairs, now)`: the same pairs, each observation with its group's demand (where it has a
    source) and its instances' `runs_gpu_work`."""

    sqs: Any
    cloudwatch: Any
    # cluster, GPU resources[, nodes=NodeListing: which nodes' cordons to list too] -> its pods
    cluster_pods: Callable[..., ClusterPods]
    # cluster, node group[, allocatable overrides] -> what its nodes offer
    node_shape: Callable[..., NodeShape]
    instances_of: Callable[[Iterable[str]], dict[str, str]]  # node names -> instance ids
    # instance ids, now, within -> launch time and whether GPUs were reported within (None: not probed)
    readiness: Callable[[Sequence[str], datetime, timedelta], Mapping[str, NodeReadiness]] | None = None
    tick_started: Callable[[], None] | None = None  # starts the time every cluster of one tick shares
    # instance types -> the fewest GPUs any of them has (None: not all known or GPU-less): a HyperPod
    # instance group's or an ASG's GPUs per node when the policy does not say it
    type_gpus: Callable[[Sequence[str]], float | None] | None = None
    _gpu_ready: set[str] = field(default_factory=set, init=False)  # nodes that have reported GPUs

    def attach(self, pairs: Sequence[Pair], now: datetime, fallbacks: frozenset[str] = frozenset()) -> list[Pair]:
        """`fallbacks`: keys of groups that are another group's spot fallback (served after it)."""
        sourced: list[Member] = [(obs, s, s.demand) for obs, s in pairs if s.demand is not None]
        weighted = {o.ref.key: self._weighted(o) for o, _, _ in sourced if o.demand_refused}
        sourced = [m for m in sourced if m[0].ref.key not in weighted]
        if not sourced:
            return [(weighted.get(obs.ref.key, obs), s) for obs, s in pairs]
        if self.tick_started is not None:
            self.tick_started()
        ready = self._readiness([(o, s) for o, s, _ in sourced], now)
        run = _Tick(now, fallbacks, ready)
        found: dict[str, GroupObservation] = dict(weighted)
        kinds = (
            ("cluster", self._kubernetes, [m for m in sourced if m[2].kubernetes is not None]),
            ("queue", self._queues, [m for m in sourced if m[2].sqs is not None]),
            ("metric", self._metrics, [m for m in sourced if m[2].metric is not None]),
        )
        for name, read, members in kinds:
            for unit in _units(name, members):
                found.update(self._isolated(unit, read, run))
        return [(found.get(obs.ref.key, obs), s) for obs, s in pairs]

    def _isolated(
        self, unit: list[Member], read: Callable[[list[Member], _Tick], dict[str, GroupObservation]], run: _Tick
    ) -> dict[str, GroupObservation]:
        """One source's groups read together; anything it raises makes those groups unreadable, no more."""
        try:
            return read(unit, run)
        except Exception as err:  # a bug or an answer nobody foresaw: this source's groups alone
            self.logger.exception("demand source failed; its groups fail closed", extra={"groups": _keys(unit)})
            why = one_line(f"reading it failed ({type(err).__name__}: {err})", limit=200)
            return {o.ref.key: self._unreadable(o, _source_name(d), why) for o, _, d in unit}

    # ---- GPU-ready nodes ----

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
            self._warn_once("gpu-ready probe", why, "GPU-ready probe unreadable")
            return {}
        self._read_well("gpu-ready probe")
        self._gpu_ready |= {iid for iid, r in probed.items() if r.gpus_reported}
        return {obs.ref.key: not_gpu_ready(obs.instances, probed, now, s.gpu_ready_timeout_s) for obs, s in groups}

    # ---- Kubernetes ----

    def _kubernetes(self, members: list[Member], run: _Tick) -> dict[str, GroupObservation]:
        """One cluster's groups (managed node groups and self-managed ASGs alike) from one pod listing."""
        out: dict[str, GroupObservation] = {}
        joined: list[Member] = []
        for m in members:
            cluster, why = joined_cluster(m[0], m[2])
            if cluster is None:
                out[m[0].ref.key] = self._unreadable(m[0], f"pods of {m[0].ref.key}", why)
            else:
                joined.append(m)
        if not joined:
            return out
        cluster = str(joined_cluster(joined[0][0], joined[0][2])[0])
        source = f"cluster {cluster}"
        resources: dict[str, float] = {}
        for _, _, d in joined:
            resources.update(d.kubernetes.gpu_resources if d.kubernetes else {})
        attrition = any(s.consolidate is Consolidation.ATTRITION for _, s, _ in joined)
        queued = frozenset(q for _, _, d in joined if d.kubernetes for q in d.kubernetes.queued)
        try:
            pods = self._listing(self.cluster_pods, cluster, resources, attrition, (queued, run.now))
        except ClusterUnreadable as err:
            return out | {o.ref.key: self._unreadable(o, source, err.cause) for o, _, _ in joined}
        shapes, unknown = _node_shapes(self.node_shape, cluster, joined, self._tell_shape)
        for obs, _, _ in joined:
            if obs.ref.key in unknown:
                out[obs.ref.key] = self._unreadable(obs, *unknown[obs.ref.key])
        named, closed, unmapped = self._running(self.instances_of, cluster, pods)
        running = set(named.values())
        held = _holdings(pods, named, closed)
        room = _room(joined, shapes, running | held.other, run.now)
        cutoff = min((d.kubernetes.expendable_priority for _, _, d in joined if d.kubernetes), default=-10)
        most = {o.ref.key: effective_bounds(o, s, run.now).max for o, s, _ in joined}
        counts = {o.ref.key: frozenset(q.value for q in d.kubernetes.queued) for o, _, d in joined if d.kubernetes}
        assigned = assign(pods.waiting, shapes, room, pods.daemonsets, cutoff, most, (pods.queued_gangs, counts))
        if assigned.unfit:
            self._warn_once(f"unfit pods of {source}", assigned.unfit[0].key, "waiting pods fit no group")
        for obs, settings, _ in joined:
            shape = shapes.get(obs.ref.key)
            if shape is not None:
                marked = _with_holdings(obs, held).model_copy(update={"cluster": cluster})
                # Attrition with the cordons unknown: an idle node may be one gpufleet closed (no pod lands
                # there, and nothing reopens it): none is room, so waiting work gets a launch.
                blind = settings.consolidate is Consolidation.ATTRITION and not held.listed
                demand = _pod_demand(marked, shape, (running, closed, unmapped), assigned, source, run)
                demand = _with_queue_notes(demand, cluster, pods)
                out[obs.ref.key] = _without_room(demand) if blind else demand
        return out

    # ---- queues and metrics ----

    def _queues(self, members: list[Member], run: _Tick) -> dict[str, GroupObservation]:
        d = members[0][2]
        assert d.sqs is not None
        source = _source_name(d)
        out, sized = self._sized(members, source)
        if not sized:
            return out
        try:
            visible, in_flight = queue_counts(self.sqs, d.sqs.queue_url)
        except BacklogUnreadable as err:
            return out | self._all_unreadable(sized, source, err.why)
        self._read_well(source)
        per = {m[0].ref.key: (m[2].sqs.gpus_per_message if m[2].sqs else 1.0) for m, _ in sized}
        return out | _shared(sized, run, source, "message", per, bounded_count(visible), bounded_count(in_flight))

    def _metrics(self, members: list[Member], run: _Tick) -> dict[str, GroupObservation]:
        d = members[0][2]
        assert d.metric is not None
        dims = d.metric.dimensions if d.metric.dimensions is not None else group_dimensions(members[0][0].ref)
        source = _source_name(d)
        out, sized = self._sized(members, source, "demand.gpus_per_node is not set for this group")
        if not sized:
            return out
        try:
            [value] = latest_values(self.cloudwatch, [(d.metric.namespace, d.metric.metric_name, dims)], run.now)
        except BacklogUnreadable as err:
            return out | self._all_unreadable(sized, source, err.why)
        if value is None:  # a dead publisher must not read as "nothing waits" (and mute the band)
            return out | self._all_unreadable(
                sized, source, "no datum in the last 5 minutes: is its publisher running?"
            )
        if math.isnan(value) or value < 0:  # never "nothing waits": a backlog is a count
            return out | self._all_unreadable(sized, source, f"the latest datum is {value:g}, not a count of GPUs")
        self._read_well(source)
        per = {m[0].ref.key: 1.0 for m, _ in sized}
        return out | _shared(sized, run, source, "GPU", per, bounded_count(value), 0, room=False)

    def _sized(
        self, members: list[Member], source: str, why: str = _NO_GPN
    ) -> tuple[dict[str, GroupObservation], list[Sized]]:
        """The groups whose GPUs per node are known, with them; the others unreadable, saying `why`."""
        out: dict[str, GroupObservation] = {}
        sized: list[Sized] = []
        for m in members:
            gpn = _gpus_per_node(self.node_shape, m[0], m[2], self.type_gpus or _no_type_gpus)
            if gpn is None:
                out[m[0].ref.key] = self._unreadable(m[0], source, why)
            else:
                sized.append((m, gpn))
        return out, sized

    def _all_unreadable(self, sized: list[Sized], source: str, why: str) -> dict[str, GroupObservation]:
        return {m[0].ref.key: self._unreadable(m[0], source, why, gpn) for m, gpn in sized}


@dataclass(frozen=True)
class _Starting:
    ids: tuple[str, ...] = ()  # on the way: not room, not victims
    notices: tuple[NodeNotice, ...] = ()  # past the timeout: told, counted as nothing

    @property
    def no_room(self) -> set[str]:
        """Nodes whose room waiting work cannot use: starting, or never ready."""
        return {*self.ids, *(n.instance_id for n in self.notices)}


@dataclass(frozen=True)
class _Tick:
    now: datetime
    fallbacks: frozenset[str]
    ready: Mapping[str, list[NotReady]]

    def not_ready(self, key: str, instances: Iterable[Any]) -> _Starting:
        """The group's nodes that are not GPU-ready, less those a GPU pod is bound to now."""
        busy = {i.instance_id for i in instances if i.runs_gpu_work}
        found = [n for n in self.ready.get(key, []) if n.instance_id not in busy]
        notices = tuple(
            NodeNotice(
                key=f"gpu-not-ready/{n.instance_id}",
                instance_id=n.instance_id,
                text=(
                    f"{n.instance_id} ({key}) launched {n.age_s // 60} min ago and is not GPU-ready: {n.said}; "
                    "it no longer counts as capacity"
                ),
            )
            for n in found
            if n.overdue
        )
        on_the_way = tuple(n.instance_id for n in found if not n.overdue or n.again)
        return _Starting(ids=on_the_way, notices=notices)


def _shared(
    sized: list[Sized],
    run: _Tick,
    source: str,
    noun: str,
    unit_gpus: Mapping[str, float],
    visible: int,
    in_flight: int,
    room: bool = True,
) -> dict[str, GroupObservation]:
    """A backlog read by one or more groups, split in order; `room`: the groups' serving nodes take
    waiting work first (a queue's runners do; a scheduler's pending jobs already found none)."""
    starting = {obs.ref.key: run.not_ready(obs.ref.key, obs.instances) for (obs, _, _), _ in sized}
    sharers = [_sharer(m, gpn, unit_gpus[m[0].ref.key], starting[m[0].ref.key], run, room) for m, gpn in sized]
    shares = split_backlog(sharers, visible, in_flight)
    said = f"{source}: {visible} waiting, {in_flight} running" if noun == "message" else source
    out: dict[str, GroupObservation] = {}
    for (obs, _, _), gpn in sized:
        share, key = shares[obs.ref.key], obs.ref.key
        waiting = (WaitingWork(name=source, gpus=unit_gpus[key], count=share.waiting),) if share.waiting else ()
        demand = Demand(
            source=said,
            noun=noun,
            waiting=waiting,
            gpus_per_node=gpn,
            held_nodes=share.held_nodes,
            not_ready=starting[key].ids,
            never_ready=starting[key].notices,
        )
        out[key] = obs.model_copy(update={"demand": demand})
    return out


def _no_type_gpus(types: Sequence[str]) -> float | None:
    return None


def _gpus_per_node(
    node_shape: Callable[[str, str], NodeShape],
    obs: GroupObservation,
    d: DemandSource,
    type_gpus: Callable[[Sequence[str]], float | None],
) -> float | None:
    """The policy's gpus_per_node, else an EKS node group's instance types' (its node shape), else a
    HyperPod instance group's one type's. Not an ASG's: the types it runs now (or lists in overrides) need
    not be what it launches next (a launch template moved on, attribute-based types), so it says it."""
    if d.gpus_per_node is not None:
        return d.gpus_per_node
    if obs.ref.kind is GroupKind.EKS_NODEGROUP and obs.ref.cluster:
        try:
            return node_shape(obs.ref.cluster, obs.ref.name).gpus
        except ShapeUnknown:
            return None
    if obs.ref.kind is GroupKind.HYPERPOD and obs.instance_types:
        return type_gpus(obs.instance_types)
    return None


def _sharer(m: Member, gpn: float, unit: float, starting: _Starting, run: _Tick, room: bool) -> Sharer:
    """One group of a shared backlog: its units per node, its ready and serving nodes, what is coming."""
    obs, s, d = m
    serving = [i for i in obs.instances if i.in_service]
    ready = sum(1 for i in serving if i.instance_id not in starting.no_room)
    listed = sum(1 for i in obs.instances if not i.lifecycle_state.startswith("Terminat"))
    pending = sum(1 for i in obs.instances if i.lifecycle_state.startswith("Pending"))
    per_node = int((gpn + 1e-9) // unit)
    return Sharer(
        key=obs.ref.key,
        order=d.order,
        fallback=obs.ref.key in run.fallbacks,
        per_node=per_node,
        nodes_per_unit=1 if per_node else max(1, math.ceil(unit / gpn - 1e-9)),
        ready=ready if room else 0,
        in_service=len(serving),
        coming=pending + max(0, obs.desired - listed) + len(starting.ids),
        growth=_growth(obs, s, run.now),
    )


@dataclass(frozen=True)
class _Holdings:
    """What the cluster says of each of its instances for consolidation: its node name, the GPUs its pods
    hold (None: not known for every GPU pod), its cordon; `listed`: the nodes were read (marks known)."""

    names: Mapping[str, str]  # instance id -> node name
    gpus: Mapping[str, float]  # node name -> GPUs held
    marks: Mapping[str, NodeMark]  # instance id -> whose cordon (only cordoned ones)
    listed: bool
    known: bool  # every GPU pod's node is mapped: a node not named holds none

    @property
    def other(self) -> set[str]:
        """Instances someone else cordoned: never room, and gpufleet cannot open them."""
        return {iid for iid, m in self.marks.items() if m is NodeMark.OTHER}


def _holdings(pods: ClusterPods, named: Mapping[str, str], closed: str | None) -> _Holdings:
    """Node names from the GPU nodes EC2 mapped and, when the nodes were listed, from each node's
    providerID; marks from the listing: our label or annotation on a cordoned node is gpufleet's, a cordon
    without them someone else's."""
    names = {iid: name for name, iid in named.items()}
    marks: dict[str, NodeMark] = {}
    for node in (pods.nodes or {}).values():
        if node.instance_id is None:
            continue
        names.setdefault(node.instance_id, node.name)
        if node.unschedulable:
            marks[node.instance_id] = NodeMark.GPUFLEET if node.ours else NodeMark.OTHER
    # A GPU node whose pods' GPUs were not tallied (a source that names nodes only) holds an unknown amount.
    known = closed is None and set(named) <= set(pods.gpus_held)
    return _Holdings(names=names, gpus=dict(pods.gpus_held), marks=marks, listed=pods.nodes is not None, known=known)


def _with_holdings(obs: GroupObservation, held: _Holdings) -> GroupObservation:
    """Each instance's node name, GPUs held (0.0 with no GPU pod; None when a GPU pod's node is not known,
    or when it maps to no node: not registered yet, or not listed; it cannot be marked either) and mark;
    the group's marks channel only when its nodes were listed (else unknown: nothing drains)."""
    instances = []
    for i in obs.instances:
        name = held.names.get(i.instance_id)
        gpus = None if name is None else held.gpus.get(name, 0.0 if held.known else None)
        mark = held.marks.get(i.instance_id, NodeMark.NONE)
        instances.append(i.model_copy(update={"gpus_held": gpus, "mark": mark, "node_name": name}))
    marks = MarkChannel.KUBERNETES if held.listed else None
    return obs.model_copy(update={"instances": tuple(instances), "marks": marks})


def _room(joined: list[Member], shapes: Mapping[str, NodeShape], taken: set[str], now: datetime) -> dict[str, int]:
    """What each group can still bring: nodes it may add, and its serving nodes that are not `taken` (a GPU
    pod on them, or cordoned by someone else: gpufleet's own cordons it may lift)."""
    return {
        o.ref.key: _growth(o, s, now) + sum(1 for i in o.instances if i.in_service and i.instance_id not in taken)
        for o, s, _ in joined
        if o.ref.key in shapes
    }


def _pod_demand(
    obs: GroupObservation,
    shape: NodeShape,
    nodes: tuple[set[str], str | None, int],
    assigned: Assignment,
    source: str,
    run: _Tick,
) -> GroupObservation:
    """One node group's demand from its cluster's pods: the pods it owns, its nodes that run GPU pods
    (`nodes`: instance ids, why scale-in is closed if that is not known for every GPU pod, and how many
    GPU node names did not map), and room."""
    running, closed, unmapped = nodes
    instances = tuple(i.model_copy(update={"runs_gpu_work": i.instance_id in running}) for i in obs.instances)
    starting = run.not_ready(obs.ref.key, instances)
    # An InService, GPU-ready node without a GPU pod is room: a pod that still waits beside it will not be
    # placed by one more node either (it waits for CPU, a volume's zone, ...): no runaway scale-out. A GPU
    # pod on a node name EC2 does not map may be on one of them (a custom hostname): one node of room less
    # per such name, so a doubt launches at most that many nodes, once, and never hides a full group.
    # A cordoned node (by gpufleet or anyone) takes no new pod: not room (the core reopens gpufleet's first).
    free_nodes = [
        i
        for i in instances
        if i.in_service and not i.runs_gpu_work and i.instance_id not in starting.no_room and i.mark is NodeMark.NONE
    ]
    free = tuple(shape.gpus for _ in free_nodes[: max(0, len(free_nodes) - unmapped)])
    demand = Demand(
        source=source,
        waiting=tuple(assigned.owners.get(obs.ref.key, ())),
        unfit=tuple(assigned.unfit),
        gpus_per_node=shape.gpus,
        free_gpus=free,
        knows_nodes=True,
        scale_in_closed=closed,
        not_ready=starting.ids,
        never_ready=starting.notices,
    )
    return obs.model_copy(update={"demand": demand, "instances": instances})


def _with_queue_notes(obs: GroupObservation, cluster: str, pods: ClusterPods) -> GroupObservation:
    """The cluster's queued jobs that were seen and not counted, and queueing systems it could not read:
    on every group of the cluster (each is told once, whichever group carries it)."""
    d = obs.demand
    unreadable = tuple(
        UnfitWork(key=f"queued-unreadable/{cluster}/{why}", count=1, text=f"cluster {cluster}: {why}")
        for why in pods.queued_unreadable
    )
    if d is None or not (pods.queue_notes or unreadable):
        return obs
    return obs.model_copy(update={"demand": d.model_copy(update={"queue_notes": pods.queue_notes + unreadable})})


def _without_room(obs: GroupObservation) -> GroupObservation:
    d = obs.demand
    return obs if d is None else obs.model_copy(update={"demand": d.model_copy(update={"free_gpus": ()})})


def _growth(obs: GroupObservation, settings: GroupSettings, now: datetime) -> int:
    return max(0, effective_bounds(obs, settings, now).max - obs.desired)


def _units(kind: str, members: list[Member]) -> list[list[Member]]:
    """Groups read together: one cluster's, one queue's, one metric series'."""
    units: defaultdict[Any, list[Member]] = defaultdict(list)
    for m in members:
        obs, _, d = m
        if kind == "cluster":
            units[joined_cluster(obs, d)[0] or obs.ref.key].append(m)
        elif kind == "queue" and d.sqs is not None:
            units[d.sqs.queue_url].append(m)
        elif d.metric is not None:
            dims = d.metric.dimensions if d.metric.dimensions is not None else group_dimensions(obs.ref)
            units[(d.metric.namespace, d.metric.metric_name, tuple(sorted(dims.items())))].append(m)
    return list(units.values())


def _node_shapes(
    node_shape: Callable[..., NodeShape],
    cluster: str,
    joined: list[Member],
    tell: Callable[[str], Callable[[str], None]] | None = None,
) -> tuple[dict[str, NodeShape], dict[str, tuple[str, str]]]:
    """Each group's node shape, and (source, why) for those whose shape cannot be told. A managed node
    group's is asked as (cluster, node group[, overrides]), a self-managed ASG's with kind=ASG too (and
    `tell`, where its tags' unused parts are told)."""
    shapes: dict[str, NodeShape] = {}
    unknown: dict[str, tuple[str, str]] = {}
    for obs, _, d in joined:
        overrides = d.kubernetes.allocatable if d.kubernetes else None
        extra = (overrides,) if overrides else ()  # the shape callable takes them when there are some
        asg: dict[str, Any] = {"kind": GroupKind.ASG} if obs.ref.kind is GroupKind.ASG else {}
        if asg and tell is not None:
            asg["tell"] = tell(obs.ref.key)
        try:
            shapes[obs.ref.key] = node_shape(cluster, obs.ref.name, *extra, **asg)
        except ShapeUnknown as err:
            unknown[obs.ref.key] = (f"{'group' if asg else 'node group'} {obs.ref.key}", str(err))
    return shapes, unknown


def joined_cluster(obs: GroupObservation, d: DemandSource) -> tuple[str | None, str]:
    """The EKS cluster whose pods a group's `demand.kubernetes` reads: a managed node group's own; a
    self-managed ASG's from the rule (`demand.kubernetes.cluster`), else from its tags
    (`gpufleet.aws.asg_shape.cluster_of`). (None, why) when it cannot be told: the group fails closed."""
    if obs.ref.kind is GroupKind.EKS_NODEGROUP:
        return (obs.ref.cluster, "") if obs.ref.cluster else (None, "a node group without its cluster")
    if obs.ref.kind is GroupKind.ASG:
        named = d.kubernetes.cluster if d.kubernetes else None
        return (named, "") if named else cluster_of(obs.asg_tags)
    return None, f"a {obs.ref.kind.value} group joins no EKS cluster: demand.kubernetes cannot read its pods"


def _keys(unit: list[Member]) -> list[str]:
    return [o.ref.key for o, _, _ in unit]


def _source_name(d: DemandSource) -> str:
    if d.metric is not None:
        return f"metric {d.metric.namespace}/{d.metric.metric_name}"
    if d.sqs is not None:
        return f"queue {d.sqs.queue_url.rstrip('/').rsplit('/', 1)[-1]}"
    return "pods"
