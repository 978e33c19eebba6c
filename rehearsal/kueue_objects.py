"""Kueue documents for tests and the demo, EMULATED: built by hand in the shape `kubectl get -o json`
shows for `kueue.x-k8s.io/v1beta1` Workloads, ClusterQueues, LocalQueues and ResourceFlavors (field
names from kubernetes-sigs/kueue apis/kueue/v1beta1/*_types.go; condition types and reasons from the
same files). Not produced by a running Kueue: only the fields gpufleet reads, and the usual neighbours.

Serve them with rehearsal/kube_api.py: `api.install(API_VERSION, *PLURALS)` then
`api.add_object("workloads", workload(...))`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

API_VERSION = "kueue.x-k8s.io/v1beta1"
PLURALS = ("workloads", "clusterqueues", "localqueues", "resourceflavors")
CREATED = "2026-11-27T08:30:00Z"


def _meta(name: str, namespace: str | None = None, created: str = CREATED) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"00000000-0000-4000-8000-{zlib.crc32(f'{namespace}/{name}'.encode()):012d}",
        "generation": 1,
        "creationTimestamp": created,
    }
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _condition(kind: str, status: bool, reason: str, message: str, at: str = CREATED) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
        "observedGeneration": 1,
    }


def resource_flavor(
    name: str,
    node_labels: Mapping[str, str] | None = None,
    node_taints: Sequence[Mapping[str, str]] = (),
    tolerations: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A ResourceFlavor (cluster-scoped): the nodes' labels and taints, and tolerations Kueue adds."""
    spec: dict[str, Any] = {}
    if node_labels:
        spec["nodeLabels"] = dict(node_labels)
    if node_taints:
        spec["nodeTaints"] = [dict(t) for t in node_taints]
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(name), "spec": spec}


def cluster_queue(
    name: str,
    quotas: Mapping[str, Mapping[str, str | int]],
    used: Mapping[str, Mapping[str, str | int]] | None = None,
    *,
    active: bool = True,
    stop_policy: str | None = None,
    cohort: str | None = None,
    pending: int = 0,
) -> dict[str, Any]:
    """A ClusterQueue with one resource group: `quotas` flavor -> resource -> nominalQuota, in the
    order Kueue tries them; `used` flavor -> resource -> total reserved (status.flavorsReservation and,
    here alike, flavorsUsage)."""
    covered = sorted({r for q in quotas.values() for r in q})
    flavors = [
        {"name": f, "resources": [{"name": r, "nominalQuota": str(q.get(r, 0))} for r in covered]}
        for f, q in quotas.items()
    ]
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
        "preemption": {"reclaimWithinCohort": "Never", "withinClusterQueue": "Never",
                       "borrowWithinCohort": {"policy": "Never"}},
        "resourceGroups": [{"coveredResources": covered, "flavors": flavors}],
        "stopPolicy": stop_policy or "None",
    }  # fmt: skip
    if cohort:
        spec["cohort"] = cohort
    usage = [
        {"name": f, "resources": [{"name": r, "total": str((used or {}).get(f, {}).get(r, 0)), "borrowed": "0"}
                                  for r in covered]}
        for f in quotas
    ]  # fmt: skip
    reason, message = ("Ready", "Can admit new workloads") if active else ("FlavorNotFound", "Can't admit new "
                       "workloads: references missing ResourceFlavor(s): a100.")  # fmt: skip
    status = {
        "conditions": [_condition("Active", active, reason, message)],
        "flavorsReservation": usage,
        "flavorsUsage": usage,
        "pendingWorkloads": pending,
        "reservingWorkloads": 0,
        "admittedWorkloads": 0,
    }
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _meta(name), "spec": spec, "status": status}


def local_queue(namespace: str, name: str, cluster_queue: str, *, active: bool = True) -> dict[str, Any]:
    """A LocalQueue: a namespace's door to a ClusterQueue."""
    reason, message = ("Ready", "Can submit new workloads to localQueue") if active else (
        "ClusterQueueDoesNotExist", "Can't submit new workloads to clusterQueue")  # fmt: skip
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": _meta(name, namespace),
        "spec": {"clusterQueue": cluster_queue, "stopPolicy": "None"},
        "status": {"conditions": [_condition("Active", active, reason, message)], "pendingWorkloads": 0,
                   "reservingWorkloads": 0, "admittedWorkloads": 0},
    }  # fmt: skip


