"""The rules of a group's demand this tick, apart from reading it: what a read source's answer makes of
each group (`Demand` on its observation, its instances' `runs_work`). Pure: what the readers read
(`scaling.sources`) in, observations out; the readers and the tick's hub (`scaling.demand_source`) do the
reading and the telling.

One model for every source, whose invariants are property-tested (tests/adapters/scaling/test_demand_invariants.py):
- a node that may run work is never a victim: a source that cannot say which nodes run work (unreadable,
  a node name EC2 does not map, a throttled lookup) closes its groups for scale-in, and that never takes
  room away (protection and room are separate facts);
- running work is never counted as waiting; a unit of work counts for one group only; groups that share a
  source split it in a stated order (`scaling.demand_share`);
- every number from outside gives a bounded answer or one "unreadable" line.
A new node is room only once it is GPU-ready (`scaling.demand_share.not_gpu_ready`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.domain.kinds import traits
from gpufleet.domain.models import (
    Demand,
    GroupObservation,
    InstanceObservation,
    MarkChannel,
    NodeMark,
    NodeNotice,
    QueuedSource,
    UnfitWork,
    WaitingWork,
)
from gpufleet.domain.nodes import NodeShape
from gpufleet.kubernetes.pods import ClusterPods
from gpufleet.policy.fleet import Consolidation, DemandSource, GroupSettings
from gpufleet.scaling.core import effective_bounds
from gpufleet.scaling.demand_share import NotReady, Sharer, split_backlog
from gpufleet.scaling.fit import Assignment, assign

Pair = tuple[GroupObservation, GroupSettings]
Member = tuple[GroupObservation, GroupSettings, DemandSource]
Sized = tuple[Member, float]  # a group of a backlog source, with its GPUs per node
# A node that sent no GPU metric in this long has not reported its GPUs (CloudWatch bills the series read,
# not the window, so a long window costs what a short one does).
READY_WITHIN = timedelta(hours=3)
NO_GPN = "GPUs per node unknown: set demand.gpus_per_node (an ASG's is never guessed from the instances it runs)"


@dataclass(frozen=True)
class Starting:
    ids: tuple[str, ...] = ()  # on the way: not room, not victims
    notices: tuple[NodeNotice, ...] = ()  # past the timeout: told, counted as nothing

    @property
    def no_room(self) -> set[str]:
        """Nodes whose room waiting work cannot use: starting, or never ready."""
        return {*self.ids, *(n.instance_id for n in self.notices)}


@dataclass(frozen=True)
class Tick:
    """What every source's groups share this tick: now, the spot fallbacks, the nodes not GPU-ready."""

    now: datetime
    fallbacks: frozenset[str]
    ready: Mapping[str, list[NotReady]]

    def not_ready(self, key: str, instances: Iterable[InstanceObservation]) -> Starting:
        """The group's nodes that are not GPU-ready, less those that run work now."""
        busy = {i.instance_id for i in instances if i.runs_work}
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
        return Starting(ids=on_the_way, notices=notices)


def units(members: Iterable[Member], key: Callable[[GroupObservation, DemandSource], Hashable]) -> list[list[Member]]:
    """Groups read together (one cluster's, one queue's, one metric series'), in the order first seen."""
    found: defaultdict[Hashable, list[Member]] = defaultdict(list)
    for m in members:
        found[key(m[0], m[2])].append(m)
    return list(found.values())


def keys(unit: Iterable[Member]) -> list[str]:
    return [o.ref.key for o, _, _ in unit]


# ---- backlogs: a queue, a metric ----


def backlog_problem(value: float | None) -> str | None:
    """Why a backlog metric's latest datum is no count of waiting GPUs (None: it is one)."""
    if value is None:  # a dead publisher must not read as "nothing waits" (and mute the band)
        return "no datum in the last 5 minutes: is its publisher running?"
    if math.isnan(value) or value < 0:  # never "nothing waits": a backlog is a count
        return f"the latest datum is {value:g}, not a count of GPUs"
    return None


def shared(
    sized: list[Sized],
    run: Tick,
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
    sharers = [sharer(m, gpn, unit_gpus[m[0].ref.key], starting[m[0].ref.key], run, room) for m, gpn in sized]
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


def sharer(m: Member, gpn: float, unit: float, starting: Starting, run: Tick, room: bool) -> Sharer:
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
        protected=sum(1 for i in serving if i.protected_from_scale_in),  # marked or protected: holds its own
        coming=pending + max(0, obs.desired - listed) + len(starting.ids),
        growth=growth(obs, s, run.now),
    )


def growth(obs: GroupObservation, settings: GroupSettings, now: datetime) -> int:
    return max(0, effective_bounds(obs, settings, now).max - obs.desired)


# ---- a cluster's pods ----


@dataclass(frozen=True)
class ClusterAsk:
    """What one pod listing asks of a cluster for all its groups: the GPU resources any of them counts,
    whether one drains by attrition (then every node is listed, else only those gpufleet closed), and the
    queueing systems whose jobs any of them counts."""

    resources: Mapping[str, float]
    attrition: bool
    queued: frozenset[QueuedSource]

    @classmethod
    def of(cls, joined: Sequence[Member]) -> ClusterAsk:
        resources: dict[str, float] = {}
        for _, _, d in joined:
            resources.update(d.kubernetes.gpu_resources if d.kubernetes else {})
        attrition = any(s.consolidate is Consolidation.ATTRITION for _, s, _ in joined)
        queued = frozenset(q for _, _, d in joined if d.kubernetes for q in d.kubernetes.queued)
        return cls(resources=resources, attrition=attrition, queued=queued)


