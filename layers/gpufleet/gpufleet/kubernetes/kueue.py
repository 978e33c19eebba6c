"""Kueue's queued jobs as demand (`kueue.x-k8s.io/v1beta1`). Pure: Workloads, ClusterQueues, LocalQueues
and ResourceFlavors in (as the API lists them), gangs of waiting pods and notes out (kubernetes/queued.py).

Field names and rules from Kueue's own code (kubernetes-sigs/kueue, apis/kueue/v1beta1/*_types.go,
pkg/workload/workload.go, pkg/scheduler/flavorassigner/flavorassigner.go). The fields read are the same
in `v1beta2`, which newer Kueue serves with v1beta1 marked deprecated.

A Workload stands for one Job: `spec.podSets[]` (name, count, template.spec), `spec.queueName` (a
LocalQueue in its namespace, whose `spec.clusterQueue` holds the quota), `spec.active`, `spec.priority`,
`status.conditions`, `status.admission`, `status.admissionChecks[]` (state Pending, Ready, Retry,
Rejected) and `status.requeueState.requeueAt`. Kueue keeps the Job suspended, with no pods, until the
Workload is Admitted.

Not demand, and nothing said:
- `Admitted=True`: the Job runs and its pods exist; they are counted as pods, never twice;
- `Finished=True`; `spec.active: false` (deactivated); `status.requeueState.requeueAt` after now (backing
  off after an eviction); `QuotaReserved=False` with reason `OnHold` (Kueue's IsOnHold); a Workload that
  asks for no GPU.

Counted, as ONE gang (`kueue:NS/NAME`; every pod of every pod set carries it): not admitted, no quota
reserved, its LocalQueue and ClusterQueue exist and are active, and the ClusterQueue has nominal quota
left for the whole Workload. Per resource group of the ClusterQueue that covers a resource the Workload
requests, the flavors are tried in the ClusterQueue's order and the first one that fits is the one
Kueue would assign: its `nodeTaints` (NoSchedule, NoExecute) are tolerated by the pod's or the flavor's
own tolerations, its `nodeLabels` agree with the pod's nodeSelector on the keys they share, and for every
covered resource the Workload's total (pod sets' count x per-pod request) is within `nominalQuota` less
what is reserved (`status.flavorsReservation`, which counts reserved and admitted Workloads alike; Kueue
checks quota against reservations, so `flavorsUsage`, admitted only, is the fallback). Cohort borrowing
is not counted: a Workload that only fits by borrowing is told as waiting for quota. The chosen flavors'
`nodeLabels` join the pods' nodeSelector and their `tolerations` the pods' tolerations (Kueue injects
both at admission). Counted Workloads take quota in Kueue's order (priority, then age), so two that each
fit alone but not together count once. Each pod set gives `count` pods (Kueue admits all of `count`
unless the alpha PartialAdmission gate is on and `minCount` is set: `count` is what it asks first). A
Workload's `since` is its `QuotaReserved=False` lastTransitionTime, else its creationTimestamp.

Counted for nodes this way is mostly brief in a real cluster: Kueue reserves quota without looking at
nodes, so a Workload with quota left is admitted at Kueue's next cycle, and its pods then wait as pods.

Not counted, told (one note per ClusterQueue and reason, with numbers):
- no quota reserved and the ClusterQueue's quota is used up: more nodes would not admit them;
- the LocalQueue or ClusterQueue does not exist, is not Active (condition `Active=False`), or has a
  `stopPolicy` (Hold, HoldAndDrain);
- a requested resource no resource group of the ClusterQueue covers (Kueue finds no flavor for it);
- quota reserved but not admitted: waiting on admission checks (ProvisioningRequest and others); gpufleet
  does not answer them, so a launched node would not admit the Workload. A Rejected check is said so.
- the Workload's namespace is not one its ClusterQueue's `spec.namespaceSelector` selects. That is a
  LabelSelector over the Namespace objects' labels: absent (null) selects no namespace, `{}` every one
  (clusterqueue_types.go). Kueue's scheduler checks it before any flavor or quota and leaves the Workload
  pending (QuotaReserved False, reason Pending, "Workload namespace doesn't match ClusterQueue selector"),
  so a LocalQueue a tenant points at another team's ClusterQueue takes none of that team's quota here
  either. The Namespaces are listed only when a selector has terms (`namespaces`; unreadable: those
  ClusterQueues' Workloads are told, not counted).
Bounded by tenant (kubernetes/queued.py `Budget`, in Kueue's order; the ClusterQueue is the shared queue):
a Workload past its namespace's budget takes no quota here; one cut later by its ClusterQueue's or the
cluster's bound has taken its quota in this read already (the next Workloads see less left).
Not modelled: required node affinity in flavor matching (only nodeSelector), Topology-Aware Scheduling,
fair sharing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.domain.models import QueuedSource, UnfitWork
from gpufleet.domain.quantity import parse_quantity
from gpufleet.kubernetes.pods import DEFAULT_GPU_RESOURCES, WaitingPod, gpus_of, label_selector_matches, pod_requests
from gpufleet.kubernetes.pods import as_list as _list
from gpufleet.kubernetes.pods import as_map as _map
from gpufleet.kubernetes.pods import time_of as _time
from gpufleet.kubernetes.queued import MAX_QUEUED_PODS, Ask, Budget, Limits, QueuedDemand, gang_key, template_pods


@dataclass(frozen=True)
class KueueObjects:
    """One cluster's Kueue objects, each list as the API's items (any shape: read leniently), and the
    Namespaces' labels by name where a ClusterQueue's namespaceSelector needs them (None: not listed;
    `namespaces_unreadable` says why when the listing failed)."""

    workloads: list[Any] = field(default_factory=list)
    cluster_queues: list[Any] = field(default_factory=list)
    local_queues: list[Any] = field(default_factory=list)
    flavors: list[Any] = field(default_factory=list)
    namespaces: Mapping[str, Mapping[str, Any]] | None = None
    namespaces_unreadable: str = ""


def needs_namespaces(cluster_queues: list[Any]) -> bool:
    """Whether a ClusterQueue's namespaceSelector has terms (null selects none, `{}` all: no labels needed)."""
    return any(_map(_map(d.get("spec")).get("namespaceSelector")) for d in _list(cluster_queues))


