"""Volcano's gangs as demand (`scheduling.volcano.sh/v1beta1` PodGroups). Pure: PodGroups (and the Volcano
Jobs that own them, for their tasks' shapes) in, as the API lists them; gangs of waiting pods and notes
out (kubernetes/queued.py).

Field names and rules from Volcano's own code (volcano-sh/apis pkg/apis/scheduling/v1beta1/types.go and
pkg/apis/batch/v1alpha1/job.go; volcano-sh/volcano pkg/controllers/job/job_controller_actions.go,
job_controller_util.go, pkg/scheduler/framework/session.go, pkg/scheduler/plugins/gang/gang.go,
pkg/scheduler/plugins/overcommit/overcommit.go).

A PodGroup is one gang: `spec.minMember` pods start together or none does (`spec.minTaskMember`: the
least per task; `spec.minResources`: the whole gang's requests). The scheduler's enqueue action moves
it Pending -> Inqueue only when the cluster's idle resources (x the overcommit factor, 1.2) hold
`minResources`, and the Volcano Job controller creates no pod before Inqueue. So at min 0 nodes a gang
stays Pending with no pod for any autoscaler to see (volcano#3804, #3910, #2558): this reader is the
demand they miss.

Counted, as ONE gang (`volcano:NS/PODGROUP`; each of its pods carries the key):
- `status.phase` Pending, or no phase yet (a PodGroup the scheduler has not seen; the Job controller
  treats it as Pending too): the gang waits to be enqueued, no pod exists;
- `status.phase` Inqueue with `status.running` 0: pods may exist and wait. They carry the PodGroup's name
  in the `scheduling.k8s.io/group-name` annotation, so they hold the same gang key and
  kubernetes/queued.py `merged` drops them: the gang counts for them. With a pod running the gang is left to
  its pods (the waiting ones count as pods), else the running ones would be counted twice. The scheduler
  sets Running once `minMember` pods are bound (session.go getPodGroupPhase), so a bound but not yet
  running pod of an Inqueue gang is a window of one scheduling session.
Not counted, nothing said: Running, Unknown (some run, some cannot be placed: those wait as pods),
Completed, any other phase; a gang whose pods ask for no GPU.

The gang's pods:
- Its owner (`metadata.ownerReferences`, kind Job, apiVersion batch.volcano.sh/v1alpha1, matched by uid,
  else by name) found in the Jobs: `spec.tasks[]` (name, replicas, minAvailable, template.spec) give the
  shapes, and the counts follow the Job controller's own `calcPGMinResources`, so the pods' requests add
  up to the `minResources` Volcano wrote. Each task's least is `minTaskMember[task]` where the PodGroup
  gives it, else its `minAvailable`, else its `replicas`. When `minMember` is below the sum of those, the
  scheduler looks only at `minMember` (job_info.go CheckTaskReady): the first `minMember` pods in task
  order, each task up to its replicas. Otherwise each task's least, then the rest of `minMember` from the
  tasks' remaining replicas in task order. Volcano orders tasks by their PriorityClass's value; without
  the PriorityClasses we order by the template's `spec.priority` where set (stable), else as listed.
- No Job (not installed, not readable, or not its owner): `minResources` / `minMember` as equal pods where
  that gives whole GPUs per pod; else the GPUs on the fewest pods of 8, 4, 2 or 1 GPUs that take them
  exactly (a launcher beside the workers asks for none: `gpu_pods`), else equal pods rounded up.
  The quota keys Volcano writes there beside the resources (`pods`, `count/pods`, `requests.*`,
  `limits.*`: the quota pod usage, controllers/util CalTaskRequests) are dropped; a resource given only as
  `requests.NAME` is read as NAME. Each GPU resource per pod rounds up to whole units (12 GPUs over 8 pods
  is 2 each: a GPU cannot be split across pods, so the gang may ask a little more than it said); other
  resources divide exactly. No GPU in `minResources`: not GPU demand.
- Priority: Volcano resolves `priorityClassName` to a value; PriorityClasses are not read here, so a pod
  takes its task template's `spec.priority`, else 0.
- `since`: the PodGroup's creationTimestamp. The gang plugin rewrites the `Unschedulable` condition with
  lastTransitionTime = now at every scheduling session the gang is not ready (gang.go), so that time says
  when it was last tried, not since when it waits; it is the fallback without a creationTimestamp.

Not counted until something will make its pods, told once per namespace: a PodGroup with no
`ownerReferences` that no pod names (`scheduling.k8s.io/group-name`). Whatever makes a gang's pods owns its
PodGroup: the Volcano Job controller (Job), an operator that delays its pods until the PodGroup is Inqueue
(Kubeflow's training operator: PyTorchJob, MPIJob; KubeRay; Spark), and the podgroup controller for plain
pods (the pod, or the pod's own owner). A PodGroup written by hand with neither is a gang nobody will
start: nodes launched for it would sit idle until the gang give-back. Its pods, once they exist, make it
demand again. (A forged ownerReference does not help: the garbage collector deletes an object whose
owners do not exist.)

Told (one note per PodGroup, with numbers), seen and not counted: `minMember` 0 or below, or above
MAX_QUEUED_PODS, with GPUs asked; a Job whose tasks' replicas cannot make `minMember` (its webhook refuses
that; the gang could never start). The gangs counted are bounded per namespace, per Queue (`spec.queue`,
default `default`) and for the cluster (kubernetes/queued.py `Budget`): whole gangs past a bound are not
counted, told once per namespace, sized before their pods are built.

Known limit: a Pending gang held by its Queue's `spec.capability` (not by nodes) is counted too; Queues are
not read, so nodes may come that the queue will not let it use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.domain.models import QueuedSource, UnfitWork
from gpufleet.domain.quantity import parse_quantity
from gpufleet.kubernetes.pods import DEFAULT_GPU_RESOURCES, WaitingPod, gpus_of, pod_requests, priority_of
from gpufleet.kubernetes.pods import as_list as _list
from gpufleet.kubernetes.pods import as_map as _map
from gpufleet.kubernetes.pods import time_of as _time
from gpufleet.kubernetes.queued import MAX_QUEUED_PODS, Ask, Budget, Limits, QueuedDemand, gang_key, template_pods

JOB_API = "batch.volcano.sh/v1alpha1"
COUNTED = frozenset({"", "Pending"})  # and Inqueue with no pod running
INQUEUE = "Inqueue"
_QUOTA_ONLY = ("pods", "count/")  # quota keys in minResources that are not a pod's requests
DEFAULT_QUEUE = "default"  # a PodGroup's spec.queue when unset (Volcano's webhook defaults it so)


@dataclass(frozen=True)
class VolcanoObjects:
    """One cluster's PodGroups and Volcano Jobs (None: the Jobs could not be listed or are not installed),
    and the gang keys the cluster's unfinished pods name (`ClusterPods.pod_gangs`): a PodGroup with no
    owner is demand only while a pod names it."""

    podgroups: list[Any] = field(default_factory=list)
    jobs: list[Any] | None = None
    pod_gangs: frozenset[str] = frozenset()


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _since(pg: Mapping[str, Any]) -> datetime | None:
    """creationTimestamp, else the Unschedulable condition's time (module docstring: why not that first)."""
    created = _time(_map(pg.get("metadata")).get("creationTimestamp"))
    if created is not None:
        return created
    for c in _list(_map(pg.get("status")).get("conditions")):
        if c.get("type") == "Unschedulable" and c.get("status") == "True":
            return _time(c.get("lastTransitionTime"))
    return None


