"""Volcano documents as `kubectl get -o json` shows them: EMULATED (written from Volcano's types and
controllers, not captured from a cluster), for the loopback Kubernetes API (rehearsal/kube_api.py).

- `vcjob()` / `task()`: a `batch.volcano.sh/v1alpha1` Job after Volcano's admission webhook (mutate_job.go:
  `schedulerName: volcano`, `queue: default`, `maxRetry: 3`, each task's `minAvailable` defaulted to its
  replicas and the Job's `minAvailable` to their sum) and its controller's first status (Pending).
- `podgroup_of(job)`: the PodGroup the Job controller creates for it (job_controller_actions.go
  createOrUpdatePodGroup): named `JOB-UID`, owned by the Job (controller reference), `minMember` = the
  Job's minAvailable, `minTaskMember` per task, `minResources` as calcPGMinResources sums the first pods
  with the quota keys CalTaskRequests writes (`pods`, `count/pods`, `requests.*`, `limits.*`).
- `podgroup()`: a PodGroup on its own (written by hand, or by the podgroup controller for plain pods),
  with `minResources` as given.
- `gang_pod()`: one pod of a gang, with the `scheduling.k8s.io/group-name` annotation Volcano sets.

Status: phase Pending with the gang plugin's `Unschedulable` condition (NotEnoughResources), or any phase
given, with `running`.
"""

from __future__ import annotations

import uuid
from typing import Any

from gpufleet.domain.quantity import parse_quantity
from rehearsal.kube_api import pod

SCHEDULING = "scheduling.volcano.sh/v1beta1"
BATCH = "batch.volcano.sh/v1alpha1"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
IMAGE = "public.ecr.aws/example/trainer:1.0"


def _uid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(parts)))


def task(
    name: str,
    replicas: int,
    *,
    gpus: int = 8,
    min_available: int | None = None,
    requests: dict[str, str] | None = None,
    priority: int | None = None,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One task of a Volcano Job: `replicas` pods of one template (the GPU as a limit, the API's way)."""
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    if requests:
        resources["requests"] = dict(requests)
    spec: dict[str, Any] = {
        "containers": [{"name": name, "image": IMAGE, "resources": resources}],
        "restartPolicy": "OnFailure",
    }
    if priority is not None:
        spec["priority"] = priority
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = list(tolerations)
    return {
        "name": name,
        "replicas": replicas,
        "minAvailable": replicas if min_available is None else min_available,
        "template": {"metadata": {}, "spec": spec},
    }


def vcjob(
    name: str,
    namespace: str = "default",
    *,
    tasks: list[dict[str, Any]],
    min_available: int | None = None,
    queue: str = "default",
    priority_class: str = "",
    since: str = "2026-11-27T08:00:00Z",
) -> dict[str, Any]:
    """A Volcano Job as the API keeps it after the webhook's defaults."""
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "minAvailable": sum(t["minAvailable"] for t in tasks) if min_available is None else min_available,
        "queue": queue,
        "maxRetry": 3,
        "tasks": tasks,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": BATCH,
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "uid": _uid(namespace, name), "creationTimestamp": since,
                     "generation": 1},
        "spec": spec,
        "status": {"state": {"phase": "Pending", "lastTransitionTime": since}, "minAvailable": spec["minAvailable"]},
    }  # fmt: skip


def _pod_usage(spec: dict[str, Any], count: int) -> dict[str, float]:
    """`count` pods' quota usage as CalTaskRequests sums it (one container per template here)."""
    resources = spec["containers"][0].get("resources", {})
    requests = {**resources.get("limits", {}), **resources.get("requests", {})}
    usage: dict[str, float] = {"pods": 1, "count/pods": 1}
    for name, text in requests.items():
        value = parse_quantity(text)
        if name in ("cpu", "memory", "ephemeral-storage"):
            usage[name] = usage[f"requests.{name}"] = value
        else:  # an extended resource: quota writes requests.NAME, Volcano adds NAME back
            usage[f"requests.{name}"] = usage[name] = value
    for name, text in resources.get("limits", {}).items():
        if name in ("cpu", "memory", "ephemeral-storage"):
            usage[f"limits.{name}"] = parse_quantity(text)
    return {k: v * count for k, v in usage.items()}


