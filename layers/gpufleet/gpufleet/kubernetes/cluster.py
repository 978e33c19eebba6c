"""Read an EKS cluster's pods serverlessly: the API server from EKS DescribeCluster (or a local override),
an `aws-iam-authenticator` token signed with the function's own role (no kubeconfig, no network call to
make it), and ONE paged listing of the cluster's unfinished pods per read.

The listing is `GET /api/v1/pods?fieldSelector=status.phase!=Succeeded,status.phase!=Failed&limit=500`:
one list that serves both questions, the pods that wait for GPUs (Pending) and the nodes that run work
(any pod bound to one, GPU or not, but a DaemonSet's, a mirror pod or one marked safe to evict:
`pods.pod_work`; Pending with a node, Running, Unknown), while finished pods (the bulk of a batch cluster)
stay on the server. No selector trims it: a pod's owner and annotations are what say whether it is work.
An expired `continue` token (410 Gone) restarts the listing once, from the start, so each pod is still
counted once.

After the pods, one `GET /apis/apps/v1/daemonsets` (a few pages at most): what each DaemonSet's pods take
from a node, and where they run as their templates say (their pods' own node affinity is replaced by a pin
to one node). If it cannot be read, the fit uses what the DaemonSets' pods show.

The cluster must let the function's role in: an EKS access entry with AmazonEKSViewPolicy, cluster scope
(the template makes them for the clusters named in its EksClusters parameter). That policy does not cover
nodes, so a pod's node (`spec.nodeName`, the EC2 private DNS name) is mapped to its instance through EC2
DescribeInstances instead (`gpufleet.aws.eks_nodes.instances_by_node_name`, with the node group shapes).

When a group of the cluster consolidates by attrition, one more paged `GET /api/v1/nodes`: each node's
cordon, whether gpufleet's label or annotation is on it, and its instance (spec.providerID). On a cluster
where no group does, only `GET /api/v1/nodes?labelSelector=gpufleet.io/drained` (`defaults.DRAIN_LABEL`;
an existence selector, kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors):
normally empty, it finds the nodes gpufleet closed before consolidation was switched off, so they are
reopened. That needs the ClusterRole in deploy/kubernetes/gpufleet-node-marks.yaml (nodes: get, list,
patch), bound to the Kubernetes group the scaler's access entry names; a listing that fails only leaves
the marks unknown.

Anything that keeps a cluster from being read raises `ClusterUnreadable` (one line, the cluster named,
never the token); the caller logs one WARNING and falls back to the utilization rules.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from gpufleet.aws.clients import Session
from gpufleet.aws.eks_access import EksEndpoints
from gpufleet.domain.defaults import DRAIN_LABEL
from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.domain.models import QueuedSource
from gpufleet.kubernetes.client import ApiServer, Connection, HttpProblem, ca_pem, too_large
from gpufleet.kubernetes.pods import (
    DEFAULT_GPU_RESOURCES,
    ClusterPods,
    DaemonSetPod,
    NodeListing,
    NodeState,
    PodTally,
    daemonsets_of,
    node_states,
)
from gpufleet.kubernetes.queued import merged
from gpufleet.kubernetes.queued_reader import QueuedReader
from gpufleet.settings import KubeEndpoint

PODS_PATH = "/api/v1/pods"
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"
# Sizes for the scaler's CPU share (bench/README.md, "Kubernetes listing at the scaler's CPU share"): a page
# of 500 pods as the API returns them is ~2.6 MB of JSON (~0.2 MB gzipped) and ~35 ms of CPU on a full
# core, so 50,000 pods are ~9 s of CPU at 1 vCPU (1,769 MB) and ~30 s at 512 MB's 0.29 vCPU.
PAGE_SIZE = 500  # kubectl's own chunk size; smaller pages only add round trips, larger ones memory
TIMEOUT_S = 2.0  # to connect, and for each wait on the API server (cut to the time the budget has left)
# Every cluster of one tick together: the scaler's 120 s timeout less what deciding and acting need, so
# several large or slow clusters cannot let the Lambda be killed before any group is decided.
TICK_BUDGET_S = 60.0
DAEMONSETS_PATH = "/apis/apps/v1/daemonsets"
NODES_PATH = "/api/v1/nodes"  # all of them when a group of the cluster consolidates, else only gpufleet's
DAEMONSET_PAGES = 4  # 2,000 DaemonSets: more than any cluster runs; past it the pods' view is used
BUDGET_S = 30.0  # one cluster's whole listing: 50k pods at >= 1,024 MB with the API server's own time
MAX_PODS = 100_000  # distinct pods in one listing: more is not a cluster the scaler can read in a tick
MAX_PAGES = 1_000  # pages in one listing: a server that never stops paging ends here, whatever its pods


def _refusal(cluster: str, problem: HttpProblem) -> ClusterUnreadable:
    said = f" (the API server: {problem.said})" if problem.said else ""
    if problem.status == 401:
        why = (
            f"401 Unauthorized: cluster {cluster} does not know the function's role; add an EKS access entry for"
            " it (template parameter EksClusters), on a cluster whose authentication mode includes API"
        )
        return ClusterUnreadable(cluster, why + said, "unauthorized")
    if problem.status == 403:
        why = (
            f"403 Forbidden: the function's role has no EKS access entry with AmazonEKSViewPolicy on cluster {cluster}"
        )
        return ClusterUnreadable(cluster, why + said, "forbidden")
    if problem.status == 410:
        return ClusterUnreadable(cluster, "410 Gone twice: the listing's continue token expired again", "expired")
    return ClusterUnreadable(cluster, problem.reason + said, "http")


def _unreadable(cluster: str, problem: HttpProblem) -> ClusterUnreadable:
    if problem.status is not None:
        return _refusal(cluster, problem)
    if problem.kind in ("timeout", "unreachable"):
        hint = "; is the endpoint reachable from the function (a private-only endpoint needs it in the VPC)?"
        return ClusterUnreadable(cluster, problem.reason + hint, problem.kind)
    return ClusterUnreadable(cluster, problem.reason, problem.kind)


class ClusterAccess:
    """How to reach one EKS cluster's API and get in, shared by the pod reader and the node marker
    (`gpufleet.kubernetes.marks`): where the endpoint and token come from is `aws.eks_access`; this turns
    them into a client's server (its CA checked here)."""

    def __init__(self, eks: Any, session: Session, overrides: Mapping[str, KubeEndpoint] | None = None) -> None:
        self.endpoints = EksEndpoints(eks, session, overrides)
        self.overrides = self.endpoints.overrides

    def server(self, cluster: str) -> ApiServer:
        found = self.endpoints.endpoint(cluster)
        try:
            return ApiServer(found.url, found.token, ca_pem(found.ca_data) if found.ca_data else None)
        except ValueError as err:
            raise ClusterUnreadable(cluster, str(err), "tls") from None


