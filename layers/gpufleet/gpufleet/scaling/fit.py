"""Does a waiting pod fit a node of a group, the way the scheduler would decide it, and which group owns it.
Pure: pods and node shapes in, a verdict with its numbers out.

A node of a group fits a pod when (the scheduler's NodeAffinity, TaintToleration and NodeResourcesFit
filters, for a node that does not exist yet):
- its nodeSelector and required node affinity hold on the node's labels;
- its tolerations cover every NoSchedule/NoExecute taint;
- its GPUs fit one node, and every other resource it requests (cpu, memory, ephemeral-storage, hugepages,
  extended ones such as vpc.amazonaws.com/efa, and one of `pods`) fits the node's allocatable less what the
  DaemonSets that would run there take.

A label the shape cannot know before a node exists (the zone of a group that spans several zones, a GPU
feature label of an unknown GPU, a node-feature-discovery label) is not guessed: the pod is told it
cannot be placed by that group, with the label named. A resource the shape does not know (cpu, memory,
ephemeral-storage, pods of a group with no allocatable) is not checked.

Pods below the expendable cut-off ask for nothing (Cluster Autoscaler's `expendable-pods-priority-cutoff`,
default -10: "Pods with priority below cutoff will be expendable ... they don't cause scale up";
kubernetes/autoscaler cluster-autoscaler/main.go). A pod that fits no group asks for nothing and is told
once per pod set, with the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import Field

from gpufleet.domain.defaults import DEFAULT_EXPENDABLE_PRIORITY
from gpufleet.domain.errors import one_line
from gpufleet.domain.models import Frozen, UnfitWork, WaitingWork
from gpufleet.domain.nodes import NodeShape
from gpufleet.domain.quantity import is_bytes, show
from gpufleet.kubernetes.pods import DaemonSetPod, Placement, SelectorTerm, Toleration, WaitingPod
from gpufleet.kubernetes.queued import gang_system

_EPSILON = 1e-9
# Label keys a shape may not know before its node exists (set by the cloud per node, or by agents on it):
# absent from a shape, they are undecided, not absent.
UNDECIDED_PREFIXES = (
    "topology.kubernetes.io/",
    "failure-domain.beta.kubernetes.io/",
    "topology.k8s.aws/",
    "nvidia.com/",
    "feature.node.kubernetes.io/",
)
# Resources every node has: a shape that does not say how much of one has is not checked on it.
NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")
_UNFIT_GROUPS_SHOWN = 3
_MOST_PER_NODE = 1_000_000.0  # pods one node can hold, at most (kubelets allow hundreds)


class Assignment(Frozen):
    """Each waiting pod owned by one group (as work to pack), or told as fitting none."""

    owners: dict[str, list[WaitingWork]] = Field(default_factory=dict)  # group key -> its waiting work
    unfit: list[UnfitWork] = Field(default_factory=list)  # one per pod set, with the numbers
    expendable: int = Field(default=0, ge=0)  # pods below the cut-off: they ask for nothing
    elsewhere: int = Field(default=0, ge=0)  # pods whose selectors or taints match no managed group's nodes


# ---- labels and taints ----


def _undecided(key: str) -> bool:
    return key.startswith(UNDECIDED_PREFIXES)


def _expression(key: str, op: str, values: tuple[str, ...], labels: Mapping[str, str]) -> bool | None:
    have = labels.get(key)
    if have is None and _undecided(key):
        return None
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt"):
        try:
            a, b = int(have or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return a > b if op == "Gt" else a < b
    return False


def _term(term: SelectorTerm, labels: Mapping[str, str]) -> bool | None:
    """True, False, or None when it turns on a label the shape cannot know."""
    if term.fields or not term.expressions:  # a named node, or an empty term: no new node matches
        return False
    results = [_expression(k, op, values, labels) for k, op, values in term.expressions]
    return False if False in results else (None if None in results else True)


def _term_holds(term: SelectorTerm, labels: dict[str, str]) -> bool:
    return _term(term, labels) is True


def _tolerated(taint: tuple[str, str, str], tolerations: Sequence[Toleration]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.effect and t.effect != effect:
            continue
        if t.operator == "Exists" and (not t.key or t.key == key):
            return True
        if t.operator == "Equal" and t.key == key and t.value == value:
            return True
    return False


def _placement(pod: Placement, shape: NodeShape) -> tuple[bool | None, str]:
    """Whether the pod may land on the shape's nodes at all: True, False (with why) or None (undecided)."""
    labels = dict(shape.labels)
    for taint in shape.taints:
        if taint[2] in ("NoSchedule", "NoExecute") and not _tolerated(taint, pod.tolerations):
            return False, f"taint {taint[0]}={taint[1]}:{taint[2]} not tolerated"
    undecided: list[str] = []
    for k, v in pod.node_selector:
        if k not in labels and _undecided(k):
            undecided.append(f"{k}={v}")
        elif labels.get(k) != v:
            return False, f"nodeSelector {k}={v} does not match"
    if pod.affinity:
        verdicts = [_term(t, labels) for t in pod.affinity]
        if True not in verdicts:
            if None not in verdicts:
                return False, "required node affinity does not match"
            keys = sorted({k for t in pod.affinity for k, _, _ in t.expressions if k not in labels and _undecided(k)})
            undecided += keys
    if undecided:
        return None, f"selects {', '.join(undecided)}, which a new node's labels cannot tell in advance"
    return True, ""