def namespace_labels(items: list[Any]) -> dict[str, Mapping[str, Any]]:
    """A NamespaceList's items as name -> labels."""
    return {
        _text(_map(d.get("metadata")).get("name")): _map(_map(d.get("metadata")).get("labels"))
        for d in _list(items)
        if _text(_map(d.get("metadata")).get("name"))
    }


_STOPPED = ("Hold", "HoldAndDrain")  # StopPolicy values; "None" (the default) keeps the queue running


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.3g}"


def _conditions(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {_text(c.get("type")): c for c in _list(status.get("conditions"))}


def _true(conditions: Mapping[str, Mapping[str, Any]], kind: str) -> bool:
    return conditions.get(kind, {}).get("status") == "True"


def _halted(doc: Mapping[str, Any]) -> str:
    """Why a queue takes no Workloads: its stopPolicy, or its Active condition False; '' when it runs."""
    stop = _text(_map(doc.get("spec")).get("stopPolicy"))
    if stop in _STOPPED:
        return f"stopPolicy {stop}"
    active = _conditions(_map(doc.get("status"))).get("Active")
    if active is not None and active.get("status") == "False":
        reason = _text(active.get("reason"))
        return f"not Active ({reason})" if reason else "not Active"
    return ""


@dataclass(frozen=True)
class _Flavor:
    name: str
    labels: dict[str, str]
    taints: list[tuple[str, str, str]]  # (key, value, effect)
    tolerations: list[Mapping[str, Any]]


def _flavor(doc: Mapping[str, Any]) -> _Flavor:
    spec = _map(doc.get("spec"))
    taints = [
        (_text(t.get("key")), _text(t.get("value")), _text(t.get("effect"))) for t in _list(spec.get("nodeTaints"))
    ]
    labels = {str(k): str(v) for k, v in _map(spec.get("nodeLabels")).items()}
    return _Flavor(_text(_map(doc.get("metadata")).get("name")), labels, taints, _list(spec.get("tolerations")))


def _tolerated(taint: tuple[str, str, str], tolerations: list[Mapping[str, Any]]) -> bool:
    """Kubernetes' toleration rule (an empty effect or key with Exists matches all)."""
    key, value, effect = taint
    for t in tolerations:
        if _text(t.get("effect")) and t.get("effect") != effect:
            continue
        operator = _text(t.get("operator")) or "Equal"
        if operator == "Exists" and (not _text(t.get("key")) or t.get("key") == key):
            return True
        if operator == "Equal" and t.get("key") == key and _text(t.get("value")) == value:
            return True
    return False


def _flavor_refusal(flavor: _Flavor, specs: list[Mapping[str, Any]]) -> str:
    """Why Kueue would not assign this flavor to these pod templates (checkFlavorForPodSets), or ''."""
    for spec in specs:
        tolerations = _list(spec.get("tolerations")) + flavor.tolerations
        for taint in flavor.taints:
            if taint[2] in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
                return f"flavor {flavor.name}: untolerated taint {taint[0]}={taint[1]}:{taint[2]}"
        selector = _map(spec.get("nodeSelector"))
        for key, value in flavor.labels.items():
            if key in selector and str(selector[key]) != value:
                return f"flavor {flavor.name}: nodeSelector {key}={selector[key]} does not match"
    return ""


@dataclass
class _Queue:
    """A ClusterQueue as the reader needs it: resource groups (covered resources, flavors in order with
    their nominal quota) and what is reserved, less what this read has already counted."""

    name: str
    halted: str
    groups: list[tuple[frozenset[str], list[tuple[str, dict[str, float]]]]]
    used: dict[tuple[str, str], float] = field(default_factory=dict)  # (flavor, resource) -> reserved
    selector: Mapping[str, Any] | None = None  # spec.namespaceSelector; None: absent, selects no namespace


def _usage(status: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    found = status.get("flavorsReservation")
    rows = _list(found) if isinstance(found, list) else _list(status.get("flavorsUsage"))
    return {
        (_text(f.get("name")), _text(r.get("name"))): parse_quantity(r.get("total", 0))
        for f in rows
        for r in _list(f.get("resources"))
    }


def _queue(doc: Mapping[str, Any]) -> _Queue:
    groups = []
    for group in _list(_map(doc.get("spec")).get("resourceGroups")):
        listed = group.get("coveredResources")
        covered = frozenset(r for r in (listed if isinstance(listed, list) else []) if isinstance(r, str))
        flavors = [
            (
                _text(f.get("name")),
                {_text(r.get("name")): parse_quantity(r.get("nominalQuota", 0)) for r in _list(f.get("resources"))},
            )
            for f in _list(group.get("flavors"))
        ]
        groups.append((covered, flavors))
    name = _text(_map(doc.get("metadata")).get("name"))
    found = _map(doc.get("spec")).get("namespaceSelector")
    selector = found if isinstance(found, Mapping) else None
    return _Queue(name, _halted(doc), groups, _usage(_map(doc.get("status"))), selector)


@dataclass(frozen=True)
class _Work:
    """One Workload read: its pod sets (name, count, template spec), total requests and GPUs."""

    namespace: str
    name: str
    specs: list[tuple[str, int, Mapping[str, Any]]]
    total: dict[str, float]
    gpus: float
    pods: int  # its GPU pods (pod sets asking for no GPU are not GPU demand)
    priority: int | None
    since: datetime | None
    owner: str
    queue_name: str


def _work(doc: Mapping[str, Any], gpu_resources: Mapping[str, float]) -> _Work | None:
    meta, spec = _map(doc.get("metadata")), _map(doc.get("spec"))
    specs: list[tuple[str, int, Mapping[str, Any]]] = []
    total: dict[str, float] = {}
    gpus, pods = 0.0, 0
    for i, ps in enumerate(_list(spec.get("podSets"))):
        count = ps.get("count", 1)
        count = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
        template = _map(_map(ps.get("template")).get("spec"))
        requests = pod_requests(template)
        for k, v in requests.items():
            total[k] = total.get(k, 0.0) + count * v
        gpus += count * gpus_of(requests, gpu_resources)
        pods += min(count, MAX_QUEUED_PODS + 1) if gpus_of(requests, gpu_resources) > 0 else 0
        specs.append((_text(ps.get("name")) or str(i), min(count, MAX_QUEUED_PODS + 1), template))
    name = _text(meta.get("name"))
    if not name or not gpus > 0:
        return None
    priority = spec.get("priority")
    reserved = _conditions(_map(doc.get("status"))).get("QuotaReserved", {})
    since = _time(reserved.get("lastTransitionTime")) if reserved.get("status") == "False" else None
    owners = _list(meta.get("ownerReferences"))
    return _Work(
        namespace=_text(meta.get("namespace")),
        name=name,
        specs=specs,
        total=total,
        gpus=gpus,
        pods=pods,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else None,
        since=since or _time(meta.get("creationTimestamp")),
        owner=_text(owners[0].get("name")) if owners else "",
        queue_name=_text(spec.get("queueName")),
    )


@dataclass(frozen=True)
class _Choice:
    """Where a Workload's pod sets would go: per pod set, the flavors Kueue would assign (empty when one
    does not fit) and the quota they take; or why not (`reason` names the note's kind)."""

    flavors: list[list[_Flavor]]
    takes: dict[tuple[str, str], float]
    reason: str = ""
    detail: str = ""


def _pod_set_requests(queue: _Queue, count: int, spec: Mapping[str, Any]) -> dict[str, float]:
    requests = {k: count * v for k, v in pod_requests(spec).items() if v > 0}
    if any("pods" in covered for covered, _ in queue.groups):
        requests["pods"] = float(count)  # Kueue counts pods where the ClusterQueue covers `pods`
    return requests


def _group_flavor(
    queue: _Queue,
    group: tuple[frozenset[str], list[tuple[str, dict[str, float]]]],
    requests: Mapping[str, float],
    spec: Mapping[str, Any],
    flavors: Mapping[str, _Flavor],
    takes: Mapping[tuple[str, str], float],
) -> tuple[_Flavor | None, list[str]]:
    """The first flavor of a resource group, in the ClusterQueue's order, that fits the pod set, and why
    each one before it did not."""
    covered, options = group
    why: list[str] = []
    for name, quota in options:
        flavor = flavors.get(name)
        if flavor is None:
            why.append(f"flavor {name} not found")
            continue
        refusal = _flavor_refusal(flavor, [spec])
        if refusal:
            why.append(refusal)
            continue
        short = [
            f"{r} {_num(queue.used.get((name, r), 0.0) + takes.get((name, r), 0.0))} of {_num(quota.get(r, 0.0))}"
            f" in use in flavor {name}"
            for r in sorted(covered & requests.keys())
            if queue.used.get((name, r), 0.0) + takes.get((name, r), 0.0) + requests[r] > quota.get(r, 0.0) + 1e-9
        ]
        if not short:
            return flavor, why
        why.extend(short)
    return None, why


def _choose(queue: _Queue, work: _Work, flavors: Mapping[str, _Flavor], gpu_resources: Mapping[str, float]) -> _Choice:
    """Kueue's flavor assignment, pod set by pod set, within nominal quota (no borrowing)."""
    chosen: list[list[_Flavor]] = []
    takes: dict[tuple[str, str], float] = {}
    for _, count, spec in work.specs:
        requests = _pod_set_requests(queue, count, spec)
        uncovered = sorted(r for r in requests if not any(r in covered for covered, _ in queue.groups))
        if uncovered:
            return _Choice([], {}, "uncovered", ", ".join(uncovered))
        picked: list[_Flavor] = []
        for group in queue.groups:
            if not group[0] & requests.keys():
                continue
            flavor, why = _group_flavor(queue, group, requests, spec, flavors, takes)
            if flavor is None:
                gpu_first = sorted(why, key=lambda w: not any(g in w for g in gpu_resources))
                return _Choice([], {}, "quota", "; ".join(gpu_first) or "no flavors")
            picked.append(flavor)
            for r in group[0] & requests.keys():
                takes[(flavor.name, r)] = takes.get((flavor.name, r), 0.0) + requests[r]
        chosen.append(picked)
    return _Choice(chosen, takes)


def _pods(work: _Work, chosen: list[list[_Flavor]], gpu_resources: Mapping[str, float]) -> list[WaitingPod]:
    """The gang's waiting pods, each pod set with its flavors' node labels and tolerations."""
    gang = gang_key(QueuedSource.KUEUE, work.namespace, work.name)
    pods: list[WaitingPod] = []
    for (set_name, count, spec), picked in zip(work.specs, chosen, strict=True):
        labels = {k: v for f in picked for k, v in f.labels.items()}
        pods += template_pods(
            spec,
            gang=gang,
            namespace=work.namespace,
            name=f"{work.name}/{set_name}",
            count=count,
            since=work.since,
            priority=work.priority,
            node_labels=labels,
            tolerations=[t for f in picked for t in f.tolerations],
            gpu_resources=gpu_resources,
            owner=work.owner or work.name,
        )
    return pods


@dataclass
class _Notes:
    """Workloads not counted, told once per (ClusterQueue or LocalQueue, reason): how many, their GPUs,
    and the first one's detail."""

    found: dict[tuple[str, str], list[Any]] = field(default_factory=dict)

    def add(self, where: str, reason: str, work: _Work, detail: str) -> None:
        entry = self.found.setdefault((where, reason), [0, 0.0, detail])
        entry[0] += 1
        entry[1] += work.gpus

    def told(self) -> tuple[UnfitWork, ...]:
        out = []
        for (where, reason), (count, gpus, detail) in sorted(self.found.items()):
            head = f"{count} Workload{'s' if count != 1 else ''} ({_num(gpus)} GPUs)"
            said = _PHRASES[reason](where, detail)
            if count == 1:  # "1 Workload waits", not "wait"
                verb, _, rest = said.partition(" ")
                said = f"{_SINGULAR.get(verb, verb)} {rest}"
            out.append(UnfitWork(key=f"kueue:{where}:{reason}", count=count, text=f"{head} {said}"))
        return tuple(out)


_SINGULAR = {"wait": "waits", "request": "requests", "are": "is", "hold": "holds", "in": "in"}
_PHRASES = {
    "quota": lambda q, d: f"wait for quota in ClusterQueue {q}: {d}; more nodes would not admit them",
    "uncovered": lambda q, d: (
        f"request {d}, which no resource group of ClusterQueue {q} covers; Kueue will not admit them"
    ),
    "localqueue": lambda q, d: f"are queued to LocalQueue {q}, which {d}; more nodes would not admit them",
    "clusterqueue": lambda q, d: f"are queued to ClusterQueue {q}, which {d}; more nodes would not admit them",
    "checks": lambda q, d: (
        f"hold quota in ClusterQueue {q} and wait on admission checks ({d}); gpufleet does not answer them, so"
        " more nodes would not admit them"
    ),
    "rejected": lambda q, d: f"in ClusterQueue {q} were rejected by admission checks ({d})",
    "namespace": lambda q, d: (
        f"are queued to ClusterQueue {q} from {d}, which its namespaceSelector does not select; Kueue will not"
        " admit them there, so they take none of its quota"
    ),
}


def _waits(doc: Mapping[str, Any], now: datetime) -> str:
    """'pending' (no quota reserved: may count), 'reserved' (quota held, not admitted: told) or '' (not
    demand: admitted, finished, deactivated, on hold, or backing off until a requeue time to come)."""
    spec, status = _map(doc.get("spec")), _map(doc.get("status"))
    conditions = _conditions(status)
    if _true(conditions, "Admitted") or _true(conditions, "Finished") or spec.get("active") is False:
        return ""
    if conditions.get("QuotaReserved", {}).get("reason") == "OnHold" and not _true(conditions, "QuotaReserved"):
        return ""
    requeue_at = _time(_map(status.get("requeueState")).get("requeueAt"))
    if requeue_at is not None and requeue_at > now:
        return ""
    return "reserved" if _true(conditions, "QuotaReserved") else "pending"


def _checks(doc: Mapping[str, Any]) -> tuple[str, str]:
    """A quota-holding Workload's admission checks: ('rejected' or 'checks', 'name State, ...')."""
    states = [
        (_text(c.get("name")), _text(c.get("state"))) for c in _list(_map(doc.get("status")).get("admissionChecks"))
    ]
    rejected = [f"{n} Rejected" for n, s in states if s == "Rejected"]
    if rejected:
        return "rejected", ", ".join(rejected)
    waiting = [f"{n} {s or 'Pending'}" for n, s in states if s != "Ready"]
    return "checks", ", ".join(waiting) or "none pending; admission is due"


def _order(item: tuple[Mapping[str, Any], _Work]) -> tuple[int, bool, str, str, str]:
    """Kueue's queue order: higher priority first, then the older."""
    work = item[1]
    since = work.since.isoformat() if work.since is not None else ""
    return (-(work.priority or 0), work.since is None, since, work.namespace, work.name)


def _pending(
    objects: KueueObjects, now: datetime, gpu_resources: Mapping[str, float], notes: _Notes
) -> list[tuple[Mapping[str, Any], _Work]]:
    """The Workloads with no quota reserved that may count; those holding quota unadmitted are told."""
    pending: list[tuple[Mapping[str, Any], _Work]] = []
    for doc in _list(objects.workloads):
        state = _waits(doc, now)
        work = _work(doc, gpu_resources) if state else None
        if work is None:
            continue
        if state == "reserved":
            holder = _text(_map(_map(doc.get("status")).get("admission")).get("clusterQueue")) or "?"
            reason, detail = _checks(doc)
            notes.add(holder, reason, work, detail)
        else:
            pending.append((doc, work))
    return pending


def kueue_demand(
    objects: KueueObjects,
    now: datetime,
    gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES,
    limits: Limits | None = None,
) -> QueuedDemand:
    """The Workloads that count as demand, as gangs of waiting pods, and notes on those that do not."""
    flavors = {f.name: f for f in map(_flavor, _list(objects.flavors)) if f.name}
    queues = {q.name: q for q in map(_queue, _list(objects.cluster_queues)) if q.name}
    local = {
        (_text(_map(d.get("metadata")).get("namespace")), _text(_map(d.get("metadata")).get("name"))): d
        for d in _list(objects.local_queues)
    }
    notes = _Notes()
    pending = _pending(objects, now, gpu_resources, notes)
    budget = Budget(QueuedSource.KUEUE, "Workload", "ClusterQueue", limits or Limits())
    taken: list[tuple[Ask, _Work, _Choice]] = []
    for _, work in sorted(pending, key=_order):
        queue = _queue_of(work, local, queues, notes, objects)
        if queue is None:
            continue
        choice = _choose(queue, work, flavors, gpu_resources)
        if choice.reason:
            notes.add(queue.name, choice.reason, work, choice.detail)
            continue
        ask = Ask(
            gang_key(QueuedSource.KUEUE, work.namespace, work.name), work.namespace, queue.name, work.pods, work.gpus
        )
        if not budget.take(ask):  # sized before the pods are built; takes no quota
            continue
        for key, amount in choice.takes.items():
            queue.used[key] = queue.used.get(key, 0.0) + amount
        taken.append((ask, work, choice))
    kept = {a.key for a in budget.shared([t[0] for t in taken])}
    waiting = [
        pod for ask, work, choice in taken if ask.key in kept for pod in _pods(work, choice.flavors, gpu_resources)
    ]
    return QueuedDemand(
        source=QueuedSource.KUEUE,
        waiting=tuple(waiting),
        gangs=frozenset(kept),
        notes=notes.told() + budget.notes(),
    )


def _queue_of(
    work: _Work,
    local: Mapping[tuple[str, str], Mapping[str, Any]],
    queues: Mapping[str, _Queue],
    notes: _Notes,
    objects: KueueObjects,
) -> _Queue | None:
    """The ClusterQueue a pending Workload waits in, or None (told) when its queues take nothing."""
    where = f"{work.namespace}/{work.queue_name}"
    doc = local.get((work.namespace, work.queue_name))
    if doc is None:
        notes.add(where, "localqueue", work, "does not exist")
        return None
    halted = _halted(doc)
    if halted:
        notes.add(where, "localqueue", work, f"is {halted}")
        return None
    name = _text(_map(doc.get("spec")).get("clusterQueue"))
    queue = queues.get(name)
    if queue is None:
        notes.add(name or "?", "clusterqueue", work, "does not exist")
        return None
    if queue.halted:
        notes.add(name, "clusterqueue", work, f"is {queue.halted}")
        return None
    refusal = _namespace_refusal(queue, work.namespace, objects)
    if refusal:
        notes.add(name, refusal[0], work, refusal[1])
        return None
    return queue


def _namespace_refusal(queue: _Queue, namespace: str, objects: KueueObjects) -> tuple[str, str] | None:
    """(reason, detail) when the ClusterQueue's namespaceSelector does not select the Workload's namespace
    (or cannot be checked); None when it does."""
    if queue.selector is None:
        return "clusterqueue", "has no namespaceSelector (it selects no namespace)"
    if not queue.selector:
        return None  # {}: every namespace
    if objects.namespaces is None:
        why = objects.namespaces_unreadable or "the Namespaces were not listed"
        return "clusterqueue", f"has a namespaceSelector that cannot be checked ({why})"
    labels = objects.namespaces.get(namespace)
    if labels is None or not label_selector_matches(queue.selector, labels):
        return "namespace", f"namespace {namespace}"
    return None
