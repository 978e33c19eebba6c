"""Kubernetes pods as gpufleet sees them: a page of `GET /api/v1/pods` (a PodList in the API's JSON) becomes
typed pods that wait for GPUs, the nodes that run work (`pod_work`: any pod, GPU or not, but a DaemonSet's,
a mirror pod or one marked safe to evict), and what each DaemonSet's pod takes from a node.
Pure: documents in, models out.

A pod waits for GPUs when its `PodScheduled` condition is False with reason `Unschedulable`, no node is
nominated for it (the scheduler is preempting to place it), it is not a DaemonSet's (those follow nodes,
they never need one), and it asks for GPUs. What it asks for is the effective request the scheduler uses,
per resource (k8s.io/component-helpers/resource `PodRequests` / `AggregateContainerRequests`, the sidecar
KEP-753 formula): the larger of
- the app containers' sum plus the restartable init containers' (sidecars: `restartPolicy: Always`; they
  run for the pod's whole life), and
- for each regular init container, its own request plus the sidecars started before it,
then the pod-level `resources.requests` where set (cpu, memory, hugepages), plus the pod's `overhead`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from gpufleet.domain.defaults import DRAIN_ANNOTATION, DRAIN_LABEL
from gpufleet.domain.models import Frozen, UnfitWork
from gpufleet.domain.quantity import parse_quantity
from gpufleet.domain.values import EARLIEST, LATEST, Timestamp

NVIDIA_GPU = "nvidia.com/gpu"
# Extended resources that stand for (shares of) GPUs, and how many of each make one GPU. The default is
# whole NVIDIA GPUs; a cluster that shares GPUs adds its own (e.g. {"k8s.amazonaws.com/vgpu": 48} where the
# device plugin cuts each GPU into 48 units, or time-sliced replicas, or MIG profiles such as
# "nvidia.com/mig-1g.10gb": 7).
DEFAULT_GPU_RESOURCES: Mapping[str, float] = {NVIDIA_GPU: 1.0}
HOSTNAME_KEY = "kubernetes.io/hostname"
# The PodGroup a Volcano pod belongs to (volcano.sh: pkg/apis/scheduling/v1beta1 KubeGroupNameAnnotationKey).
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
# Resources the API lets a pod set at the pod level (PodLevelResources: cpu, memory, hugepages-*).
_POD_LEVEL = ("cpu", "memory")


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


class Placement(Frozen):
    """What a pod needs of a node besides room: node labels it selects and taints it tolerates."""

    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[SelectorTerm, ...] = ()  # required node affinity; empty: any node
    tolerations: tuple[Toleration, ...] = ()
    # Every resource it requests but GPUs (those are `gpus`), in base units: cpu in cores, memory and
    # storage in bytes, extended resources in their units. Sorted by name; a pod also takes one of `pods`.
    requests: tuple[tuple[str, float], ...] = ()


class WaitingPod(Placement):
    namespace: str
    name: str
    gpus: float = Field(gt=0)  # in GPUs (shares converted by the cluster's resource table); inf: absurd
    since: Timestamp | None = None  # when PodScheduled turned False; None: not said, or not a sane time
    priority: int = 0  # spec.priority (from its PriorityClass): below the expendable cut-off it asks for nothing
    one_per_node: bool = False  # required anti-affinity to its own kind per hostname, or a hostPort
    owner: str = ""  # its set: the Deployment, Job, StatefulSet... (a ReplicaSet's hash cut), else its name
    # The gang it belongs to ("volcano:ns/podgroup", "kueue:ns/workload"; kubernetes/queued.py): its pods start
    # together or not at all, so their nodes come in one change or none. Empty: a pod on its own.
    gang: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def pod_set(self) -> str:
        return f"{self.namespace}/{self.owner or self.name}"


class DaemonSetPod(Placement):
    """What one DaemonSet's pod takes from every node it runs on (one per DaemonSet, from any of its pods):
    a new node of a group offers a waiting pod its allocatable less these."""

    namespace: str
    name: str  # the DaemonSet's


def _map(value: Any) -> Mapping[str, Any]:
    """A JSON object where the API has one; anything else (a malformed document) reads as empty."""
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _quantity(resource: str, text: Any) -> float:
    """A request in base units. Extended resources (a domain-prefixed name: nvidia.com/gpu) are whole
    numbers to the API; a fraction (or 1e-320) counts as the next whole unit, so a GPU share is never
    smaller than one unit of its resource."""
    value = parse_quantity(text)
    if value > 0 and "/" in resource and math.isfinite(value):
        return float(math.ceil(value - 1e-9)) or 1.0
    return value


def _requests(container: Mapping[str, Any]) -> dict[str, float]:
    resources = _map(container.get("resources"))
    # A limit without a request means request = limit (the API defaults it; extended resources must match).
    merged = {**_map(resources.get("limits")), **_map(resources.get("requests"))}
    return {str(k): _quantity(str(k), v) for k, v in merged.items()}


def _add(into: dict[str, float], more: Mapping[str, float]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + v


def _max(into: dict[str, float], more: Mapping[str, float]) -> None:
    for k, v in more.items():
        if v > into.get(k, 0.0):
            into[k] = v


def pod_requests(spec: Mapping[str, Any]) -> dict[str, float]:
    """The pod's effective request per resource, as the scheduler computes it (module docstring)."""
    total: dict[str, float] = {}
    for c in _list(spec.get("containers")):
        _add(total, _requests(c))
    sidecars: dict[str, float] = {}
    init_peak: dict[str, float] = {}
    for c in _list(spec.get("initContainers")):
        own = _requests(c)
        if c.get("restartPolicy") == "Always":  # a sidecar: runs beside the app containers
            _add(total, own)
            _add(sidecars, own)
            _max(init_peak, sidecars)
        else:
            running = dict(own)
            _add(running, sidecars)
            _max(init_peak, running)
    _max(total, init_peak)
    pod_level = _map(_map(spec.get("resources")).get("requests"))
    for k, v in pod_level.items():
        if str(k) in _POD_LEVEL or str(k).startswith("hugepages-"):
            total[str(k)] = _quantity(str(k), v)
    _add(total, {str(k): _quantity(str(k), v) for k, v in _map(spec.get("overhead")).items()})
    return {k: v for k, v in total.items() if v > 0}


