"""`gpufleet doctor`'s queued-jobs access check (glue; rules: `doctor.core.queued_jobs_view`). The scaler
lists Kueue's and Volcano's objects (gpufleet.kubernetes.queued_reader), which AmazonEKSViewPolicy does not cover: its
access entry's Kubernetes group `defaults.QUEUED_JOBS_GROUP` is bound to get and list on them by
deploy/kubernetes/gpufleet-queued-jobs.yaml.

Per cluster and system: API discovery (`GET /apis/GROUP/VERSION`, which the default ClusterRoleBinding
system:discovery opens to every authenticated caller) says whether the system's CRDs are installed; then
one SelfSubjectAccessReview (`list`) per resource served. The review answers for the identity doctor reads
with: the scaler's own where GPUFLEET_KUBE_ENDPOINTS gives its token, else the caller's, so on EKS the
access entries are read as well (ListAccessEntries, DescribeAccessEntry: does one carry the group?).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.aws.clients import AWS_FAILURES
from gpufleet.domain import defaults
from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.domain.models import QueuedSource
from gpufleet.kubernetes.client import Connection, HttpProblem
from gpufleet.kubernetes.cluster import TIMEOUT_S, ClusterAccess
from gpufleet.kubernetes.marks import SSAR_PATH
from gpufleet.kubernetes.queued_reader import KUEUE, VOLCANO_BATCH, VOLCANO_SCHEDULING
from gpufleet_tools.doctor.core import DemandView, ResourceAccess, queued_jobs_view

QUEUED_CHECK_S = 15.0  # one system's discovery and reviews (at most seven calls) on one cluster

# What the scaler lists of each queueing system (gpufleet.kubernetes.queued_reader): (API path, plurals, optional). The
# first path's group version being served, with its first plural, is the system being installed.
QUEUED_RESOURCES: dict[QueuedSource, tuple[tuple[str, tuple[str, ...], bool], ...]] = {
    QueuedSource.KUEUE: ((KUEUE, ("workloads", "clusterqueues", "localqueues", "resourceflavors"), False),),
    QueuedSource.VOLCANO: ((VOLCANO_SCHEDULING, ("podgroups",), False), (VOLCANO_BATCH, ("jobs",), True)),
}


def queued_jobs_check(eks: Any, access: ClusterAccess, cluster: str, system: QueuedSource) -> DemandView:
    """May the scaler list what it reads of `system` on `cluster`? One DemandView (`doctor.core`)."""
    what, source = f"queued jobs ({system.value})", f"cluster {cluster}"
    override = access.overrides.get(cluster)
    mine = override is not None and override.token is not None  # the scaler's own token: no entries apply
    try:
        connection = Connection(access.server(cluster), TIMEOUT_S, QUEUED_CHECK_S)
        try:
            installed, reviewed = reviews(connection, system)
        finally:
            connection.close()
    except ClusterUnreadable as exc:
        return DemandView(group="", source=source, what=what, problem=exc.cause)
    except HttpProblem as problem:
        return DemandView(group="", source=source, what=what, problem=f"the access review failed ({problem.reason})")
    whose = "the scaler's token" if mine else "your credentials"
    holders = None if mine or not installed else group_holders(eks, cluster, defaults.QUEUED_JOBS_GROUP)
    return queued_jobs_view(cluster, system.value, installed, reviewed, whose, holders)


def reviews(connection: Connection, system: QueuedSource) -> tuple[bool, tuple[ResourceAccess, ...]]:
    """(installed, one review per resource served): a group version discovery answers 404 for is not
    served (its CRDs are absent); the system's first one absent means it is not installed."""
    found: list[ResourceAccess] = []
    for i, (path, plurals, optional) in enumerate(QUEUED_RESOURCES[system]):
        try:
            served = {r.get("name") for r in connection.get_json(path).get("resources") or [] if isinstance(r, Mapping)}
        except HttpProblem as problem:
            if problem.status != 404:
                raise
            served = set()
        if i == 0 and plurals[0] not in served:
            return False, ()
        api_group = path.split("/")[2]  # /apis/GROUP/VERSION
        for plural in (p for p in plurals if p in served):
            allowed, reason = may_list(connection, api_group, plural)
            found.append(
                ResourceAccess(resource=f"{plural}.{api_group}", allowed=allowed, optional=optional, reason=reason)
            )
    return True, tuple(found)


def may_list(connection: Connection, api_group: str, plural: str) -> tuple[bool, str]:
    """Whether the caller may list `plural` cluster-wide, as the API server's authorizer says: (allowed,
    its reason). Any authenticated identity may create a SelfSubjectAccessReview."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "list", "group": api_group, "resource": plural}},
    }
    status = connection.post_json(SSAR_PATH, review).get("status")
    status = status if isinstance(status, Mapping) else {}
    return status.get("allowed") is True, str(status.get("reason") or "")


def group_holders(eks: Any, cluster: str, group: str) -> tuple[str, ...] | None:
    """The principals (last part of the ARN) whose access entry carries the Kubernetes `group`; None
    when the entries cannot be read."""
    try:
        principals = eks.list_access_entries(clusterName=cluster).get("accessEntries", [])
        return tuple(
            p.rsplit("/", 1)[-1]
            for p in principals
            if group
            in eks.describe_access_entry(clusterName=cluster, principalArn=p)
            .get("accessEntry", {})
            .get("kubernetesGroups", [])
        )
    except AWS_FAILURES:
        return None