# ---- resources ----


def usable(shape: NodeShape, daemonsets: Iterable[DaemonSetPod] = ()) -> dict[str, float]:
    """The shape's allocatable less what the DaemonSets that would run on its nodes take (one pod each).
    A DaemonSet whose placement the shape cannot decide is left out (never call a pod unfit on a guess)."""
    if not shape.allocatable:
        return {}
    left = dict(shape.allocatable)
    for ds in daemonsets:
        if _placement(ds, shape)[0] is not True:
            continue
        for resource, amount in (*ds.requests, ("pods", 1.0)):
            if resource in left:
                left[resource] = max(0.0, left[resource] - amount)
    return left


def _needs(pod: WaitingPod) -> dict[str, float]:
    return {**dict(pod.requests), "pods": 1.0}


def _shortfalls(pod: WaitingPod, shape: NodeShape, room: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """(resource, asked, offered) for each resource the pod asks more of than a node offers."""
    short: list[tuple[str, float, float]] = []
    if not pod.gpus <= shape.gpus + _EPSILON:
        short.append(("GPU", pod.gpus, shape.gpus))
    if not shape.allocatable:
        return short
    for resource, amount in sorted(_needs(pod).items()):
        offered = room.get(resource)
        if offered is None:
            if resource in NATIVE_RESOURCES:
                continue  # the shape does not say: not checked
            offered = 0.0  # an extended resource or hugepages the node does not offer
        if not amount <= offered * (1 + _EPSILON) + _EPSILON:
            short.append((resource, amount, offered))
    return short


def per_node(pod: WaitingPod, shape: NodeShape, room: Mapping[str, float]) -> int:
    """How many such pods one node takes (at least 1 where it fits; 1 for a pod that needs a node each)."""
    if pod.one_per_node:
        return 1
    ratios = [(shape.gpus + _EPSILON) / pod.gpus] if pod.gpus > 0 else []
    for resource, amount in _needs(pod).items():
        offered = room.get(resource)
        if offered is not None and amount > 0:
            ratios.append(offered * (1 + _EPSILON) / amount + _EPSILON)
    # Bounded before the floor: a request of 1e-320 would make an infinite ratio (OverflowError).
    return max(1, math.floor(min([*(r for r in ratios if r == r), _MOST_PER_NODE])))  # r == r: not NaN


def misfit(pod: WaitingPod, shape: NodeShape, daemonsets: Iterable[DaemonSetPod] = ()) -> str | None:
    """None when a node of this shape would take the pod; else why, with the numbers:
    'cpu 4 > 3.92 allocatable'."""
    return _verdict(pod, shape, usable(shape, daemonsets)).why


def fits(pod: WaitingPod, shape: NodeShape, daemonsets: Iterable[DaemonSetPod] = ()) -> bool:
    """Could a node of this shape host the pod (see `misfit` for why not)."""
    return misfit(pod, shape, daemonsets) is None


@dataclass(frozen=True)
class _Verdict:
    why: str | None = None  # None: fits
    kind: str = "fits"  # fits, placement, undecided, resources
    short: tuple[tuple[str, float, float], ...] = ()


def _verdict(pod: WaitingPod, shape: NodeShape, room: Mapping[str, float]) -> _Verdict:
    placed, why = _placement(pod, shape)
    if placed is False:
        return _Verdict(why, "placement")
    if placed is None:
        return _Verdict(why, "undecided")
    short = _shortfalls(pod, shape, room)
    if short:
        text = ", ".join(f"{_asked(r, a)} > {_offered(r, o)}" for r, a, o in short)
        return _Verdict(text, "resources", tuple(short))
    return _Verdict()


def _asked(resource: str, amount: float) -> str:
    return _gpus_text(amount) if resource == "GPU" else f"{resource} {show(resource, amount)}"


def _offered(resource: str, amount: float) -> str:
    text = show(resource, amount, down=True)
    return f"{text} per node" if resource == "GPU" else f"{text} allocatable"


def _gpus_text(amount: float) -> str:
    n = show("GPU", amount)
    return f"{n} GPU" if n == "1" else f"{n} GPUs"


def _has(resource: str, amount: float) -> str:
    """'3.92 CPU', '14.5 GiB', '17.9 GiB ephemeral-storage', '58 pods', '0 vpc.amazonaws.com/efa'."""
    if resource == "GPU":
        return f"{_gpus_text(amount)} per node"
    if resource == "cpu":
        return f"{show(resource, amount, down=True)} CPU"
    if is_bytes(resource):
        text = show(resource, amount, down=True)
        spaced = f"{text[:-2]} {text[-2:]}B" if text[-2:] in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei") else f"{text} B"
        return spaced if resource == "memory" else f"{spaced} {resource}"
    return f"{show(resource, amount, down=True)} {resource}"


def signature(pod: WaitingPod) -> str:
    """'cpu 4, memory 16Gi, 1 GPU': what the pod asks of a node, as its spec says it."""
    order = {r: i for i, r in enumerate(("cpu", "memory", "ephemeral-storage"))}
    parts = [f"{r} {show(r, a)}" for r, a in sorted(pod.requests, key=lambda ra: (order.get(ra[0], 9), ra[0]))]
    return ", ".join([*parts, _gpus_text(pod.gpus)])


# ---- which group owns a pod ----


@dataclass
class _UnfitSet:
    pod_set: str
    sig: str
    count: int = 0
    reasons: dict[str, _Verdict] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)