class PodReader:
    """`read(cluster)`: the cluster's waiting GPU pods and the nodes that run work, from one paged listing
    (and, asked with `nodes`, its nodes' cordons)."""

    def __init__(
        self,
        eks: Any,
        session: Session,
        overrides: Mapping[str, KubeEndpoint] | None = None,
        gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES,
        *,
        page_size: int = PAGE_SIZE,
        timeout_s: float = TIMEOUT_S,
        budget_s: float = BUDGET_S,
        max_pods: int = MAX_PODS,
        max_pages: int = MAX_PAGES,
    ) -> None:
        self.access = ClusterAccess(eks, session, overrides)
        self.eks, self.session, self.overrides = eks, session, self.access.overrides
        self.gpu_resources, self.page_size = gpu_resources, page_size
        self.timeout_s, self.budget_s = timeout_s, budget_s
        self.max_pods, self.max_pages = max_pods, max_pages

    def read(
        self,
        cluster: str,
        budget_s: float | None = None,
        *,
        nodes: NodeListing = NodeListing.NONE,
        queued: Collection[QueuedSource] = (),
        now: datetime | None = None,
    ) -> ClusterPods:
        """`budget_s`: this listing's time when less than the reader's own (what a tick has left). `nodes`:
        also list the cluster's nodes (consolidation's marks; ALL: every node, DRAINED: only those gpufleet
        labelled closed); that listing failing leaves the pods read and says why in `nodes_unreadable`.
        `queued`: the queueing systems whose jobs count before they are pods (gpufleet.kubernetes.queued_reader), read
        as of `now`; one that cannot be read is named in `queued_unreadable`, the pods stay good."""
        server = self.server(cluster)
        try:
            connection = Connection(server, self.timeout_s, min(self.budget_s, budget_s or self.budget_s))
            try:
                pods = self._list(cluster, connection)
                found = self._daemonsets(connection)
                update: dict[str, Any] = {} if found is None else {"daemonsets": found}
                if nodes is not NodeListing.NONE:
                    update.update(self._nodes(connection, nodes is NodeListing.DRAINED))
                pods = pods.model_copy(update=update) if update else pods
                if not queued:
                    return pods
                reader = QueuedReader(page_size=self.page_size, max_pages=self.max_pages)
                at = now or datetime.now(UTC)
                return merged(pods, reader.read(connection, queued, self.gpu_resources, at, pods.pod_gangs))
            finally:
                connection.close()
        except HttpProblem as problem:
            raise _unreadable(cluster, problem) from None

    def server(self, cluster: str) -> ApiServer:
        """Where the cluster's API is and how to get in (`ClusterAccess.server`)."""
        return self.access.server(cluster)

    def _nodes(self, connection: Connection, drained: bool = False) -> dict[str, Any]:
        """`GET /api/v1/nodes`, paged as the pods: each node's cordon and whether gpufleet made it (`drained`:
        only the nodes that carry gpufleet's label). Any failure (refused: the role lacks the node-marks
        group's `list`; a timeout; a malformed page) is said, never raised: the pods stay good, only the
        marks are unknown."""
        query: dict[str, str | int] = {"limit": self.page_size}
        if drained:
            query["labelSelector"] = DRAIN_LABEL
        states: dict[str, NodeState] = {}
        for _ in range(self.max_pages):
            try:
                page = connection.get_json(NODES_PATH, query)
            except HttpProblem as problem:
                said = f" ({problem.said})" if problem.said else ""
                return {"nodes_unreadable": f"listing nodes failed: {problem.reason}{said}"}
            if page.get("kind") != "NodeList" or not isinstance(page.get("items"), list):
                return {"nodes_unreadable": "listing nodes failed: the answer is not a NodeList"}
            states.update(node_states(page["items"]))
            token = _continue_token(page)
            if not token:
                return {"nodes": states}
            query["continue"] = token
        return {"nodes_unreadable": f"listing nodes ran past {self.max_pages} pages"}

    def _daemonsets(self, connection: Connection) -> tuple[DaemonSetPod, ...] | None:
        """The cluster's DaemonSets as their templates say (`GET /apis/apps/v1/daemonsets`, covered by
        AmazonEKSViewPolicy), so the fit subtracts only those that would run on a group's nodes. None when
        they cannot be read (refused, too many, malformed): the fit then uses what their pods show."""
        query: dict[str, str | int] = {"limit": self.page_size}
        items: list[Any] = []
        for _ in range(DAEMONSET_PAGES):
            try:
                page = connection.get_json(DAEMONSETS_PATH, query)
            except HttpProblem as problem:
                if problem.kind == "timeout":
                    raise
                return None
            if page.get("kind") != "DaemonSetList" or not isinstance(page.get("items"), list):
                return None
            items += page["items"]
            token = _continue_token(page)
            if not token:
                return daemonsets_of(items)
            query["continue"] = token
        return None

    def _list(self, cluster: str, connection: Connection) -> ClusterPods:
        """Every unfinished pod, page by page, each page reduced to what waits and which nodes run work
        before the next is read (a large cluster's pods are never all held at once), each pod once by its
        uid. A 410 Gone (the continue token expired) restarts the listing once from the start; a page too
        big for MAX_BODY (or that the server calls too large) is asked again once with half the limit, for
        the rest of the listing. A continue token the server gave before, more than `max_pods` distinct
        pods or more than `max_pages` pages end the listing as unreadable: a server that never stops
        paging is not one whose pods can be trusted."""
        pages, limit, halved = 0, self.page_size, False
        for attempt in (1, 2):
            tally = PodTally(cluster, self.gpu_resources)
            tokens: set[str] = set()
            query: dict[str, str | int] = {"limit": limit, "fieldSelector": UNFINISHED}
            try:
                while True:
                    if pages >= self.max_pages:
                        raise ClusterUnreadable(cluster, f"the listing ran past {self.max_pages} pages", "too_big")
                    try:
                        page = connection.get_json(PODS_PATH, query)
                    except HttpProblem as problem:
                        if halved or limit < 2 or not _too_large(problem):
                            raise
                        limit, halved = limit // 2, True
                        query["limit"] = limit
                        continue
                    pages += 1
                    items = page.get("items")
                    if page.get("kind") != "PodList" or not isinstance(items, list):
                        raise HttpProblem("malformed", "the answer is not a PodList")
                    tally.add(items)
                    if tally.pods > self.max_pods:
                        why = f"over {self.max_pods:,} pods: more than the scaler reads in one tick"
                        raise ClusterUnreadable(cluster, why, "too_big")
                    token = _continue_token(page)
                    if not token:
                        return tally.result(pages)
                    if token in tokens:
                        why = f"the API server gave the same continue token twice (page {pages}): the listing loops"
                        raise ClusterUnreadable(cluster, why, "loop")
                    tokens.add(token)
                    query["continue"] = token
            except HttpProblem as problem:
                if problem.status != 410 or attempt == 2:
                    raise
                limit = int(query["limit"])
        raise AssertionError("unreachable")  # pragma: no cover (the second attempt returns or raises)


def _continue_token(page: Mapping[str, Any]) -> str | None:
    """The list's continue token: the next page is asked for with it; none on the last page."""
    metadata = page.get("metadata")
    token = metadata.get("continue") if isinstance(metadata, Mapping) else None
    return str(token) if token else None


_too_large = too_large  # the pod listing halves once; the queued listings down to KUBE_MIN_PAGE


class TickBudget:
    """The time the clusters of one tick may take together (`TICK_BUDGET_S`). `start()` at the tick's
    start; `left()` what remains; a cluster read when nothing is left is unreadable, never waited for."""

    def __init__(self, total_s: float = TICK_BUDGET_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s, self._clock = total_s, clock
        self._until = clock() + total_s

    def start(self) -> None:
        self._until = self._clock() + self.total_s

    def left(self) -> float:
        return max(0.0, self._until - self._clock())

    def for_cluster(self, cluster: str) -> float:
        """The budget for one more cluster's listing; ClusterUnreadable when the tick's is spent."""
        left = self.left()
        if left < 1.0:
            why = f"the tick's {self.total_s:g} s for reading clusters is spent (other clusters were slow)"
            raise ClusterUnreadable(cluster, why, "timeout")
        return left