def _counted(pg: Mapping[str, Any]) -> bool:
    status = _map(pg.get("status"))
    phase = status.get("phase") or ""
    if not isinstance(phase, str):
        return False
    if phase in COUNTED:
        return True
    return phase == INQUEUE and _int(status.get("running")) == 0


def _jobs_index(jobs: list[Any] | None) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """Volcano Jobs by ("uid", UID, "") and ("name", namespace, name)."""
    found: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for job in _list(jobs):
        meta = _map(job.get("metadata"))
        if meta.get("uid"):
            found[("uid", str(meta["uid"]), "")] = job
        found[("name", str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = job
    return found


def _owner_job(
    pg: Mapping[str, Any], namespace: str, jobs: Mapping[tuple[str, str, str], Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    for ref in _list(_map(pg.get("metadata")).get("ownerReferences")):
        if ref.get("kind") != "Job" or ref.get("apiVersion") != JOB_API:
            continue
        job = jobs.get(("uid", str(ref["uid"]), "")) if ref.get("uid") else None
        return job or jobs.get(("name", namespace, str(ref.get("name") or "")))
    return None


@dataclass(frozen=True)
class _Task:
    name: str
    replicas: int
    least: int  # minTaskMember, else minAvailable, else replicas (capped at replicas)
    spec: Mapping[str, Any]


def _tasks(job: Mapping[str, Any], min_task_member: Mapping[str, Any]) -> list[_Task]:
    """The Job's tasks in Volcano's order: by template priority, highest first, stable (module docstring)."""
    out = []
    for t in _list(_map(job.get("spec")).get("tasks")):
        name = str(t.get("name") or "")
        replicas = max(0, _int(t.get("replicas")))
        given = min_task_member.get(name)
        least = _int(given, -1) if given is not None else _int(t.get("minAvailable"), replicas)
        spec = _map(_map(t.get("template")).get("spec"))
        out.append(_Task(name, replicas, min(max(0, least if least >= 0 else replicas), replicas), spec))
    return sorted(out, key=lambda t: -priority_of(t.spec))


def task_counts(tasks: list[_Task], min_member: int) -> list[int] | None:
    """Pods per task for a gang of `min_member`, as the Job controller's calcPGMinResources counts them;
    None when the tasks' replicas cannot make `min_member`."""
    if sum(t.replicas for t in tasks) < min_member:
        return None
    left = min_member
    if min_member < sum(t.least for t in tasks):  # only minMember counts: the first pods in task order
        counts = []
        for t in tasks:
            counts.append(min(left, t.replicas))
            left -= counts[-1]
        return counts
    counts = [t.least for t in tasks]
    left -= sum(counts)
    for i, t in enumerate(tasks):
        extra = min(left, t.replicas - t.least)
        counts[i] += extra
        left -= extra
    return counts


def _resource_name(key: str) -> str | None:
    """The resource a minResources key names, or None for a quota-only key (`pods`, `count/pods`,
    `limits.cpu`)."""
    if key.startswith("limits.") or key == "pods" or key.startswith("count/"):
        return None
    return key.removeprefix("requests.")


def _number(value: float) -> str:
    """A quantity the API's parser reads back: '17179869184.0', '1e+20'; past a float, '1e400' (inf)."""
    return repr(float(value)) if math.isfinite(value) else "1e400"


def _whole(units: float) -> float:
    return float(math.ceil(units - 1e-9)) if math.isfinite(units) else units


def even_spec(min_resources: Mapping[str, Any], min_member: int, gpu_resources: Mapping[str, float]) -> dict[str, Any]:
    """One pod's template: `minResources` / `minMember`, GPU resources rounded up to whole units."""
    totals: dict[str, float] = {}
    for key, text in min_resources.items():
        name = _resource_name(str(key))
        if name is not None and (name not in totals or name == key):  # `nvidia.com/gpu` wins over `requests.`
            totals[name] = parse_quantity(text)
    per_pod = {
        name: _number(_whole(v / min_member) if name in gpu_resources else v / min_member)
        for name, v in totals.items()
        if v > 0
    }
    return {"containers": [{"name": "gang", "resources": {"requests": per_pod}}]}


def _gpus_said(spec: Mapping[str, Any], gpu_resources: Mapping[str, float]) -> float:
    """The GPUs `minResources` names for the whole gang (plain or `requests.` key, whichever is larger)."""
    said = _map(spec.get("minResources"))
    return sum(
        max(parse_quantity(said.get(r)), parse_quantity(said.get(f"requests.{r}"))) / per_gpu
        for r, per_gpu in gpu_resources.items()
    )


def _note(key: str, text: str) -> UnfitWork:
    return UnfitWork(key=f"{key}:{text.split(':')[0]}", count=1, text=text)


@dataclass(frozen=True)
class _Plan:
    """One gang sized before its pods are built (`ask`), and how to build them (`pods`)."""

    ask: Ask
    pods: Callable[[], list[WaitingPod]]


def _gpu_asks(spec: Mapping[str, Any], gpu_resources: Mapping[str, float]) -> bool:
    return gpus_of(pod_requests(spec), gpu_resources) > 0


def _job_plan(
    pg: Mapping[str, Any], job: Mapping[str, Any], key: str, queue: str, gpu_resources: Mapping[str, float]
) -> _Plan | UnfitWork | None:
    """The gang's pods from its Job's tasks; None when the Job lists no task (minResources then)."""
    meta, spec = _map(pg.get("metadata")), _map(pg.get("spec"))
    namespace, min_member = str(meta.get("namespace") or ""), _int(spec.get("minMember"))
    tasks = _tasks(job, _map(spec.get("minTaskMember")))
    if not tasks:
        return None
    counts = task_counts(tasks, min_member)
    if counts is None:
        replicas = sum(t.replicas for t in tasks)
        text = f"unreachable: PodGroup {key} needs minMember {min_member} pods, its Job's tasks have {replicas}"
        return _note(key, text)
    job_name = str(_map(job.get("metadata")).get("name") or meta.get("name") or "")
    shaped = [(t, c) for t, c in zip(tasks, counts, strict=True) if c > 0 and _gpu_asks(t.spec, gpu_resources)]
    gpus = sum(c * gpus_of(pod_requests(t.spec), gpu_resources) for t, c in shaped)

    def build() -> list[WaitingPod]:
        pods: list[WaitingPod] = []
        for task, count in shaped:
            pods += template_pods(
                task.spec,
                gang=key,
                namespace=namespace,
                name=f"{job_name}-{task.name}",
                count=count,
                since=_since(pg),
                gpu_resources=gpu_resources,
            )
        return pods

    return _Plan(Ask(key, namespace, queue, sum(c for _, c in shaped), gpus), build)


def _owned(pg: Mapping[str, Any]) -> bool:
    return bool(_list(_map(pg.get("metadata")).get("ownerReferences")))


def _plan(
    pg: Mapping[str, Any],
    jobs: Mapping[tuple[str, str, str], Mapping[str, Any]],
    gpu_resources: Mapping[str, float],
    pod_gangs: frozenset[str],
) -> _Plan | UnfitWork | str | None:
    """One PodGroup's gang, sized (no pods built yet); a note on why it is not counted; its namespace when
    it is a bare PodGroup (no owner, no pod: nothing will make its pods); or None (not waiting, not a
    PodGroup, or no GPU asked)."""
    meta, spec = _map(pg.get("metadata")), _map(pg.get("spec"))
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if not name or not _counted(pg):
        return None
    key = gang_key(QueuedSource.VOLCANO, namespace, name)
    min_member = _int(spec.get("minMember"))
    job = _owner_job(pg, namespace, jobs)
    if not 0 < min_member <= MAX_QUEUED_PODS:
        asks = _gpus_said(spec, gpu_resources) > 0 or (
            job is not None and any(_gpu_asks(t.spec, gpu_resources) for t in _tasks(job, {}))
        )
        bound = f"0 < minMember <= {MAX_QUEUED_PODS}"
        text = f"absurd: PodGroup {key} asks for GPUs with minMember {min_member} (counted only {bound})"
        return _note(key, text) if asks else None
    if not _owned(pg) and key not in pod_gangs:
        return namespace if _gpus_said(spec, gpu_resources) > 0 else None
    queue = str(spec.get("queue") or DEFAULT_QUEUE)
    found = _job_plan(pg, job, key, queue, gpu_resources) if job is not None else None
    if found is not None:
        return found
    holders = gpu_pods(_gpus_said(spec, gpu_resources), min_member)
    per_pod = even_spec(_map(spec.get("minResources")), holders, gpu_resources)
    if not _gpu_asks(per_pod, gpu_resources):
        return None
    gpus = holders * gpus_of(pod_requests(per_pod), gpu_resources)

    def build() -> list[WaitingPod]:
        return template_pods(
            per_pod, gang=key, namespace=namespace, name=name, count=holders, since=_since(pg),
            gpu_resources=gpu_resources,
        )  # fmt: skip

    return _Plan(Ask(key, namespace, queue, holders, gpus), build)


def gpu_pods(gpus: float, min_member: int) -> int:
    """How many of a gang's `min_member` pods hold its `gpus`, without the Job's tasks to say it: all of
    them when the GPUs split into whole GPUs per pod; else the fewest pods of a common size (8, 4, 2 or 1
    GPUs) that take them all exactly, since a launcher or a
    parameter server beside the workers asks for none (Kubeflow's MPIJob, PyTorchJob with Volcano's gang
    plugin); else all of them, evenly (rounded up per pod)."""
    if not (math.isfinite(gpus) and gpus > 0) or (gpus / min_member).is_integer():
        return min_member  # whole GPUs on every pod: as Volcano's own even split would say
    for size in (8, 4, 2, 1):
        pods = gpus / size
        if pods == int(pods) and pods <= min_member:
            return int(pods)
    return min_member


def _bare_note(namespace: str, count: int) -> UnfitWork:
    them = "PodGroup has" if count == 1 else "PodGroups have"
    text = (
        f"idle: {count} {them} no owner in namespace {namespace} and no pod names them: nothing will create "
        "their pods (a Volcano Job, an operator or the podgroup controller would own them); not counted "
        "until their pods or their owner exist"
    )
    return UnfitWork(key=f"volcano:bare:{namespace}", count=count, text=text)


def volcano_demand(
    objects: VolcanoObjects,
    now: datetime,
    gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES,
    limits: Limits | None = None,
) -> QueuedDemand:
    """The PodGroups that count as demand, as gangs of waiting pods, and notes on those that do not
    (module docstring). Oldest first, whole gangs only, within the tenant budgets (`Budget`)."""
    jobs = _jobs_index(objects.jobs)
    podgroups = sorted(_list(objects.podgroups), key=lambda pg: _since(pg) or now)
    budget = Budget(QueuedSource.VOLCANO, "PodGroup", "Queue", limits or Limits())
    notes: list[UnfitWork] = []
    bare: dict[str, int] = {}
    taken: list[_Plan] = []
    for pg in podgroups:
        found = _plan(pg, jobs, gpu_resources, objects.pod_gangs)
        if isinstance(found, UnfitWork):
            notes.append(found)
        elif isinstance(found, str):
            bare[found] = bare.get(found, 0) + 1
        elif found is not None and found.ask.pods > 0 and budget.take(found.ask):
            taken.append(found)
    kept = {a.key for a in budget.shared([p.ask for p in taken])}
    waiting = [pod for p in taken if p.ask.key in kept for pod in p.pods()]
    notes += [_bare_note(ns, n) for ns, n in sorted(bare.items())]
    notes += budget.notes()
    gangs = frozenset(p.gang for p in waiting)
    return QueuedDemand(source=QueuedSource.VOLCANO, waiting=tuple(waiting), gangs=gangs, notes=tuple(notes))