def assign(
    waiting: Iterable[WaitingPod],
    shapes: Mapping[str, NodeShape],
    room: Mapping[str, float],
    daemonsets: Sequence[DaemonSetPod] = (),
    expendable_priority: int = DEFAULT_EXPENDABLE_PRIORITY,
    most: Mapping[str, int] | None = None,
    queued: tuple[frozenset[str], Mapping[str, frozenset[str]]] | None = None,
) -> Assignment:
    """Each waiting pod to one group whose nodes fit it, or told as fitting none.

    `room`: group key -> the nodes it can still bring to waiting pods (max less desired, plus its idle
    serving nodes); a group not named can grow without bound. A pod goes to the fitting group with the
    fewest GPUs per node (the least room left idle) among those with room left, then by key; each pod
    takes its share of a node (1/k where a node holds k such pods, a whole node for one that needs a node
    each), so pods spill to the next group when one is full. Only when no fitting group has room left does
    a pod go to the one it would have had (it asks there, and that group says it is at max).

    A gang's pods (`WaitingPod.gang`) go to one group together: one that every member fits, with room for
    the whole gang where there is one. A gang no single group fits, or one that needs more nodes than a
    fitting group may ever have (`most`: group key -> its max), is told as fitting none, with the numbers:
    it would never start, so no node is launched for any of its pods. `queued`: the gangs that are queued
    jobs (not pods yet), and per group the queueing systems it counts (`demand.kubernetes.queued`): such a
    gang goes only to a group that counts its system."""
    assigner = _Assigner(shapes, room, daemonsets, most or {})
    assigner.queued = queued or (frozenset(), {})
    return assigner.run(waiting, expendable_priority)


