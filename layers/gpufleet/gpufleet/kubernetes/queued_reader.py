"""Read a cluster's queued jobs (glue): each queueing system's objects listed with the pod reader's
connection, paged like the pods, then read as demand by the pure readers (kubernetes/kueue.py,
kubernetes/volcano.py).

Per system, one paged `GET` per resource, cluster-wide:
- Kueue (`kueue.x-k8s.io/v1beta1`, else `v1beta2`): workloads, clusterqueues, localqueues, resourceflavors;
  and `/api/v1/namespaces` only when a ClusterQueue's namespaceSelector has terms (its labels decide
  which namespaces may use that queue's quota);
- Volcano: `scheduling.volcano.sh/v1beta1` podgroups, and `batch.volcano.sh/v1alpha1` jobs (the tasks'
  shapes where a PodGroup's owner is a Volcano Job; optional).

A page too big to hold (over client.MAX_BODY inflated, a 413, a Status that says so) is asked again with
half the limit, which holds for the rest of that listing, down to KUBE_MIN_PAGE objects: any tenant may
make its objects large (up to the API's ~1.5 MiB each), and that must not leave the cluster's demand
unread.

A 404 on a system's first resource means its CRDs are not installed: nothing to read, nothing said. A
failure (a timeout included) leaves that system unreadable and the pods read. A 403
(AmazonEKSViewPolicy does not cover these resources) says which ClusterRole grants them
(deploy/kubernetes/gpufleet-queued-jobs.yaml): that system's demand is unknown, told once, and the pods
are read as before. Any other failure of a system's listing leaves that system unreadable, never the pods.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.domain.defaults import KUBE_MIN_PAGE, QUEUED_JOBS_GROUP
from gpufleet.domain.models import QueuedSource, UnfitWork
from gpufleet.kubernetes.client import Connection, HttpProblem, too_large
from gpufleet.kubernetes.kueue import KueueObjects, kueue_demand, namespace_labels, needs_namespaces
from gpufleet.kubernetes.queued import QueuedDemand
from gpufleet.kubernetes.volcano import VolcanoObjects, volcano_demand

KUEUE = "/apis/kueue.x-k8s.io/v1beta1"
KUEUE_VERSIONS = (KUEUE, "/apis/kueue.x-k8s.io/v1beta2")
VOLCANO_SCHEDULING = "/apis/scheduling.volcano.sh/v1beta1"
VOLCANO_BATCH = "/apis/batch.volcano.sh/v1alpha1"
NAMESPACES = "/api/v1/namespaces"
GRANT = f"deploy/kubernetes/gpufleet-queued-jobs.yaml (Kubernetes group {QUEUED_JOBS_GROUP})"


class NotInstalled(Exception):
    """The API has no such resource (404): the system's CRDs are not installed."""


@dataclass(frozen=True)
class Resource:
    path: str  # /apis/GROUP/VERSION/PLURAL
    kind: str  # the list's kind: WorkloadList
    optional: bool = False  # a system reads well without it (Volcano Jobs: only the tasks' shapes)