def shape_source(obs: GroupObservation) -> str:
    """What a group whose node shape cannot be told is called: a group named in its cluster is a node
    group of it; one named alone (a self-managed ASG) a group."""
    return f"{'node group' if traits(obs.ref.kind).in_cluster else 'group'} {obs.ref.key}"


def cluster_demand(
    joined: Sequence[Member],
    cluster: str,
    pods: ClusterPods,
    shapes: Mapping[str, NodeShape],
    nodes: tuple[Mapping[str, str], str | None, int],
    run: Tick,
) -> tuple[dict[str, GroupObservation], Assignment]:
    """One cluster's groups (those whose node shape is known) from its pod listing: each waiting pod to
    one group (`assign`), and what the cluster's nodes say of each group's instances. `nodes`: the node
    names that run work (any pod but a DaemonSet's, a mirror pod or one marked safe to evict: GPU or not)
    -> instance ids, why scale-in is closed if that is not known for every such node, and how many of
    their names did not map (`KubernetesReader.running`)."""
    named, closed, unmapped = nodes
    running = set(named.values())
    held = holdings(pods, named, closed)
    free = room(joined, shapes, running | held.other, run.now)
    cutoff = min((d.kubernetes.expendable_priority for _, _, d in joined if d.kubernetes), default=-10)
    most = {o.ref.key: effective_bounds(o, s, run.now).max for o, s, _ in joined}
    counts = {o.ref.key: frozenset(q.value for q in d.kubernetes.queued) for o, _, d in joined if d.kubernetes}
    assigned = assign(pods.waiting, shapes, free, pods.daemonsets, cutoff, most, (pods.queued_gangs, counts))
    out: dict[str, GroupObservation] = {}
    for obs, settings, _ in joined:
        shape = shapes.get(obs.ref.key)
        if shape is not None:
            marked = with_holdings(obs, held).model_copy(update={"cluster": cluster})
            # Attrition with the cordons unknown: an idle node may be one gpufleet closed (no pod lands
            # there, and nothing reopens it): none is room, so waiting work gets a launch.
            blind = settings.consolidate is Consolidation.ATTRITION and not held.listed
            demand = pod_demand(marked, shape, (running, closed, unmapped), assigned, f"cluster {cluster}", run)
            demand = with_queue_notes(demand, cluster, pods)
            if demand.demand is not None:  # the last look before a removal reads this cluster's pods again
                demand = demand.model_copy(update={"demand": demand.demand.model_copy(update={"cluster": cluster})})
            out[obs.ref.key] = without_room(demand) if blind else demand
    return out, assigned


@dataclass(frozen=True)
class Holdings:
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


def holdings(pods: ClusterPods, named: Mapping[str, str], closed: str | None) -> Holdings:
    """Node names from the nodes running work that were mapped and, when the nodes were listed, from each
    node's providerID; marks from the listing: our label or annotation on a cordoned node is gpufleet's, a
    cordon without them someone else's."""
    names = {iid: name for name, iid in named.items()}
    marks: dict[str, NodeMark] = {}
    for node in (pods.nodes or {}).values():
        if node.instance_id is None:
            continue
        names.setdefault(node.instance_id, node.name)
        if node.unschedulable:
            marks[node.instance_id] = NodeMark.GPUFLEET if node.ours else NodeMark.OTHER
    # A GPU node whose pods' GPUs were not tallied (a source that names nodes only) holds an unknown amount;
    # a node whose work asks for no GPU (a CPU-only Job) holds none.
    known = closed is None and set(named) & pods.gpu_nodes <= set(pods.gpus_held)
    return Holdings(names=names, gpus=dict(pods.gpus_held), marks=marks, listed=pods.nodes is not None, known=known)


def with_holdings(obs: GroupObservation, held: Holdings) -> GroupObservation:
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


def room(joined: Sequence[Member], shapes: Mapping[str, NodeShape], taken: set[str], now: datetime) -> dict[str, int]:
    """What each group can still bring: nodes it may add, and its serving nodes that are not `taken` (a GPU
    pod on them, or cordoned by someone else: gpufleet's own cordons it may lift)."""
    return {
        o.ref.key: growth(o, s, now) + sum(1 for i in o.instances if i.in_service and i.instance_id not in taken)
        for o, s, _ in joined
        if o.ref.key in shapes
    }


def pod_demand(
    obs: GroupObservation,
    shape: NodeShape,
    nodes: tuple[set[str], str | None, int],
    assigned: Assignment,
    source: str,
    run: Tick,
) -> GroupObservation:
    """One node group's demand from its cluster's pods: the pods it owns, its nodes that run work, GPU or
    not (`nodes`: instance ids, why scale-in is closed if that is not known for every node running work,
    and how many of their names did not map), and room."""
    running, closed, unmapped = nodes
    instances = tuple(i.model_copy(update={"runs_work": i.instance_id in running}) for i in obs.instances)
    starting = run.not_ready(obs.ref.key, instances)
    # An InService, GPU-ready node without work is room: a pod that still waits beside it will not be
    # placed by one more node either (it waits for CPU, a volume's zone, ...): no runaway scale-out. Work
    # on a node name EC2 does not map may be on one of them (a custom hostname): one node of room less
    # per such name, so a doubt launches at most that many nodes, once, and never hides a full group.
    # A cordoned node (by gpufleet or anyone) takes no new pod: not room (the core reopens gpufleet's first).
    free_nodes = [
        i
        for i in instances
        if i.in_service and not i.runs_work and i.instance_id not in starting.no_room and i.mark is NodeMark.NONE
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


def with_queue_notes(obs: GroupObservation, cluster: str, pods: ClusterPods) -> GroupObservation:
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


def without_room(obs: GroupObservation) -> GroupObservation:
    d = obs.demand
    return obs if d is None else obs.model_copy(update={"demand": d.model_copy(update={"free_gpus": ()})})