class _Assigner:
    """The state of one `assign`: each group's room left and each pod kind's verdicts, computed once."""

    def __init__(
        self,
        shapes: Mapping[str, NodeShape],
        room: Mapping[str, float],
        daemonsets: Sequence[DaemonSetPod],
        most: Mapping[str, int],
    ) -> None:
        self.ordered = sorted(shapes.items(), key=lambda ks: (ks[1].gpus, ks[0]))
        self.shapes, self.most = shapes, most
        self.rooms = {key: usable(shape, daemonsets) for key, shape in self.ordered}
        self.left = {key: float(room[key]) if key in room else math.inf for key, _ in self.ordered}
        self.owners: dict[str, list[WaitingWork]] = {}
        self.unfit: dict[str, _UnfitSet] = {}
        self.verdicts: dict[tuple[object, ...], list[tuple[str, _Verdict]]] = {}
        self.expendable = self.elsewhere = 0
        self.queued: tuple[frozenset[str], Mapping[str, frozenset[str]]] = (frozenset(), {})

    def run(self, waiting: Iterable[WaitingPod], expendable_priority: int) -> Assignment:
        units: dict[str, list[WaitingPod]] = {}
        for pod in sorted(waiting, key=lambda p: -p.priority):  # stable: the listing's order within a priority
            if pod.priority < expendable_priority:
                self.expendable += 1
                continue
            units.setdefault(pod.gang or f"\0{len(units)}", []).append(pod)
        for members in units.values():
            if members[0].gang:
                self._gang(members)
            else:
                self._single(members[0])
        told = [UnfitWork(key=key, count=s.count, text=_unfit_text(s)) for key, s in sorted(self.unfit.items())]
        return Assignment(owners=self.owners, unfit=told, expendable=self.expendable, elsewhere=self.elsewhere)

    def _verdicts(self, pod: WaitingPod) -> list[tuple[str, _Verdict]]:
        kind = (pod.gpus, pod.requests, pod.node_selector, pod.affinity, pod.tolerations)
        if kind not in self.verdicts:
            self.verdicts[kind] = [(key, _verdict(pod, shape, self.rooms[key])) for key, shape in self.ordered]
        return self.verdicts[kind]

    def _tell(self, pod: WaitingPod, count: int, reasons: dict[str, _Verdict], key: str | None = None) -> None:
        sig = signature(pod)
        named = f"gang {pod.gang}" if key and pod.gang else pod.pod_set
        entry = self.unfit.setdefault(key or f"{pod.pod_set} ({sig})", _UnfitSet(named, sig))
        entry.count += count
        entry.reasons = reasons
        entry.names = {k: shape.name for k, shape in self.ordered}

    def _single(self, pod: WaitingPod) -> None:
        verdicts = self._verdicts(pod)
        fitting = [key for key, v in verdicts if v.why is None]
        if not fitting and verdicts and all(v.kind == "placement" for _, v in verdicts):
            self.elsewhere += 1  # it selects nodes no managed group has: another autoscaler's pod, not ours to tell
            return
        if not fitting:
            self._tell(pod, 1, dict(verdicts))
            return
        chosen = next((key for key in fitting if self.left[key] > _EPSILON), fitting[0])
        self._place(chosen, [pod])

    def _place(self, chosen: str, pods: Sequence[WaitingPod]) -> None:
        for pod in pods:
            share = per_node(pod, self.shapes[chosen], self.rooms[chosen])
            self.left[chosen] -= 1.0 / share
            whole = pod.one_per_node or share == 1
            work = WaitingWork(name=pod.key, gpus=pod.gpus, since=pod.since, whole_node=whole, gang=pod.gang)
            self.owners.setdefault(chosen, []).append(work)

    def _nodes(self, key: str, pods: Sequence[WaitingPod]) -> float:
        """Nodes of group `key` the pods take (each its share of a node)."""
        return sum(1.0 / per_node(p, self.shapes[key], self.rooms[key]) for p in pods)

    def _gang(self, members: list[WaitingPod]) -> None:
        per_member = [self._verdicts(p) for p in members]
        if all(v.kind == "placement" for verdicts in per_member for _, v in verdicts) and per_member[0]:
            self.elsewhere += len(members)
            return
        common = [key for key, _ in self.ordered if all(dict(v)[key].why is None for v in per_member)]
        gangs, counts = self.queued
        if members[0].gang in gangs:  # a queued job: only groups that count its system take it
            system = gang_system(members[0].gang)
            common = [key for key in common if system in counts.get(key, frozenset())]
            if not common:
                self.elsewhere += len(members)
                return
        if not common:
            worst = next((i for i, v in enumerate(per_member) if all(x.why for _, x in v)), 0)
            self._tell(members[worst], len(members), dict(per_member[worst]), f"{members[0].gang} (gang)")
            return
        needs = {key: math.ceil(self._nodes(key, members) - _EPSILON) for key in common}
        able = [key for key in common if key not in self.most or needs[key] <= self.most[key]]
        if not able:
            self._too_big(members, {key: (needs[key], self.most[key]) for key in common})
            return
        chosen = next((key for key in able if self.left[key] + _EPSILON >= needs[key]), able[0])
        self._place(chosen, members)

    def _too_big(self, members: list[WaitingPod], sizes: Mapping[str, tuple[int, int]]) -> None:
        """A gang that needs more nodes than any group it fits may have: told, never launched for."""
        first = members[0]
        reasons = {
            key: _Verdict(f"the gang needs {need} nodes, its max is {top}", "gang", ())
            for key, (need, top) in sizes.items()
        }
        self._tell(first, len(members), reasons, f"{first.gang} (gang)")