def gpu_request(spec: Mapping[str, Any], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES) -> float:
    """The pod's effective GPU request in GPUs: each GPU resource's effective request converted by its
    units per GPU, summed."""
    return _gpus(pod_requests(spec), gpu_resources)


def _gpus(requests: Mapping[str, float], gpu_resources: Mapping[str, float]) -> float:
    return sum(requests.get(r, 0.0) / per_gpu for r, per_gpu in gpu_resources.items())


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


def _affinity(spec: Mapping[str, Any], drop_fields: bool = False) -> tuple[SelectorTerm, ...]:
    node_affinity = _map(_map(spec.get("affinity")).get("nodeAffinity"))
    required = _map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = tuple(
        SelectorTerm(
            expressions=tuple(
                (str(e.get("key")), str(e.get("operator")), tuple(str(v) for v in _values(e.get("values"))))
                for e in _list(term.get("matchExpressions"))
            ),
            fields=bool(_list(term.get("matchFields"))),
        )
        for term in _list(required.get("nodeSelectorTerms"))
    )
    # The DaemonSet controller pins each of its pods to one node with a matchFields term (it replaces the
    # template's terms): for what the DaemonSet takes from a node, that pin says nothing.
    return tuple(t for t in terms if not t.fields) if drop_fields else terms


