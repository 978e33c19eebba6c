"""EKS managed node groups as a group kind: read through DescribeNodegroup and their backing ASG, grown
with UpdateNodegroupConfig, shrunk only by named victims (terminated in the backing ASG with decrement,
as Cluster Autoscaler does for managed node groups, then the node group's desiredSize set to match)."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from gpufleet.aws.eks_nodes import ShapeUnknown, node_shape
from gpufleet.aws.groups.asg import AutoScalingReads, capacity_type_from_word, instances_of, tags_of
from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import Decision, GroupObservation, GroupRef
from gpufleet.domain.nodes import NodeShape
from gpufleet.policy.fleet import Discovery

if TYPE_CHECKING:
    from mypy_boto3_eks import EKSClient

# Names the API accepts (its documented patterns): anything else is a group that cannot exist.
EKS_CLUSTER_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9\-_]{0,99}")
EKS_NODEGROUP_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9\-_]{0,62}")


def owning_group(asg: GroupObservation) -> GroupRef:
    """The group an ASG's instances belong to for gpufleet: the EKS node group EKS tagged it with, else
    the ASG itself."""
    cluster, nodegroup = asg.asg_tags.get(defaults.TAG_EKS_CLUSTER), asg.asg_tags.get(defaults.TAG_EKS_NODEGROUP)
    if cluster and nodegroup:
        return GroupRef(kind=GroupKind.EKS_NODEGROUP, name=nodegroup, cluster=cluster)
    return asg.ref


@dataclass
class NodegroupGroups:
    """The eks-nodegroup kind's adapter (`aws.groups.provider.GroupProvider`)."""

    eks: EKSClient
    asgs: AutoScalingReads
    ec2: Callable[[], Any] = field(default=lambda: None)  # made when a node shape is first asked

    @property
    def kind(self) -> GroupKind:
        return GroupKind.EKS_NODEGROUP

    # ---- reading ----

    def _nodegroup(self, cluster: str, name: str) -> dict[str, Any] | None:
        """The node group, or None when it does not exist, including names EKS cannot hold (an alarm's
        dimensions are anyone's text: they must not reach the API as a path it cannot route)."""
        if not (EKS_CLUSTER_NAME.fullmatch(cluster) and EKS_NODEGROUP_NAME.fullmatch(name)):
            return None
        try:
            return dict(self.eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"])
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("ResourceNotFoundException", "404"):
                return None
            raise

    def _every_nodegroup(self) -> Iterator[dict[str, Any]]:
        for page in self.eks.get_paginator("list_clusters").paginate():
            for cluster in page.get("clusters", []):
                for ng_page in self.eks.get_paginator("list_nodegroups").paginate(clusterName=cluster):
                    for name in ng_page.get("nodegroups", []):
                        ng = self._nodegroup(cluster, name)
                        if ng:
                            yield ng

    def observe(
        self, discovery: Discovery, named: Sequence[GroupRef], attrition: Collection[str] = ()
    ) -> list[GroupObservation]:
        nodegroups: dict[tuple[str, str], dict[str, Any]] = {}
        if discovery.enabled and discovery.eks:
            for ng in self._every_nodegroup():
                if ng.get("tags", {}).get(discovery.tag_key) == discovery.tag_value:
                    nodegroups[(ng["clusterName"], ng["nodegroupName"])] = ng
        for g in named:
            if g.cluster and (g.cluster, g.name) not in nodegroups:
                found = self._nodegroup(g.cluster, g.name)
                if found is not None:
                    nodegroups[(g.cluster, g.name)] = found
        return self._observations(nodegroups.values())

    def observe_one(self, ref: GroupRef) -> GroupObservation | None:
        ng = self._nodegroup(ref.cluster or "", ref.name)
        return next(iter(self._observations([ng])), None) if ng is not None else None

    def every_group(self) -> list[GroupObservation]:
        return self._observations(self._every_nodegroup())

    def _observations(self, nodegroups: Iterable[dict[str, Any]]) -> list[GroupObservation]:
        nodegroups = list(nodegroups)
        asg_names = [
            ng["resources"]["autoScalingGroups"][0]["name"]
            for ng in nodegroups
            if ng.get("resources", {}).get("autoScalingGroups")
        ]
        backing = self.asgs.by_name(asg_names)
        out = []
        for ng in nodegroups:
            groups = ng.get("resources", {}).get("autoScalingGroups") or [{}]
            asg_name = groups[0].get("name")
            scaling = ng.get("scalingConfig", {})
            asg = backing.get(asg_name or "", {})
            out.append(
                GroupObservation(
                    ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster=ng["clusterName"], name=ng["nodegroupName"]),
                    min_size=scaling.get("minSize", 0),
                    max_size=scaling.get("maxSize", 0),
                    desired=scaling.get("desiredSize", 0),
                    asg_name=asg_name,
                    instances=instances_of(asg),
                    tags=dict(ng.get("tags", {})),
                    asg_tags=tags_of(asg),
                    capacity_type=capacity_type_from_word(ng.get("capacityType")),
                    instance_types=tuple(ng.get("instanceTypes") or ()),
                )
            )
        return out

    def work_marks(
        self, observations: Sequence[GroupObservation], now: datetime, candidates: Mapping[str, Collection[str]] | None
    ) -> list[GroupObservation]:
        # The demand source's pods already said which nodes run work; a queue worker's mark says it too.
        return self.asgs.with_busy_marks(observations)

    # ---- changing ----

    def adopt_backing_asg(self, obs: GroupObservation) -> None:
        """EKS does not copy a node group's tags to its Auto Scaling group, and the IAM role may change
        only ASGs tagged gpufleet:managed=true. So before acting on a managed node group's instances, its
        backing ASG is tagged too - under a grant that allows exactly that tag, only on ASGs EKS tagged
        with eks:nodegroup-name (template: AdoptBackingAsgsOfManagedNodegroups)."""
        if not obs.asg_name or obs.asg_tags.get(defaults.TAG_MANAGED) == defaults.TAG_MANAGED_VALUE:
            return
        self.asgs.autoscaling.create_or_update_tags(
            Tags=[
                {
                    "ResourceId": obs.asg_name,
                    "ResourceType": "auto-scaling-group",
                    "Key": defaults.TAG_MANAGED,
                    "Value": defaults.TAG_MANAGED_VALUE,
                    "PropagateAtLaunch": False,
                }
            ]
        )

    def _update(self, ref: GroupRef, desired: int, token: str) -> str:
        self.eks.update_nodegroup_config(
            clusterName=ref.cluster or "",
            nodegroupName=ref.name,
            scalingConfig={"desiredSize": desired},
            clientRequestToken=token,
        )
        return f"UpdateNodegroupConfig {ref.cluster}/{ref.name} desiredSize = {desired}"

    def prepare(self, obs: GroupObservation) -> None:
        self.adopt_backing_asg(obs)

    def grow(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        return self._update(obs.ref, decision.desired, token)

    def last_look(self, obs: GroupObservation, victims: Sequence[str]) -> dict[str, str]:
        """What the backing ASG says of the victims now (its instances are the node group's)."""
        return self.asgs.standing(obs.asg_name, victims)

    def shrink(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        return self.asgs.terminate(decision.victims) + "; " + self._update(obs.ref, decision.desired, token)

    def replace_failed(self, obs: GroupObservation, instance_id: str) -> str:
        """Its backing ASG replaces the instance (it is tagged first, as for any act on its instances)."""
        self.adopt_backing_asg(obs)
        return self.asgs.mark_unhealthy(instance_id)

    # ---- what demand needs ----

    def joined_cluster(self, obs: GroupObservation, named: str | None) -> tuple[str | None, str]:
        return (obs.ref.cluster, "") if obs.ref.cluster else (None, "a node group without its cluster")

    def node_shape(
        self, obs: GroupObservation, overrides: Mapping[str, str] | None, tell: Callable[[str], None] | None
    ) -> NodeShape:
        return node_shape(self.eks, self.ec2(), obs.ref.cluster or "", obs.ref.name, overrides=overrides)

    def gpus_per_node(self, obs: GroupObservation, type_gpus: Callable[[Sequence[str]], float | None]) -> float | None:
        """Its instance types' GPUs (its node shape's), None when the shape cannot be told."""
        if not obs.ref.cluster:
            return None
        try:
            return self.node_shape(obs, None, None).gpus
        except ShapeUnknown:
            return None

    def metric_namespace(self, obs: GroupObservation, named: str) -> tuple[str | None, str]:
        return named, ""  # a metric names its own namespace: its writer is whoever IAM lets write there