def _unfit_text(s: _UnfitSet) -> str:
    """'3 pods of serving/infer (cpu 4, memory 16Gi, 1 GPU) fit no group: eks:ml/gpu-infer's g5.xlarge has
    3.92 CPU and 14.5 GiB allocatable'. Groups whose nodes are too small come first (the numbers that
    matter), then those it cannot tell, then those it does not select."""
    rank = {"gang": 0, "resources": 0, "undecided": 1, "placement": 2}
    reasons = sorted(s.reasons.items(), key=lambda kv: (rank.get(kv[1].kind, 3), kv[0]))
    parts: list[str] = []
    for key, v in reasons[:_UNFIT_GROUPS_SHOWN]:
        name = s.names.get(key) or "node"
        if v.kind == "resources":
            gpus = [_has(r, o) for r, _, o in v.short if r == "GPU"]
            has = [_has(r, o) for r, _, o in v.short if r != "GPU"]
            listed = " and ".join(has) if len(has) <= 2 else ", ".join(has[:-1]) + f" and {has[-1]}"
            offered = " and ".join([*gpus, *([f"{listed} allocatable"] if has else [])])
            parts.append(f"{key}'s {name} has {offered}")
        else:
            parts.append(f"{key}: {v.why}")
    more = len(reasons) - _UNFIT_GROUPS_SHOWN
    tail = f"; and {more} more group{'s' if more != 1 else ''}" if more > 0 else ""
    pods = "1 pod" if s.count == 1 else f"{s.count} pods"
    groups = "; ".join(parts) if parts else "no group has a node shape"
    return one_line(f"{pods} of {s.pod_set} ({s.sig}) fit no group: {groups}{tail}", limit=600)
