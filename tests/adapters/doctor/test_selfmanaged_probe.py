"""doctor's demand check on a self-managed node group (issue 30): an ASG's pods are checked on the cluster
its rule or tags name (one check per cluster, shared with the cluster's managed node groups); an ASG whose
cluster cannot be told is an error naming why."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, QueuedSource
from gpufleet.policy.fleet import parse_policy
from gpufleet_tools.doctor.core import DemandView
from gpufleet_tools.doctor.service import DemandProbe

POLICY = parse_policy(
    "groups:\n"
    "  - {name: gpu-spot, kind: asg, demand: {kubernetes: {}}}\n"
    "  - {name: untagged, kind: asg, demand: {kubernetes: {}}}\n"
    "  - {name: infer, cluster: ml, kind: eks-nodegroup, demand: {kubernetes: {}}}\n"
)


class Probe(DemandProbe):
    """The cluster check stood in for: which clusters were checked."""

    checked: list[str]

    def _cluster(self, cluster: str) -> DemandView:
        self.checked.append(cluster)
        return DemandView(group="", source=f"cluster {cluster}", found="the API answers")

    def _queued_jobs(self, cluster: str, system: QueuedSource) -> DemandView:
        return DemandView(group="", source=f"cluster {cluster}", what=f"queued jobs ({system})", found="stood in for")


def obs(ref: GroupRef, tags: dict[str, str] | None = None) -> GroupObservation:
    return GroupObservation(ref=ref, min_size=0, max_size=2, desired=0, tags=tags or {}, asg_tags=tags or {})


def test_a_self_managed_asg_is_checked_on_its_tagged_cluster() -> None:
    probe = Probe(eks=None, sqs=None, cloudwatch=None, session=Any, now=datetime(2026, 11, 26, tzinfo=UTC))
    probe.checked = []
    found = probe.check(
        POLICY,
        [
            obs(GroupRef(kind=GroupKind.ASG, name="gpu-spot"), {"kubernetes.io/cluster/ml": "owned"}),
            obs(GroupRef(kind=GroupKind.ASG, name="untagged")),
            obs(GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="infer")),
        ],
    )
    views = {v.group: v for v in found}
    assert probe.checked == ["ml"]  # once for the cluster, whatever the kinds of its groups
    assert views["asg:gpu-spot"].source == "cluster ml" and views["eks:ml/infer"].source == "cluster ml"
    assert (
        views["asg:untagged"].problem is not None and "set demand.kubernetes.cluster" in views["asg:untagged"].problem
    )
