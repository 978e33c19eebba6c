"""Kubernetes pods as gpufleet sees them: a page of `GET /api/v1/pods` (a PodList in the API's JSON) becomes
typed pods that wait for GPUs, and the nodes that run GPU pods. Pure: documents in, models out.

A pod waits for GPUs when its `PodScheduled` condition is False with reason `Unschedulable`, no node is
nominated for it (the scheduler is preempting to place it), it is not a DaemonSet's (those follow nodes,
they never need one), and it asks for GPUs. What it asks for is the effective request the scheduler uses:
per resource, the larger of the app containers' sum and any one init container's request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from gpufleet.domain.errors import one_line
from gpufleet.domain.models import Frozen
from gpufleet.domain.values import EARLIEST, LATEST, Timestamp

NVIDIA_GPU = "nvidia.com/gpu"
# Extended resources that stand for (shares of) GPUs, and how many of each make one GPU. The default is
# whole NVIDIA GPUs; a cluster that shares GPUs adds its own (e.g. {"k8s.amazonaws.com/vgpu": 10}, or
# time-sliced replicas, or MIG profiles such as "nvidia.com/mig-1g.10gb": 7).
DEFAULT_GPU_RESOURCES: Mapping[str, float] = {NVIDIA_GPU: 1.0}


class Toleration(Frozen):
    key: str = ""
    operator: str = "Equal"  # Equal or Exists
    value: str = ""
    effect: str = ""  # empty: every effect


class SelectorTerm(Frozen):
    """One nodeSelectorTerm of required node affinity: all its expressions must hold (terms are ORed). An
    empty term matches no node (Kubernetes' rule); one with matchFields names particular nodes
    (metadata.name), which no new node of a group can be."""

    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (key, operator, values)
    fields: bool = False  # the term has matchFields


class WaitingPod(Frozen):
    namespace: str
    name: str
    gpus: float = Field(gt=0)  # in GPUs (shares converted by the cluster's resource table)
    since: Timestamp | None = None  # when PodScheduled turned False; None: not said, or not a sane time
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[SelectorTerm, ...] = ()  # required node affinity; empty: any node
    tolerations: tuple[Toleration, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _map(value: Any) -> Mapping[str, Any]:
    """A JSON object where the API has one; anything else (a malformed document) reads as empty."""
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _quantity(text: Any) -> float:
    """An extended resource's quantity ('2', '500m'); extended resources are whole numbers, but be lenient."""
    s = str(text).strip()
    if s.endswith("m") and s[:-1].isdigit():
        return int(s[:-1]) / 1000
    try:
        value = float(s)
    except ValueError:
        return 0.0
    return value if value >= 0 and value == value and value != float("inf") else 0.0


def _requests(container: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = _map(container.get("resources"))
    # A limit without a request means request = limit (extended resources must have them equal).
    return {**_map(resources.get("limits")), **_map(resources.get("requests"))}


def gpu_request(spec: Mapping[str, Any], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES) -> float:
    """The pod's effective GPU request in GPUs: per resource max(sum of app containers, largest init
    container), each converted by its units per GPU, then summed over the GPU resources."""
    total = 0.0
    for resource, per_gpu in gpu_resources.items():
        app = sum(_quantity(_requests(c).get(resource, 0)) for c in _list(spec.get("containers")))
        init = max((_quantity(_requests(c).get(resource, 0)) for c in _list(spec.get("initContainers"))), default=0.0)
        total += max(app, init) / per_gpu
    return total


def _unschedulable_since(status: Mapping[str, Any]) -> tuple[bool, datetime | None]:
    for condition in _list(status.get("conditions")):
        if condition.get("type") == "PodScheduled":
            waiting = condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
            at = condition.get("lastTransitionTime")
            return waiting, _time(at) if waiting and at else None
    return False, None


def _values(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _toleration(t: Mapping[str, Any]) -> Toleration:
    return Toleration(
        key=str(t.get("key") or ""),
        operator=str(t.get("operator") or "Equal"),
        value=str(t.get("value") or ""),
        effect=str(t.get("effect") or ""),
    )


def _time(text: Any) -> datetime | None:
    """An RFC 3339 time in UTC; unparsable or outside the range every timestamp keeps (1970-2100) it is
    unknown, like any malformed field: the pod still waits, only for how long is not said."""
    try:
        at = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)  # the API writes UTC (RFC 3339)
    return at.astimezone(UTC) if EARLIEST <= at < LATEST else None  # compared first: 0001+01:00 cannot move


def _affinity(spec: Mapping[str, Any]) -> tuple[SelectorTerm, ...]:
    node_affinity = _map(_map(spec.get("affinity")).get("nodeAffinity"))
    required = _map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    return tuple(
        SelectorTerm(
            expressions=tuple(
                (str(e.get("key")), str(e.get("operator")), tuple(str(v) for v in _values(e.get("values"))))
                for e in _list(term.get("matchExpressions"))
            ),
            fields=bool(_list(term.get("matchFields"))),
        )
        for term in _list(required.get("nodeSelectorTerms"))
    )


def _is_daemonset_pod(meta: Mapping[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in _list(meta.get("ownerReferences")))


def waiting_pod(
    pod: Mapping[str, Any], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> WaitingPod | None:
    """The pod as waiting GPU demand, or None when it does not wait for GPUs."""
    meta, spec, status = _map(pod.get("metadata")), _map(pod.get("spec")), _map(pod.get("status"))
    waiting, since = _unschedulable_since(status)
    if not waiting or status.get("nominatedNodeName") or spec.get("nodeName") or _is_daemonset_pod(meta):
        return None
    gpus = gpu_request(spec, gpu_resources)
    if gpus <= 0:
        return None
    return WaitingPod(
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name", "")),
        gpus=gpus,
        since=since,
        node_selector=tuple(sorted((str(k), str(v)) for k, v in _map(spec.get("nodeSelector")).items())),
        affinity=_affinity(spec),
        tolerations=tuple(_toleration(t) for t in _list(spec.get("tolerations"))),
    )


def waiting_pods(
    pods: Iterable[Mapping[str, Any]], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> list[WaitingPod]:
    return [w for p in pods if (w := waiting_pod(p, gpu_resources)) is not None]


def nodes_running_gpu_pods(
    pods: Iterable[Mapping[str, Any]], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> set[str]:
    """Node names bound to a pod that asks for GPUs and has not finished: such a node is never a victim,
    whatever its GPU metrics say (a pod loading weights reads idle)."""
    return {
        str(_map(p.get("spec")).get("nodeName"))
        for p in pods
        if _map(p.get("spec")).get("nodeName")
        and _map(p.get("status")).get("phase") not in ("Succeeded", "Failed")
        and gpu_request(_map(p.get("spec")), gpu_resources) > 0
    }


class ClusterPods(Frozen):
    """One cluster's pods as the scaler needs them, from one paged listing (the adapter,
    `gpufleet.aws.kubernetes.PodReader`): the GPU work that waits, and the nodes bound to GPU pods."""

    cluster: str
    waiting: tuple[WaitingPod, ...] = ()
    gpu_nodes: frozenset[str] = frozenset()
    pages: int = Field(default=0, ge=0)  # pages fetched, a restarted listing's included (what it cost)


def cluster_pods(
    cluster: str,
    pods: Iterable[Mapping[str, Any]],
    pages: int,
    gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES,
) -> ClusterPods:
    listed = list(pods)
    return ClusterPods(
        cluster=cluster,
        waiting=tuple(waiting_pods(listed, gpu_resources)),
        gpu_nodes=frozenset(nodes_running_gpu_pods(listed, gpu_resources)),
        pages=pages,
    )


class ClusterUnreadable(RuntimeError):
    """A cluster's pods could not be read (refused, unreachable, too slow, or an answer that is not a
    PodList). One line that names the cluster and says why; callers log one WARNING and fall back to the
    utilization rules for that cluster's groups. Never carries a token."""

    def __init__(self, cluster: str, cause: str, kind: str = "unreadable") -> None:
        self.cluster = cluster
        self.cause = one_line(cause, limit=300)
        self.kind = kind  # unauthorized, forbidden, timeout, unreachable, tls, expired, http, malformed, ...
        super().__init__(f"cannot read the pods of EKS cluster {cluster}: {self.cause}")