def list_all(connection: Connection, resource: Resource, page_size: int, max_pages: int) -> list[Any]:
    """Every object of one resource, cluster-wide, page by page; a page too big is asked again with half
    the limit (module docstring). NotInstalled on a 404; HttpProblem as the connection raises it; a page
    of another kind, or past `max_pages`, is malformed."""
    query: dict[str, str | int] = {"limit": page_size}
    items: list[Any] = []
    pages = 0
    while pages < max_pages:
        try:
            page = connection.get_json(resource.path, query)
        except HttpProblem as problem:
            if problem.status == 404:
                raise NotInstalled(resource.path) from None
            limit = int(query["limit"])
            if too_large(problem) and limit > KUBE_MIN_PAGE:
                query["limit"] = max(KUBE_MIN_PAGE, limit // 2)  # at most log2(page_size) more asks
                continue
            raise
        pages += 1
        if page.get("kind") != resource.kind or not isinstance(page.get("items"), list):
            raise HttpProblem("malformed", f"the answer to {resource.path} is not a {resource.kind}")
        items += page["items"]
        metadata = page.get("metadata")
        token = metadata.get("continue") if isinstance(metadata, Mapping) else None
        if not token:
            return items
        query["continue"] = str(token)
    raise HttpProblem("malformed", f"listing {resource.path} ran past {max_pages} pages")


def _why(problem: HttpProblem, resource: Resource) -> str:
    plural = resource.path.rsplit("/", 1)[-1]
    if problem.status == 403:
        return f"403 Forbidden listing {plural}: bind the role's access entry to {GRANT}"
    said = f" ({problem.said})" if problem.said else ""
    return f"listing {plural} failed: {problem.reason}{said}"


@dataclass
class QueuedReader:
    """`read(connection, sources, gpu_resources, now, pod_gangs)`: one QueuedDemand per system asked for
    (`pod_gangs`: the Volcano gangs the cluster's pods name, `ClusterPods.pod_gangs`)."""

    page_size: int = 500
    max_pages: int = 200
    skipped: list[str] = field(default_factory=list)  # optional resources that could not be read, and why
    pod_gangs: frozenset[str] = frozenset()

    def read(
        self,
        connection: Connection,
        sources: Collection[QueuedSource],
        gpu_resources: Mapping[str, float],
        now: datetime,
        pod_gangs: frozenset[str] = frozenset(),
    ) -> list[QueuedDemand]:
        self.pod_gangs = pod_gangs
        readers: dict[QueuedSource, Callable[[Connection, Mapping[str, float], datetime], QueuedDemand]] = {
            QueuedSource.KUEUE: self._kueue,
            QueuedSource.VOLCANO: self._volcano,
        }
        return [readers[s](connection, gpu_resources, now) for s in QueuedSource if s in sources]

    def _lists(
        self, connection: Connection, source: QueuedSource, resources: list[Resource]
    ) -> list[Any] | QueuedDemand:
        """Each resource's items, or the system's QueuedDemand when it is not installed or not readable."""
        out: list[Any] = []
        for i, resource in enumerate(resources):
            try:
                out.append(list_all(connection, resource, self.page_size, self.max_pages))
            except NotInstalled:
                if i == 0:
                    return QueuedDemand(source=source, installed=False)
                if not resource.optional:
                    return QueuedDemand(source=source, unreadable=f"{resource.path} is not served (404)")
                out.append(None)
            except HttpProblem as problem:  # a timeout too: the pods, read already, stay good
                if not resource.optional:
                    return QueuedDemand(source=source, unreadable=_why(problem, resource))
                self.skipped.append(_why(problem, resource))
                out.append(None)
        return out

    def _kueue(self, connection: Connection, gpu_resources: Mapping[str, float], now: datetime) -> QueuedDemand:
        """v1beta1 first (what Kueue serves through 0.14), then v1beta2 (Kueue's newer API, whose fields
        this reader uses unchanged) where v1beta1 is no longer served."""
        for api in KUEUE_VERSIONS:
            found = self._lists(
                connection,
                QueuedSource.KUEUE,
                [
                    Resource(f"{api}/workloads", "WorkloadList"),
                    Resource(f"{api}/clusterqueues", "ClusterQueueList"),
                    Resource(f"{api}/localqueues", "LocalQueueList"),
                    Resource(f"{api}/resourceflavors", "ResourceFlavorList"),
                ],
            )
            if not (isinstance(found, QueuedDemand) and not found.installed):
                break
        if isinstance(found, QueuedDemand):
            return found
        workloads, cluster_queues, local_queues, flavors = found
        namespaces, unreadable = self._namespaces(connection, cluster_queues or [])
        objects = KueueObjects(
            workloads=workloads or [],
            cluster_queues=cluster_queues or [],
            local_queues=local_queues or [],
            flavors=flavors or [],
            namespaces=namespaces,
            namespaces_unreadable=unreadable,
        )
        return kueue_demand(objects, now, gpu_resources)

    def _namespaces(self, connection: Connection, cluster_queues: list[Any]) -> tuple[dict[str, Any] | None, str]:
        """The Namespaces' labels when a ClusterQueue's namespaceSelector needs them, else (None, ""); a
        listing that fails is (None, why): those queues' Workloads are told, not counted."""
        if not needs_namespaces(cluster_queues):
            return None, ""
        resource = Resource(NAMESPACES, "NamespaceList")
        try:
            return namespace_labels(list_all(connection, resource, self.page_size, self.max_pages)), ""
        except NotInstalled:
            return None, "/api/v1/namespaces is not served (404)"
        except HttpProblem as problem:
            return None, _why(problem, resource)

    def _volcano(self, connection: Connection, gpu_resources: Mapping[str, float], now: datetime) -> QueuedDemand:
        found = self._lists(
            connection,
            QueuedSource.VOLCANO,
            [
                Resource(f"{VOLCANO_SCHEDULING}/podgroups", "PodGroupList"),
                Resource(f"{VOLCANO_BATCH}/jobs", "JobList", optional=True),
            ],
        )
        if isinstance(found, QueuedDemand):
            return found
        podgroups, jobs = found
        objects = VolcanoObjects(podgroups=podgroups or [], jobs=jobs, pod_gangs=self.pod_gangs)
        demand = volcano_demand(objects, now, gpu_resources)
        if not self.skipped:
            return demand
        text = f"{self.skipped[-1]}; gangs' shapes come from their PodGroups' minResources"
        note = UnfitWork(key=f"volcano:jobs:{text.split(':')[0]}", count=1, text=text)
        return demand.model_copy(update={"notes": (*demand.notes, note)})
