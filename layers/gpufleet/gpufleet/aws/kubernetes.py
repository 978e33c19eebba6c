"""Read an EKS cluster's pods serverlessly: the API server from EKS DescribeCluster (or a local override),
an `aws-iam-authenticator` token signed with the function's own role (no kubeconfig, no network call to
make it), and ONE paged listing of the cluster's unfinished pods per read.

The listing is `GET /api/v1/pods?fieldSelector=status.phase!=Succeeded,status.phase!=Failed&limit=500`:
one list that serves both questions, the pods that wait for GPUs (Pending) and the nodes bound to GPU
pods (Pending with a node, Running, Unknown), while finished pods (the bulk of a batch cluster) stay on
the server. An expired `continue` token (410 Gone) restarts the listing once, from the start, so each pod
is still counted once.

The cluster must let the function's role in: an EKS access entry with AmazonEKSViewPolicy, cluster scope
(the template makes them for the clusters named in its EksClusters parameter). That policy does not cover
nodes, so a pod's node (`spec.nodeName`, the EC2 private DNS name) is mapped to its instance through EC2
DescribeInstances instead (`gpufleet.aws.eks_nodes.instances_by_node_name`, with the node group shapes).

Anything that keeps a cluster from being read raises `ClusterUnreadable` (one line, the cluster named,
never the token); the caller logs one WARNING and falls back to the utilization rules.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from botocore.signers import RequestSigner

from gpufleet.aws.clients import AWS_FAILURES, Session, error_code, is_loopback
from gpufleet.aws.kube_http import ApiServer, Connection, HttpProblem, ca_pem
from gpufleet.events.kubernetes import (
    DEFAULT_GPU_RESOURCES,
    ClusterPods,
    ClusterUnreadable,
    WaitingPod,
    cluster_pods,
)
from gpufleet.settings import KubeEndpoint

if TYPE_CHECKING:
    from mypy_boto3_eks import EKSClient

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"  # signed into the URL: the token is good for this cluster only
PRESIGN_EXPIRES_S = 60  # aws-iam-authenticator's value; STS honours the URL 15 minutes from X-Amz-Date anyway
TOKEN_LIFETIME = timedelta(minutes=14)  # those 15 minutes less the authenticator's own minute of cushion
PODS_PATH = "/api/v1/pods"
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"
PAGE_SIZE = 500
TIMEOUT_S = 2.0  # to connect, and for each wait on the API server
BUDGET_S = 10.0  # for one cluster's whole listing


@dataclass(frozen=True)
class EksToken:
    value: str = field(repr=False)
    expires_at: datetime


def eks_token(cluster: str, session: Session, sts: Any = None) -> EksToken:
    """The bearer token EKS accepts for the session's identity: `k8s-aws-v1.` + the base64url (unpadded)
    of an STS GetCallerIdentity URL presigned with the `x-k8s-aws-id: <cluster>` header signed in. Made
    locally (botocore's SigV4 signer reads the clock itself); `expires_at` is read back from the URL's
    X-Amz-Date. `sts` (a client of the session, for its regional endpoint) is made when not given."""
    sts = sts or session.client("sts")
    credentials = session.get_credentials()
    if credentials is None:
        raise ClusterUnreadable(cluster, "no AWS credentials to sign an EKS token with", "unauthorized")
    region = sts.meta.region_name
    signer = RequestSigner(sts.meta.service_model.service_id, region, "sts", "v4", credentials, sts.meta.events)
    request = {
        "method": "GET",
        "url": f"{sts.meta.endpoint_url.rstrip('/')}/?Action=GetCallerIdentity&Version=2011-06-15",
        "body": {},
        "headers": {CLUSTER_ID_HEADER: cluster},
        "context": {},
    }
    url = signer.generate_presigned_url(request, region_name=region, expires_in=PRESIGN_EXPIRES_S, operation_name="")
    signed_at = datetime.strptime(parse_qs(urlsplit(url).query)["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ")
    encoded = base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
    return EksToken(TOKEN_PREFIX + encoded, signed_at.replace(tzinfo=UTC) + TOKEN_LIFETIME)


def _refusal(cluster: str, problem: HttpProblem) -> ClusterUnreadable:
    said = str(problem.document.get("message") or "")[:160]
    said = f" (the API server: {said})" if said else ""
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


class PodReader:
    """`read(cluster)`: the cluster's waiting GPU pods and GPU nodes, from one paged listing."""

    def __init__(
        self,
        eks: EKSClient,
        session: Session,
        overrides: Mapping[str, KubeEndpoint] | None = None,
        gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES,
        *,
        page_size: int = PAGE_SIZE,
        timeout_s: float = TIMEOUT_S,
        budget_s: float = BUDGET_S,
    ) -> None:
        self.eks, self.session, self.overrides = eks, session, dict(overrides or {})
        self.gpu_resources, self.page_size = gpu_resources, page_size
        self.timeout_s, self.budget_s = timeout_s, budget_s
        self._sts: Any = None

    def read(self, cluster: str) -> ClusterPods:
        server = self.server(cluster)
        try:
            connection = Connection(server, self.timeout_s, self.budget_s)
            try:
                return self._list(cluster, connection)
            finally:
                connection.close()
        except HttpProblem as problem:
            raise _unreadable(cluster, problem) from None

    def server(self, cluster: str) -> ApiServer:
        """Where the cluster's API is and how to get in: the override's URL, token and CA where given, else
        DescribeCluster's endpoint and CA and a token signed with the function's role."""
        override = self.overrides.get(cluster)
        url, ca_data = (override.url, override.ca_data) if override else self._described(cluster)
        if override and override.token is not None:
            token = override.token.get_secret_value()
        elif url.startswith("http://") and not is_loopback(url):
            raise ClusterUnreadable(cluster, "an http:// endpoint gets no signed EKS token (only loopback may)", "tls")
        else:
            try:
                self._sts = self._sts or self.session.client("sts")
                token = eks_token(cluster, self.session, self._sts).value
            except AWS_FAILURES as err:  # no region, credentials that cannot be resolved, ...
                why = f"cannot sign an EKS token ({error_code(err)})"
                raise ClusterUnreadable(cluster, why, "unauthorized") from None
        try:
            return ApiServer(url, token, ca_pem(ca_data) if ca_data else None)
        except ValueError as err:
            raise ClusterUnreadable(cluster, str(err), "tls") from None

    def _described(self, cluster: str) -> tuple[str, str | None]:
        try:
            found = self.eks.describe_cluster(name=cluster)["cluster"]
        except AWS_FAILURES as err:
            raise ClusterUnreadable(cluster, f"EKS DescribeCluster failed ({error_code(err)})", "describe") from None
        endpoint = found.get("endpoint")
        if not endpoint:
            status = found.get("status", "unknown")
            raise ClusterUnreadable(cluster, f"the cluster has no API endpoint yet (status {status})", "describe")
        return endpoint, found.get("certificateAuthority", {}).get("data")

    def _list(self, cluster: str, connection: Connection) -> ClusterPods:
        """Every unfinished pod, page by page, each page reduced to what waits and which nodes run GPU pods
        before the next is read (a large cluster's pods are never all held at once); a 410 Gone (the
        continue token expired) restarts the listing once from the start, so each pod is counted once."""
        pages = 0
        for attempt in (1, 2):
            waiting: list[WaitingPod] = []
            gpu_nodes: set[str] = set()
            query: dict[str, str | int] = {"limit": self.page_size, "fieldSelector": UNFINISHED}
            try:
                while True:
                    page = connection.get_json(PODS_PATH, query)
                    pages += 1
                    items = page.get("items")
                    if page.get("kind") != "PodList" or not isinstance(items, list):
                        raise HttpProblem("malformed", "the answer is not a PodList")
                    part = cluster_pods(cluster, (i for i in items if isinstance(i, dict)), 0, self.gpu_resources)
                    waiting += part.waiting
                    gpu_nodes |= part.gpu_nodes
                    metadata = page.get("metadata")
                    token = metadata.get("continue") if isinstance(metadata, dict) else None
                    if not token:
                        return ClusterPods(
                            cluster=cluster, waiting=tuple(waiting), gpu_nodes=frozenset(gpu_nodes), pages=pages
                        )
                    query["continue"] = str(token)
            except HttpProblem as problem:
                if problem.status != 410 or attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover (the second attempt returns or raises)