def pod_set(
    name: str = "main",
    count: int = 1,
    gpus: int = 8,
    *,
    cpu: str = "16",
    memory: str = "64Gi",
    gpu_resource: str = "nvidia.com/gpu",
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    min_count: int | None = None,
) -> dict[str, Any]:
    """One pod set as Kueue's batch/Job integration writes it: the Job's pod template, `count` pods."""
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpus:
        requests[gpu_resource] = str(gpus)
        limits[gpu_resource] = str(gpus)
    container: dict[str, Any] = {
        "name": "trainer",
        "image": "nvcr.io/nvidia/pytorch:24.10-py3",
        "resources": {"requests": requests, **({"limits": limits} if limits else {})},
    }
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    found: dict[str, Any] = {"name": name, "count": count, "template": {"metadata": {}, "spec": spec}}
    if min_count is not None:
        found["minCount"] = min_count
    return found


def workload(
    namespace: str,
    job: str,
    queue: str,
    pod_sets: Iterable[Mapping[str, Any]] = (),
    *,
    state: str = "pending",
    priority: int | None = None,
    created: str = CREATED,
    cluster_queue: str = "",
    flavor: str = "",
    checks: Mapping[str, str] | None = None,
    requeue_at: str | None = None,
    active: bool = True,
) -> dict[str, Any]:
    """A Workload for a batch/Job named `job` (Kueue names it job-JOB-HASH and owns it by the Job).
    `state`: pending (no quota), reserved (quota held, admission checks pending), admitted, finished,
    evicted (quota released, requeued: see `requeue_at`). `checks`: admission check -> state."""
    sets = [dict(p) for p in pod_sets] or [pod_set()]
    meta = _meta(f"job-{job}-5c8f2", namespace, created)
    meta["labels"] = {"kueue.x-k8s.io/job-uid": "7d0e6a9e-2f4b-4c8a-9a51-0d3c1f2b7e11"}
    meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "controller": True,
                                "blockOwnerDeletion": True, "uid": "7d0e6a9e-2f4b-4c8a-9a51-0d3c1f2b7e11"}]  # fmt: skip
    spec: dict[str, Any] = {"active": active, "podSets": sets, "queueName": queue}
    if priority is not None:
        spec |= {"priority": priority, "priorityClassName": "training", "priorityClassSource":
                 "scheduling.k8s.io/priorityclass"}  # fmt: skip
    return {"apiVersion": API_VERSION, "kind": "Workload", "metadata": meta, "spec": spec,
            "status": _workload_status(state, sets, cluster_queue, flavor, checks, requeue_at)}  # fmt: skip


def _workload_status(
    state: str,
    sets: list[dict[str, Any]],
    cluster_queue: str,
    flavor: str,
    checks: Mapping[str, str] | None,
    requeue_at: str | None,
) -> dict[str, Any]:
    at = "2026-11-27T08:31:00Z"
    reserved = state in ("reserved", "admitted", "finished")
    conditions = [
        _condition("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {cluster_queue}", at)
        if reserved
        else _condition("QuotaReserved", False, "Pending", "couldn't assign flavors to pod set main: insufficient "
                        "unused quota for nvidia.com/gpu in flavor a100, 8 more needed", at)
    ]  # fmt: skip
    if state in ("admitted", "finished"):
        conditions.append(_condition("Admitted", True, "Admitted", "The workload is admitted", at))
    if state == "finished":
        conditions.append(_condition("Finished", True, "Succeeded", "Job finished successfully", at))
    if state == "evicted":
        conditions.append(_condition("Evicted", True, "PodsReadyTimeout", "Exceeded the PodsReady timeout", at))
        conditions.append(_condition("Requeued", False, "PodsReadyTimeout", "Exceeded the PodsReady timeout", at))
    status: dict[str, Any] = {"conditions": conditions}
    if reserved:
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": [
            {"name": p["name"], "count": p["count"], "flavors": {"nvidia.com/gpu": flavor, "cpu": flavor,
                                                                  "memory": flavor}} for p in sets]}  # fmt: skip
    if checks:
        status["admissionChecks"] = [
            {"name": n, "state": s, "lastTransitionTime": at, "message": ""} for n, s in checks.items()
        ]
    if requeue_at:
        status["requeueState"] = {"count": 1, "requeueAt": requeue_at}
    return status