def _is_daemonset_pod(meta: Mapping[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in _list(meta.get("ownerReferences")))


def _label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a pod's labels; an empty selector
    matches every pod (Kubernetes' rule for a present, empty selector)."""
    for k, v in _map(selector.get("matchLabels")).items():
        if labels.get(k) != v:
            return False
    for e in _list(selector.get("matchExpressions")):
        key, op, values = str(e.get("key")), e.get("operator"), [str(v) for v in _values(e.get("values"))]
        have = labels.get(key)
        ok = {
            "In": have is not None and str(have) in values,
            "NotIn": have is None or str(have) not in values,
            "Exists": have is not None,
            "DoesNotExist": have is None,
        }.get(str(op), False)
        if not ok:
            return False
    return True


def _one_per_node(spec: Mapping[str, Any], meta: Mapping[str, Any]) -> bool:
    """Two such pods never share a node: a required pod anti-affinity per hostname whose selector matches
    the pod itself (its own replicas repel each other), or a container hostPort (one port per node)."""
    labels = _map(meta.get("labels"))
    anti = _map(_map(spec.get("affinity")).get("podAntiAffinity"))
    for term in _list(anti.get("requiredDuringSchedulingIgnoredDuringExecution")):
        namespaces = _values(term.get("namespaces"))
        own_namespace = not namespaces or meta.get("namespace", "default") in namespaces
        selector = term.get("labelSelector")
        if (
            term.get("topologyKey") == HOSTNAME_KEY
            and isinstance(selector, Mapping)
            and own_namespace
            and _label_selector_matches(selector, labels)
        ):
            return True
    containers = [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]
    return any(p.get("hostPort") for c in containers for p in _list(c.get("ports")))


def _owner(meta: Mapping[str, Any]) -> str:
    """The pod's set, stable across its replicas and restarts: a ReplicaSet's name less the pod-template
    hash (its Deployment), another controller's name, else the generateName prefix, else the pod."""
    hash_ = str(_map(meta.get("labels")).get("pod-template-hash") or "")
    for o in _list(meta.get("ownerReferences")):
        if o.get("controller") or len(_list(meta.get("ownerReferences"))) == 1:
            name = str(o.get("name") or "")
            if o.get("kind") == "ReplicaSet" and hash_ and name.endswith(f"-{hash_}"):
                return name[: -len(hash_) - 1]
            if name:
                return name
    generated = str(meta.get("generateName") or "").rstrip("-")
    return generated or str(meta.get("name", ""))


def _priority(spec: Mapping[str, Any]) -> int:
    value = spec.get("priority")
    return max(-(2**31), min(2**31 - 1, value)) if isinstance(value, int) and not isinstance(value, bool) else 0


def _placement(spec: Mapping[str, Any], requests: Mapping[str, float], drop_fields: bool = False) -> dict[str, Any]:
    return {
        "node_selector": tuple(sorted((str(k), str(v)) for k, v in _map(spec.get("nodeSelector")).items())),
        "affinity": _affinity(spec, drop_fields),
        "tolerations": tuple(_toleration(t) for t in _list(spec.get("tolerations"))),
        "requests": tuple(sorted(requests.items())),
    }


def waiting_pod(
    pod: Mapping[str, Any], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> WaitingPod | None:
    """The pod as waiting GPU demand, or None when it does not wait for GPUs."""
    meta, spec, status = _map(pod.get("metadata")), _map(pod.get("spec")), _map(pod.get("status"))
    waiting, since = _unschedulable_since(status)
    if not waiting or status.get("nominatedNodeName") or spec.get("nodeName") or _is_daemonset_pod(meta):
        return None
    requests = pod_requests(spec)
    gpus = _gpus(requests, gpu_resources)
    if not gpus > 0:
        return None
    others = {k: v for k, v in requests.items() if k not in gpu_resources}
    namespace = str(meta.get("namespace", "default"))
    group = str(_map(meta.get("annotations")).get(VOLCANO_GROUP_ANNOTATION) or "")
    return WaitingPod(
        namespace=namespace,
        name=str(meta.get("name", "")),
        gpus=gpus,
        since=since,
        priority=_priority(spec),
        one_per_node=_one_per_node(spec, meta),
        owner=_owner(meta),
        gang=f"volcano:{namespace}/{group}" if group else "",
        **_placement(spec, others),
    )


def waiting_pods(
    pods: Iterable[Mapping[str, Any]], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> list[WaitingPod]:
    return [w for p in pods if (w := waiting_pod(p, gpu_resources)) is not None]


def daemonset_pod(pod: Mapping[str, Any], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES) -> DaemonSetPod:
    """What a DaemonSet's pod takes from a node (GPU resources included under their own names)."""
    meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
    owner = next((o for o in _list(meta.get("ownerReferences")) if o.get("kind") == "DaemonSet"), {})
    return DaemonSetPod(
        namespace=str(meta.get("namespace", "default")),
        name=str(owner.get("name") or meta.get("name", "")),
        **_placement(spec, pod_requests(spec), drop_fields=True),
    )


def daemonsets_of(items: Iterable[Mapping[str, Any]]) -> tuple[DaemonSetPod, ...]:
    """What each DaemonSet's pods take from a node, from the DaemonSets themselves (a DaemonSetList page):
    their template's placement as written. A DaemonSet's pods cannot say it: the controller replaces their
    required node affinity with a pin to one node (kubernetes pkg/controller/daemon/util,
    ReplaceDaemonSetPodNodeNameNodeAffinity), so a DaemonSet kept off GPU nodes looks like it runs there."""
    out: list[DaemonSetPod] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        meta = _map(item.get("metadata"))
        spec = _map(_map(_map(item.get("spec")).get("template")).get("spec"))
        out.append(
            DaemonSetPod(
                namespace=str(meta.get("namespace", "default")),
                name=str(meta.get("name", "")),
                **_placement(spec, pod_requests(spec)),
            )
        )
    return tuple(sorted(out, key=lambda d: (d.namespace, d.name)))


def _daemonset_uid(meta: Mapping[str, Any]) -> str | None:
    for o in _list(meta.get("ownerReferences")):
        if o.get("kind") == "DaemonSet":
            return str(o.get("uid") or o.get("name") or "")
    return None


# The kubelet's mark on the API object of a static pod (k8s.io/api/core/v1 MirrorPodAnnotationKey).
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# Cluster Autoscaler's: "true" (exactly) lets it evict the pod to remove its node (cluster-autoscaler
# utils/drain/drain.go, PodSafeToEvictKey and hasSafeToEvictAnnotation); "false" forbids it.
SAFE_TO_EVICT_ANNOTATION = "cluster-autoscaler.kubernetes.io/safe-to-evict"
# Karpenter's: the pod's node is not disrupted voluntarily ("true", or a duration after the pod started).
DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"


class PodWork(StrEnum):
    """Whether a pod is work on the node it is bound to, and if not, why (`pod_work`)."""

    WORK = "work"
    UNBOUND = "unbound"  # no spec.nodeName: it runs nowhere yet
    FINISHED = "finished"  # Succeeded or Failed: it will not run again
    DAEMONSET = "daemonset"  # a DaemonSet's: it follows nodes and goes with its node
    MIRROR = "mirror"  # a static pod as the API shows it: part of the node, the kubelet runs it
    SAFE_TO_EVICT = "safe_to_evict"  # its owner says losing it is fine (Cluster Autoscaler's annotation)


def pod_work(pod: Mapping[str, Any]) -> PodWork:
    """Whether the pod is work on its node. Work is any pod bound to a node (spec.nodeName) that has not
    finished (phase Succeeded or Failed), whatever it asks for: another team's CPU-only Job on a GPU node
    runs to its end too, so GPU idleness alone never frees a node. Not work:
    - a DaemonSet's pod (an ownerReference of kind DaemonSet): every node runs one, it goes with its node;
    - a mirror pod (annotation `kubernetes.io/config.mirror`, or owned by its Node): a static pod the
      kubelet runs from its own files, part of the node;
    - a pod annotated `cluster-autoscaler.kubernetes.io/safe-to-evict: "true"` (that exact value, as Cluster
      Autoscaler reads it): its owner accepts losing it with its node; unless it also carries
      `karpenter.sh/do-not-disrupt` (any value but "false"), which always keeps it work.
    A terminating pod (metadata.deletionTimestamp) still runs until it exits: work. A DaemonSet's or a
    mirror pod stays none whatever its annotations say (else no node running one could ever go)."""
    meta, spec, status = _map(pod.get("metadata")), _map(pod.get("spec")), _map(pod.get("status"))
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return PodWork.UNBOUND
    if status.get("phase") in ("Succeeded", "Failed"):
        return PodWork.FINISHED
    kinds = {o.get("kind") for o in _list(meta.get("ownerReferences"))}
    annotations = _map(meta.get("annotations"))
    if "DaemonSet" in kinds:
        return PodWork.DAEMONSET
    if MIRROR_ANNOTATION in annotations or "Node" in kinds:
        return PodWork.MIRROR
    keep = DO_NOT_DISRUPT_ANNOTATION in annotations and annotations.get(DO_NOT_DISRUPT_ANNOTATION) != "false"
    if annotations.get(SAFE_TO_EVICT_ANNOTATION) == "true" and not keep:
        return PodWork.SAFE_TO_EVICT
    return PodWork.WORK


def nodes_running_work(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """Node names bound to a pod that is work (`pod_work`): such a node is never a victim, whatever its GPU
    metrics say (a pod loading weights reads idle; a CPU-only Job uses no GPU at all)."""
    return {str(_map(p.get("spec")).get("nodeName")) for p in pods if pod_work(p) is PodWork.WORK}


def nodes_running_gpu_pods(
    pods: Iterable[Mapping[str, Any]], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> set[str]:
    """Node names whose work asks for GPUs: a part of `nodes_running_work`, which says which nodes are kept."""
    return set(gpus_held_by_node(pods, gpu_resources))


def gpus_held_by_node(
    pods: Iterable[Mapping[str, Any]], gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> dict[str, float]:
    """Per node name, the GPUs its work (`pod_work`) asks for (only nodes with some): what consolidation
    reads as the work a node holds (the emptiest drains first). A DaemonSet's GPU pod is not counted: it
    does not leave a node that drains, so it is no work to pack elsewhere."""
    held: dict[str, float] = {}
    for p in pods:
        if pod_work(p) is not PodWork.WORK:
            continue
        node = str(_map(p.get("spec")).get("nodeName"))
        gpus = gpu_request(_map(p.get("spec")), gpu_resources)
        if gpus > 0:
            held[node] = held.get(node, 0.0) + gpus
    return held


# What kubernetes/queued.py reads a queued pod template with, the same as a pod's.
gpus_of = _gpus
placement_of = _placement
priority_of = _priority
one_per_node_of = _one_per_node
time_of = _time
as_map = _map
as_list = _list
label_selector_matches = _label_selector_matches


class NodeListing(StrEnum):
    """Which nodes a cluster read lists: NONE; DRAINED, only those gpufleet labelled closed
    (`labelSelector=defaults.DRAIN_LABEL`: normally none, so cheap), for clusters where no group
    consolidates, so gpufleet's cordons are still known and reopened; ALL, for consolidation by attrition."""

    NONE = "none"
    DRAINED = "drained"
    ALL = "all"


class NodeState(Frozen):
    """A node as consolidation reads it (`GET /api/v1/nodes`): cordoned or not, and whether gpufleet did
    it (its label `defaults.DRAIN_LABEL` or its annotation `defaults.DRAIN_ANNOTATION` is on the node: an
    older gpufleet set the annotation alone)."""

    name: str
    unschedulable: bool = False
    ours: bool = False
    instance_id: str | None = None  # from spec.providerID (aws:///ZONE/i-...): which instance it is, no EC2 call


def node_states(items: Iterable[Any]) -> dict[str, NodeState]:
    """A NodeList page's nodes by name; an item without a name is skipped (the API never sends one)."""
    out: dict[str, NodeState] = {}
    for item in items:
        if not isinstance(item, Mapping):
            continue
        meta = _map(item.get("metadata"))
        name = str(meta.get("name") or "")
        if name:
            spec = _map(item.get("spec"))
            provider = str(spec.get("providerID") or "")
            tail = provider.rsplit("/", 1)[-1]
            out[name] = NodeState(
                name=name,
                unschedulable=spec.get("unschedulable") is True,
                ours=DRAIN_ANNOTATION in _map(meta.get("annotations")) or DRAIN_LABEL in _map(meta.get("labels")),
                instance_id=tail if provider.startswith("aws://") and tail.startswith("i-") else None,
            )
    return out


class ClusterPods(Frozen):
    """One cluster's pods as the scaler needs them, from one paged listing (the adapter,
    `gpufleet.kubernetes.cluster.PodReader`): the GPU work that waits, the nodes that run work (never
    victims: `never_victims`), and one entry per DaemonSet for what its pod takes from each node it runs on."""

    cluster: str
    waiting: tuple[WaitingPod, ...] = ()
    # Node names bound to work, GPU or not (`nodes_running_work`), and those whose work asks for GPUs (the
    # keys of `gpus_held`; from a listing, a part of `work_nodes`).
    work_nodes: frozenset[str] = frozenset()
    gpu_nodes: frozenset[str] = frozenset()
    pages: int = Field(default=0, ge=0)  # pages fetched, a restarted listing's included (what it cost)
    daemonsets: tuple[DaemonSetPod, ...] = ()
    gpus_held: dict[str, float] = Field(default_factory=dict)  # node name -> GPUs its unfinished pods ask for
    # The cluster's nodes by name, when asked for (all of them when a group of it consolidates by attrition,
    # else only those gpufleet labelled: `NodeListing`); None: not asked, or not readable
    # (`nodes_unreadable` says why: its groups' marks are then unknown).
    nodes: dict[str, NodeState] | None = None
    nodes_unreadable: str | None = None
    # Jobs that wait before they are pods (kubernetes/queued.py): their gangs' pods are in `waiting`; what was
    # seen and not counted is in `queue_notes` (told once each); a queueing system that could not be read
    # is named in `queued_unreadable`.
    queue_notes: tuple[UnfitWork, ...] = ()
    queued_unreadable: tuple[str, ...] = ()
    queued_gangs: frozenset[str] = frozenset()
    # The Volcano gangs ("volcano:ns/podgroup") any unfinished pod names, waiting or not: a PodGroup nobody
    # owns is demand only while its pods exist (kubernetes/volcano.py).
    pod_gangs: frozenset[str] = frozenset()

    @property
    def never_victims(self) -> frozenset[str]:
        """The node names that run work, so are never a victim: `work_nodes`, and `gpu_nodes` too (a source
        that names only the nodes of its GPU work still keeps them)."""
        return self.work_nodes | self.gpu_nodes


def cluster_pods(
    cluster: str,
    pods: Iterable[Mapping[str, Any]],
    pages: int,
    gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES,
) -> ClusterPods:
    tally = PodTally(cluster, gpu_resources)
    tally.add(pods)
    return tally.result(pages)


class PodTally:
    """A paged listing reduced page by page to what the scaler needs (a large cluster's pods are never all
    held at once). A pod is counted once by its uid: a listing that shows it on two pages (a restarted or
    inconsistent list) does not make it wait twice. DaemonSets are kept one pod each (by the owner's uid),
    so their memory is bounded by how many DaemonSets there are, not by nodes."""

    def __init__(self, cluster: str, gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES) -> None:
        self.cluster, self.gpu_resources = cluster, gpu_resources
        self._seen: set[str] = set()
        self._waiting: list[WaitingPod] = []
        self._gpus_held: dict[str, float] = {}
        self._work_nodes: set[str] = set()  # bounded by the cluster's nodes, not its pods
        self._daemonsets: dict[str, DaemonSetPod] = {}
        self._gangs: set[str] = set()  # bounded by the pods read

    @property
    def pods(self) -> int:
        """Distinct pods seen so far (pods without a uid count each time)."""
        return len(self._seen)

    def add(self, items: Iterable[Mapping[str, Any]]) -> None:
        fresh: list[Mapping[str, Any]] = []
        for item in items:
            if not isinstance(item, Mapping):
                continue
            meta = _map(item.get("metadata"))
            uid = str(meta.get("uid") or "")
            key = uid or f"#{len(self._seen)}"
            if key in self._seen:
                continue
            self._seen.add(key)
            fresh.append(item)
            group = _map(meta.get("annotations")).get(VOLCANO_GROUP_ANNOTATION)
            if group:
                self._gangs.add(f"volcano:{meta.get('namespace', 'default')}/{group}")
            owner = _daemonset_uid(meta)
            if owner is not None and owner not in self._daemonsets:
                self._daemonsets[owner] = daemonset_pod(item, self.gpu_resources)
        self._waiting += waiting_pods(fresh, self.gpu_resources)
        self._work_nodes |= nodes_running_work(fresh)
        for node, gpus in gpus_held_by_node(fresh, self.gpu_resources).items():
            self._gpus_held[node] = self._gpus_held.get(node, 0.0) + gpus

    def result(self, pages: int) -> ClusterPods:
        return ClusterPods(
            cluster=self.cluster,
            waiting=tuple(self._waiting),
            work_nodes=frozenset(self._work_nodes),
            gpu_nodes=frozenset(self._gpus_held),
            gpus_held=dict(self._gpus_held),
            pages=pages,
            daemonsets=tuple(self._daemonsets[k] for k in sorted(self._daemonsets)),
            pod_gangs=frozenset(self._gangs),
        )
