"""Jobs that wait before they are pods: a queueing system's objects (Kueue Workloads, Volcano PodGroups)
as gangs of waiting pods, in the same typed shape as the pods the scheduler could not place, so the fit
and the packing treat them alike. Pure: documents in (the readers in kubernetes/kueue.py and
kubernetes/volcano.py), waiting pods and notes out.

A gang is work whose pods must all start together (a Workload's pod sets, a PodGroup's `minMember`): each
of its pods carries the gang's key, and the scaler launches the nodes a gang needs in one change or none.

Counted once: a queued object's pods, where some exist already and wait, are left out of the pod demand
(`merged`): the gang counts for them. An object whose pods exist and run is not queued demand at all (a
Kueue Workload once admitted: its pods are pods).

Bounded by tenant (`Budget`): any tenant may create queued objects, so one namespace's objects must cut
only that namespace's demand. A gang is cut whole when its namespace has already counted
QUEUED_JOBS_PER_NAMESPACE gangs or it would take the namespace past QUEUED_PODS_PER_NAMESPACE pods (in the
system's own order: Kueue's priority then age, Volcano's age), checked before its pods are built, so a
`minMember: 100000` costs nothing. Past that, one ClusterQueue or Volcano Queue (QUEUED_PODS_PER_QUEUE) and
the cluster (QUEUED_PODS) are shared: there the namespaces holding the most are cut first (a gang ranks by
the pods its namespace counts up to and with it), so a small team's gang is never cut for a large one's.
Each cut is told once per (level, namespace), with how many gangs, pods and GPUs, and the bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain.defaults import (
    QUEUED_JOBS_PER_NAMESPACE,
    QUEUED_PODS,
    QUEUED_PODS_PER_NAMESPACE,
    QUEUED_PODS_PER_QUEUE,
)
from gpufleet.domain.models import Frozen, QueuedSource, UnfitWork
from gpufleet.domain.values import Timestamp
from gpufleet.kubernetes.pods import (
    DEFAULT_GPU_RESOURCES,
    ClusterPods,
    WaitingPod,
    gpus_of,
    one_per_node_of,
    placement_of,
    pod_requests,
    priority_of,
)

# Pods one queued listing may stand for, all objects together: more is not a cluster the scaler reads in
# one tick (the pod listing's own bound, `gpufleet.kubernetes.cluster.MAX_PODS`); one object's minMember or
# count past it is absurd. Shared fairly between namespaces (`Budget`).
MAX_QUEUED_PODS = QUEUED_PODS


class QueuedDemand(Frozen):
    """What one queueing system's objects add to a cluster's demand.

    `waiting`: one WaitingPod per pod a counted object will create, each with its gang's key (`gang`);
    `gangs`: the keys counted (their existing waiting pods are dropped from the pod demand, `merged`);
    `notes`: objects seen but not counted, and why, with numbers (told once per key: "2 Workloads of
    ml/team-a wait for quota in ClusterQueue gpu: nvidia.com/gpu 32 of 32 used; nodes would not admit
    them"); `unreadable`: why the system's objects could not be read (its groups' queued demand is unknown)."""

    source: QueuedSource
    waiting: tuple[WaitingPod, ...] = ()
    gangs: frozenset[str] = frozenset()
    notes: tuple[UnfitWork, ...] = ()
    unreadable: str | None = None
    installed: bool = True  # False: the API has no such resources (the CRDs are not installed): nothing to say


def gang_key(source: QueuedSource, namespace: str, name: str) -> str:
    """'kueue:ml/train-a': one gang, whichever pods stand for it."""
    return f"{source.value}:{namespace}/{name}"


def gang_system(key: str) -> str:
    """The queueing system a gang key names: 'kueue' for 'kueue:ml/train-a'."""
    return key.split(":", 1)[0]


def template_pods(
    template_spec: Mapping[str, Any],
    *,
    gang: str,
    namespace: str,
    name: str,
    count: int,
    since: Timestamp | None = None,
    priority: int | None = None,
    node_labels: Mapping[str, str] | None = None,
    tolerations: Iterable[Mapping[str, Any]] = (),
    gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES,
    owner: str = "",
) -> list[WaitingPod]:
    """`count` waiting pods of one pod template (a Workload's pod set, a Volcano task), or none when the
    template asks for no GPU. `node_labels` (a flavor's) join its nodeSelector and `tolerations` its own,
    as Kueue injects them at admission. Pods are named `name[0]`, `name[1]`...; `count` is capped by the
    caller (MAX_QUEUED_PODS)."""
    spec = dict(template_spec)
    if node_labels:
        selector = dict(spec.get("nodeSelector") or {}) if isinstance(spec.get("nodeSelector"), Mapping) else {}
        spec["nodeSelector"] = {**selector, **node_labels}
    extra = [t for t in tolerations if isinstance(t, Mapping)]
    if extra:
        own = spec.get("tolerations")
        spec["tolerations"] = [*(own if isinstance(own, list) else []), *extra]
    requests = pod_requests(spec)
    gpus = gpus_of(requests, gpu_resources)
    if not gpus > 0 or count <= 0:
        return []
    others = {k: v for k, v in requests.items() if k not in gpu_resources}
    meta = {"namespace": namespace, "labels": {}}
    placement = placement_of(spec, others)
    return [
        WaitingPod(
            namespace=namespace,
            name=f"{name}[{i}]",
            gpus=gpus,
            since=since,
            priority=priority if priority is not None else priority_of(spec),
            one_per_node=one_per_node_of(spec, meta),
            owner=owner or name,
            gang=gang,
            **placement,
        )
        for i in range(count)
    ]


def merged(pods: ClusterPods, queued: Iterable[QueuedDemand]) -> ClusterPods:
    """The cluster's pods with the queued systems' demand added: waiting pods of a counted gang are left
    out (the gang counts for them), the gangs' pods added, notes and unreadable systems kept."""
    found = [q for q in queued if q.installed]
    if not found:
        return pods
    gangs = frozenset().union(*(q.gangs for q in found))
    # A waiting pod of a gang its system read and did not count (a Running PodGroup's extra replicas start
    # one by one) is a pod on its own; one of a counted gang is left out (the gang counts for it).
    read = {q.source.value for q in found if q.unreadable is None}
    waiting = tuple(
        p if not p.gang or gang_system(p.gang) not in read else p.model_copy(update={"gang": ""})
        for p in pods.waiting
        if not p.gang or p.gang not in gangs
    )
    added = tuple(p for q in found for p in q.waiting)
    notes = tuple(n for q in found for n in q.notes)
    unreadable = tuple(f"{q.source.value}: {q.unreadable}" for q in found if q.unreadable)
    return pods.model_copy(
        update={
            "waiting": waiting + added,
            "queue_notes": pods.queue_notes + notes,
            "queued_unreadable": pods.queued_unreadable + unreadable,
            "queued_gangs": pods.queued_gangs | gangs,
        }
    )


@dataclass(frozen=True)
class Limits:
    """The budgets queued demand is read within (defaults.QUEUED_*; the module docstring says why)."""

    jobs_per_namespace: int = QUEUED_JOBS_PER_NAMESPACE
    pods_per_namespace: int = QUEUED_PODS_PER_NAMESPACE
    pods_per_queue: int = QUEUED_PODS_PER_QUEUE
    pods: int = QUEUED_PODS


@dataclass(frozen=True)
class Ask:
    """One gang a system would count, sized before its pods are built: its key, whose it is (namespace),
    the queue it waits in (a ClusterQueue, a Volcano Queue) and its GPU pods and GPUs."""

    key: str
    namespace: str
    queue: str
    pods: int
    gpus: float


@dataclass
class _Cut:
    gangs: int = 0
    pods: int = 0
    gpus: float = 0.0


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.3g}"