def _text(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{round(value * 1000)}m"


def _min_resources(job: dict[str, Any]) -> dict[str, str]:
    """calcPGMinResources (the tasks in listed order: the emulation sets no PriorityClass)."""
    tasks, left = job["spec"]["tasks"], job["spec"]["minAvailable"]
    if left < sum(t["minAvailable"] for t in tasks):  # CalcFirstCountResources: the first pods, up to replicas
        counts = []
        for t in tasks:
            counts.append(min(left, t["replicas"]))
            left -= counts[-1]
    else:  # CalcPGMinResources: each task's minAvailable, then the other replicas
        counts = [t["minAvailable"] for t in tasks]
        left -= sum(counts)
        for i, t in enumerate(tasks):
            extra = min(left, t["replicas"] - counts[i])
            counts[i] += extra
            left -= extra
    total: dict[str, float] = {}
    for t, n in zip(tasks, counts, strict=True):
        for k, v in _pod_usage(t["template"]["spec"], n).items():
            total[k] = total.get(k, 0.0) + v
    return {k: _text(v) for k, v in sorted(total.items())}


def _status(phase: str, running: int, since: str) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if phase == "Pending":
        message = "0/2 nodes are unavailable: 2 Insufficient nvidia.com/gpu."
        status["conditions"] = [{"type": "Unschedulable", "status": "True", "transitionID": _uid("session", since),
                                 "lastTransitionTime": "2026-11-27T09:00:00Z", "reason": "NotEnoughResources",
                                 "message": message}]  # fmt: skip
    if running:
        status["running"] = running
    return status


def podgroup_of(job: dict[str, Any], *, phase: str = "Pending", running: int = 0) -> dict[str, Any]:
    """The PodGroup Volcano's Job controller creates for `job`."""
    meta, spec = job["metadata"], job["spec"]
    owner = {"apiVersion": BATCH, "kind": "Job", "name": meta["name"], "uid": meta["uid"], "controller": True,
             "blockOwnerDeletion": True}  # fmt: skip
    pg_spec: dict[str, Any] = {
        "minMember": spec["minAvailable"],
        "minTaskMember": {t["name"]: t["minAvailable"] for t in spec["tasks"]},
        "queue": spec["queue"],
        "minResources": _min_resources(job),
    }
    if spec.get("priorityClassName"):
        pg_spec["priorityClassName"] = spec["priorityClassName"]
    name = f"{meta['name']}-{meta['uid']}"
    return {
        "apiVersion": SCHEDULING,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": meta["namespace"], "uid": _uid(meta["namespace"], name),
                     "creationTimestamp": meta["creationTimestamp"], "generation": 1, "ownerReferences": [owner]},
        "spec": pg_spec,
        "status": _status(phase, running, meta["creationTimestamp"]),
    }  # fmt: skip


def podgroup(
    name: str,
    namespace: str = "default",
    *,
    min_member: int,
    min_resources: dict[str, str] | None = None,
    phase: str = "Pending",
    running: int = 0,
    queue: str = "default",
    since: str = "2026-11-27T08:00:00Z",
) -> dict[str, Any]:
    """A PodGroup with no Volcano Job behind it: `minResources` as given."""
    spec: dict[str, Any] = {"minMember": min_member, "queue": queue}
    if min_resources is not None:
        spec["minResources"] = dict(min_resources)
    return {
        "apiVersion": SCHEDULING,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "uid": _uid(namespace, name), "creationTimestamp": since,
                     "generation": 1},
        "spec": spec,
        "status": _status(phase, running, since),
    }  # fmt: skip


def gang_pod(name: str, namespace: str, podgroup_name: str, *, gpus: int = 8) -> dict[str, Any]:
    """A pod of a Volcano gang that exists and waits: kube_api's waiting pod with Volcano's annotations."""
    doc = pod(name, namespace, gpus=gpus)
    doc["metadata"]["annotations"] = {GROUP_ANNOTATION: podgroup_name, "volcano.sh/task-spec": name.split("-")[-2]}
    doc["spec"]["schedulerName"] = "volcano"
    return doc
