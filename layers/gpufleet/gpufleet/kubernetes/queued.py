"""Jobs that wait before they are pods: a queueing system's objects (Kueue Workloads, Volcano PodGroups)
as gangs of waiting pods, in the same typed shape as the pods the scheduler could not place, so the fit
and the packing treat them alike. Pure: documents in (the readers in kubernetes/kueue.py and
kubernetes/volcano.py), waiting pods and notes out.

A gang is work whose pods must all start together (a Workload's pod sets, a PodGroup's `minMember`): each
of its pods carries the gang's key, and the scaler launches the nodes a gang needs in one change or none.

Counted once: a queued object's pods, where some exist already and wait, are left out of the pod demand
(`merged`): the gang counts for them. An object whose pods exist and run is not queued demand at all (a
Kueue Workload once admitted: its pods are pods).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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
# one tick (the pod listing's own bound, `gpufleet.kubernetes.cluster.MAX_PODS`).
MAX_QUEUED_PODS = 100_000


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