@dataclass
class Budget:
    """The tenant budgets of one system's read. `take(ask)` in the system's order (the namespace's bound);
    `shared(asks)` then keeps what the queues' and the cluster's bounds allow, largest namespaces cut
    first; `notes()` tells each cut once per (level, namespace), with the numbers."""

    source: QueuedSource
    noun: str  # "PodGroup", "Workload"
    queue_noun: str  # "Queue", "ClusterQueue"
    limits: Limits = field(default_factory=Limits)
    _jobs: dict[str, int] = field(default_factory=dict)
    _pods: dict[str, int] = field(default_factory=dict)
    _cuts: dict[tuple[str, str, str], _Cut] = field(default_factory=dict)

    def take(self, ask: Ask) -> bool:
        """Whether the gang stays within its namespace's budget (it is counted against it if so)."""
        jobs, pods = self._jobs.get(ask.namespace, 0), self._pods.get(ask.namespace, 0)
        if jobs >= self.limits.jobs_per_namespace or pods + ask.pods > self.limits.pods_per_namespace:
            self._cut("namespace", "", ask)
            return False
        self._jobs[ask.namespace], self._pods[ask.namespace] = jobs + 1, pods + ask.pods
        return True

    def shared(self, asks: list[Ask]) -> list[Ask]:
        """The gangs the queues' bounds, then the cluster's, keep (in the order given)."""
        kept = self._fair(asks, lambda a: a.queue, self.limits.pods_per_queue, "queue")
        return self._fair(kept, lambda a: "", self.limits.pods, "cluster")

    def _fair(self, asks: list[Ask], scope: Any, cap: int, level: str) -> list[Ask]:
        """Within each scope, gangs in the order of the pods their namespace holds up to and with them:
        each namespace's first pods before any namespace's later ones, until `cap`."""
        ranked: list[tuple[int, int, Ask]] = []
        held: dict[tuple[str, str], int] = {}
        for i, a in enumerate(asks):
            where = (scope(a), a.namespace)
            held[where] = held.get(where, 0) + a.pods
            ranked.append((held[where], i, a))
        total: dict[str, int] = {}
        kept: list[tuple[int, Ask]] = []
        for _, i, a in sorted(ranked, key=lambda r: (r[0], r[1])):
            if total.get(scope(a), 0) + a.pods > cap:
                self._cut(level, scope(a), a)
                continue
            total[scope(a)] = total.get(scope(a), 0) + a.pods
            kept.append((i, a))
        return [a for _, a in sorted(kept, key=lambda k: k[0])]

    def _cut(self, level: str, where: str, ask: Ask) -> None:
        cut = self._cuts.setdefault((level, where, ask.namespace), _Cut())
        cut.gangs, cut.pods, cut.gpus = cut.gangs + 1, cut.pods + ask.pods, cut.gpus + ask.gpus

    def notes(self) -> tuple[UnfitWork, ...]:
        out = []
        for (level, where, namespace), cut in sorted(self._cuts.items()):
            what = f"{cut.gangs} {self.noun}{'s' if cut.gangs != 1 else ''} of namespace {namespace}"
            size = f"({cut.pods} pods, {_num(cut.gpus)} GPUs)"
            counted = self._pods.get(namespace, 0)
            bound = {
                "namespace": f"a namespace's queued jobs count as at most {self.limits.jobs_per_namespace} gangs"
                f" of {self.limits.pods_per_namespace} pods in all; {counted} of its pods are within it",
                "queue": f"{self.queue_noun} {where}'s queued jobs count for at most {self.limits.pods_per_queue}"
                " pods, the namespaces holding the most cut first",
                "cluster": f"the cluster's queued jobs count for at most {self.limits.pods} pods, the namespaces"
                " holding the most cut first",
            }[level]
            scope = f"{level}:{where}:{namespace}" if where else f"{level}:{namespace}"
            text = f"cut: {what} {size} not counted: {bound}"
            out.append(UnfitWork(key=f"{self.source.value}:cut:{scope}", count=cut.gangs, text=text))
        return tuple(out)
