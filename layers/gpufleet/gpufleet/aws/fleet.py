"""Read ASGs / EKS managed node groups (and, through aws.hyperpod, HyperPod instance groups) into
observations, and apply decisions to them."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from gpufleet.aws.asg_shape import weighted_why
from gpufleet.aws.clients import chunks
from gpufleet.aws.hyperpod import HyperPodFleet
from gpufleet.aws.marks import MarksFailed, NodeMarker
from gpufleet.domain import defaults
from gpufleet.domain.models import (
    Action,
    CapacityType,
    Decision,
    GroupKind,
    GroupObservation,
    GroupRef,
    InstanceObservation,
    MarkChannel,
)
from gpufleet.policy.fleet import Discovery

if TYPE_CHECKING:
    from mypy_boto3_autoscaling import AutoScalingClient
    from mypy_boto3_eks import EKSClient

# Names the APIs accept (their documented patterns): anything else is a group that cannot exist.
EKS_CLUSTER_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9\-_]{0,99}")
EKS_NODEGROUP_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9\-_]{0,62}")
ASG_NAME = re.compile("[\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff\r\n\t]{1,255}")


def _instances(asg: dict[str, Any]) -> tuple[InstanceObservation, ...]:
    return tuple(
        InstanceObservation(
            instance_id=i["InstanceId"],
            lifecycle_state=i.get("LifecycleState", "InService"),
            protected_from_scale_in=bool(i.get("ProtectedFromScaleIn", False)),
            instance_type=i.get("InstanceType"),
            healthy=str(i.get("HealthStatus", "Healthy")).lower() == "healthy",
        )
        for i in asg.get("Instances", [])
    )


TAG_CAPACITY_TYPE = "gpufleet:capacity-type"  # spot | on-demand | capacity-block: overrides what is derived
_CAPACITY_WORDS = {
    "spot": CapacityType.SPOT,
    "on-demand": CapacityType.ON_DEMAND,
    "on_demand": CapacityType.ON_DEMAND,
    "capacity-block": CapacityType.CAPACITY_BLOCK,
    "capacity_block": CapacityType.CAPACITY_BLOCK,
}


def capacity_type_from_word(word: str | None) -> CapacityType:
    return _CAPACITY_WORDS.get((word or "").strip().lower(), CapacityType.UNKNOWN)


def _mixed_instances_market(asg: dict[str, Any]) -> CapacityType:
    """A mixed instances policy's distribution: all on-demand, all spot, or both (unknown per launch)."""
    dist = asg.get("MixedInstancesPolicy", {}).get("InstancesDistribution")
    if dist is None:
        return CapacityType.UNKNOWN
    base = int(dist.get("OnDemandBaseCapacity", 0))
    above = int(dist.get("OnDemandPercentageAboveBaseCapacity", 100))
    if above == 100:
        return CapacityType.ON_DEMAND
    if above == 0 and base == 0:
        return CapacityType.SPOT
    return CapacityType.UNKNOWN


def _instance_types(asg: dict[str, Any]) -> tuple[str, ...]:
    overrides = asg.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get("Overrides", [])
    found = [o["InstanceType"] for o in overrides if o.get("InstanceType")]
    found += [i["InstanceType"] for i in asg.get("Instances", []) if i.get("InstanceType")]
    return tuple(dict.fromkeys(found))


def _launch_template(asg: dict[str, Any]) -> tuple[str, str] | None:
    """A group launched straight from a launch template (no mixed-instances policy): its market is in the
    template's InstanceMarketOptions, read only when a failure needs it (capacity.service)."""
    spec = asg.get("LaunchTemplate")
    if not spec or asg.get("MixedInstancesPolicy"):
        return None
    ref = spec.get("LaunchTemplateId") or spec.get("LaunchTemplateName")
    return (str(ref), str(spec.get("Version") or "$Default")) if ref else None


def _asg_observation(asg: dict[str, Any]) -> GroupObservation:
    tags = {t["Key"]: t.get("Value", "") for t in asg.get("Tags", [])}
    tagged = capacity_type_from_word(tags.get(TAG_CAPACITY_TYPE))
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.ASG, name=asg["AutoScalingGroupName"]),
        min_size=asg["MinSize"],
        max_size=asg["MaxSize"],
        desired=asg["DesiredCapacity"],
        asg_name=asg["AutoScalingGroupName"],
        instances=_instances(asg),
        tags=tags,
        asg_tags=tags,
        capacity_type=tagged if tagged is not CapacityType.UNKNOWN else _mixed_instances_market(asg),
        instance_types=_instance_types(asg),
        launch_template=_launch_template(asg),
        # desired counts weight units: no instance count is safe to lower, no demand can size it
        scale_in_closed=weighted_why(asg),
        demand_refused=weighted_why(asg),
    )


def owning_group(asg: GroupObservation) -> GroupRef:
    """The group an ASG's instances belong to for gpufleet: the EKS node group EKS tagged it with, else
    the ASG itself."""
    cluster, nodegroup = asg.asg_tags.get(defaults.TAG_EKS_CLUSTER), asg.asg_tags.get(defaults.TAG_EKS_NODEGROUP)
    if cluster and nodegroup:
        return GroupRef(kind=GroupKind.EKS_NODEGROUP, name=nodegroup, cluster=cluster)
    return asg.ref


@dataclass
class FleetReader:
    """Finds managed groups and describes them in as few calls as the APIs allow."""

    autoscaling: AutoScalingClient
    eks: EKSClient
    hyperpod: HyperPodFleet | None = None  # HyperPod (Slurm) instance groups named by rules; None: none read
    logger: Any = None  # told once of a rule that names a managed node group's own ASG
    _told: set[str] = field(default_factory=set, init=False, repr=False)

    def _describe_asgs(self, **kwargs: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            args = dict(kwargs, MaxRecords=defaults.DESCRIBE_ASG_MAX_NAMES)
            if token:
                args["NextToken"] = token
            page = self.autoscaling.describe_auto_scaling_groups(**args)
            out.extend(dict(g) for g in page.get("AutoScalingGroups", []))
            token = page.get("NextToken")
            if not token:
                return out

    def describe_asgs_by_name(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The named ASGs that exist; a name Auto Scaling refuses (ValidationError) exists nowhere, so it
        is never sent (an alarm's dimensions are anyone's text)."""
        wanted = sorted({n for n in names if ASG_NAME.fullmatch(n)})
        found: dict[str, dict[str, Any]] = {}
        for batch in chunks(wanted, defaults.DESCRIBE_ASG_MAX_NAMES):
            for asg in self._describe_asgs(AutoScalingGroupNames=list(batch)):
                found[asg["AutoScalingGroupName"]] = asg
        return found

    def _backs_nodegroup(self, asg: dict[str, Any]) -> bool:
        """Whether the ASG is the one EKS made for a managed node group (its eks:nodegroup-name tag): named
        by a kind: asg rule it would be sized twice, as itself and as its node group. Told once."""
        tags = {t.get("Key"): t.get("Value", "") for t in asg.get("Tags", [])}
        nodegroup = tags.get(defaults.TAG_EKS_NODEGROUP)
        if not nodegroup:
            return False
        name, cluster = asg["AutoScalingGroupName"], tags.get(defaults.TAG_EKS_CLUSTER) or "CLUSTER"
        if self.logger is not None and name not in self._told:
            self._told.add(name)
            self.logger.warning(
                f"ASG {name} backs EKS managed node group {cluster}/{nodegroup}: not sized as an ASG (it would "
                f"be sized twice); write `kind: eks-nodegroup, cluster: {cluster}, name: {nodegroup}` instead",
                extra={"asg": name},
            )
        return True

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

    def _discover_nodegroups(self, discovery: Discovery) -> list[dict[str, Any]]:
        return [
            ng for ng in self._every_nodegroup() if ng.get("tags", {}).get(discovery.tag_key) == discovery.tag_value
        ]

    def every_group(self) -> list[GroupObservation]:
        """Every ASG (EKS backing ones included) and EKS managed node group in the region, tagged or not:
        `gpufleet doctor`'s census (read-only, once)."""
        return [_asg_observation(a) for a in self._describe_asgs()] + self._nodegroup_observations(
            self._every_nodegroup()
        )

    def observe(
        self, discovery: Discovery, explicit: Iterable[GroupRef] = (), attrition: Collection[str] = ()
    ) -> list[GroupObservation]:
        """Discovered (tagged) groups plus explicitly named ones; a missing explicit one is skipped, and so is
        a named ASG that backs an EKS managed node group (told once: it is sized through its node group).
        `attrition`: keys of the named groups that consolidate by attrition (HyperPod reads their marks)."""
        explicit = list(explicit)
        asgs: dict[str, dict[str, Any]] = {}
        if discovery.enabled and discovery.asg:
            for asg in self._describe_asgs(
                Filters=[{"Name": f"tag:{discovery.tag_key}", "Values": [discovery.tag_value]}]
            ):
                # A managed node group's own ASG carries the managed tag once gpufleet adopted it: it is
                # sized through its node group, never as a group of its own (it would be sized twice).
                if not any(t.get("Key") == defaults.TAG_EKS_NODEGROUP for t in asg.get("Tags", [])):
                    asgs[asg["AutoScalingGroupName"]] = asg
        missing = [g.name for g in explicit if g.kind is GroupKind.ASG and g.name not in asgs]
        asgs.update({n: a for n, a in self.describe_asgs_by_name(missing).items() if not self._backs_nodegroup(a)})

        nodegroups: dict[tuple[str, str], dict[str, Any]] = {}
        if discovery.enabled and discovery.eks:
            for ng in self._discover_nodegroups(discovery):
                nodegroups[(ng["clusterName"], ng["nodegroupName"])] = ng
        for g in explicit:
            if g.kind is GroupKind.EKS_NODEGROUP and g.cluster and (g.cluster, g.name) not in nodegroups:
                found = self._nodegroup(g.cluster, g.name)
                if found is not None:
                    nodegroups[(g.cluster, g.name)] = found
        hyperpod = [g for g in explicit if g.kind is GroupKind.HYPERPOD]
        instance_groups = self.hyperpod.observe(hyperpod, attrition) if self.hyperpod is not None and hyperpod else []
        return (
            [_asg_observation(a) for a in asgs.values()]
            + self._nodegroup_observations(nodegroups.values())
            + instance_groups
        )

    def scaling_policies(self) -> dict[str, tuple[str, ...]]:
        """The region's native scaling policies' names, by ASG (DescribePolicies, all pages)."""
        found: dict[str, list[str]] = {}
        for page in self.autoscaling.get_paginator("describe_policies").paginate():
            for p in page.get("ScalingPolicies", []):
                found.setdefault(p["AutoScalingGroupName"], []).append(p["PolicyName"])
        return {k: tuple(v) for k, v in found.items()}

    def recent_activities(self, asg_name: str, limit: int = 5) -> list[str]:
        """What Auto Scaling says changed the group lately (each activity's Cause, newest first)."""
        page = self.autoscaling.describe_scaling_activities(AutoScalingGroupName=asg_name, MaxRecords=limit)
        return [str(a.get("Cause") or a.get("Description", "")) for a in page.get("Activities", [])]

    def asg_of_instance(self, instance_id: str) -> str | None:
        found = self.autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
        return found[0]["AutoScalingGroupName"] if found else None

    def work_marks(
        self,
        observations: list[GroupObservation],
        now: datetime,
        candidates: Mapping[str, Collection[str]] | None = None,
    ) -> list[GroupObservation]:
        """The groups with what their adapter says of which nodes run work, read when a scale-in is weighed
        (HyperPod: Slurm's idle report, read only for `candidates`, per group key the nodes whose GPUs read
        idle; the others are marked running work); the other kinds' observations already carry it."""
        if self.hyperpod is None or not any(o.ref.kind is GroupKind.HYPERPOD for o in observations):
            return observations
        return self.hyperpod.marked(observations, now, candidates)

    def observe_one(self, ref: GroupRef) -> GroupObservation | None:
        if ref.kind is GroupKind.HYPERPOD:
            return next(iter(self.hyperpod.observe([ref])), None) if self.hyperpod is not None else None
        if ref.kind is GroupKind.ASG:
            asg = self.describe_asgs_by_name([ref.name]).get(ref.name)
            return _asg_observation(asg) if asg else None
        ng = self._nodegroup(ref.cluster or "", ref.name)
        if ng is None:
            return None
        return next(iter(self._nodegroup_observations([ng])), None)

    def _nodegroup_observations(self, nodegroups: Iterable[dict[str, Any]]) -> list[GroupObservation]:
        nodegroups = list(nodegroups)
        asg_names = [
            ng["resources"]["autoScalingGroups"][0]["name"]
            for ng in nodegroups
            if ng.get("resources", {}).get("autoScalingGroups")
        ]
        backing = self.describe_asgs_by_name(asg_names)
        out = []
        for ng in nodegroups:
            groups = ng.get("resources", {}).get("autoScalingGroups") or [{}]
            asg_name = groups[0].get("name")
            scaling = ng.get("scalingConfig", {})
            out.append(
                GroupObservation(
                    ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster=ng["clusterName"], name=ng["nodegroupName"]),
                    min_size=scaling.get("minSize", 0),
                    max_size=scaling.get("maxSize", 0),
                    desired=scaling.get("desiredSize", 0),
                    asg_name=asg_name,
                    instances=_instances(backing.get(asg_name or "", {})),
                    tags=dict(ng.get("tags", {})),
                    asg_tags={t["Key"]: t.get("Value", "") for t in backing.get(asg_name or "", {}).get("Tags", [])},
                    capacity_type=capacity_type_from_word(ng.get("capacityType")),
                    instance_types=tuple(ng.get("instanceTypes") or ()),
                )
            )
        return out


@dataclass
class FleetActuator:
    """Applies one decision. Idempotent per decision: EKS updates carry a client request token; a
    HyperPod count already reached is not asked again and a node already deleted is done."""

    autoscaling: AutoScalingClient
    eks: EKSClient
    hyperpod: HyperPodFleet | None = None
    markers: Mapping[MarkChannel, NodeMarker] = field(default_factory=dict)  # consolidation by attrition

    def apply(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        """Returns a short account of what was done; raises on failure. Nodes are reopened before any
        launch (waiting work takes them first) and closed after the capacity change."""
        done: list[str] = []
        failed: list[str] = []
        if decision.undrain:
            self._mark(lambda m: m.reopen(obs, decision.undrain), obs, "reopen", done, failed)
        if decision.changes_capacity:  # a failed reopen never holds back a launch
            done.append(self._capacity(decision, obs, token))
        if decision.drain:
            reason = f"surplus node drained by attrition at {decision.at:%Y-%m-%dT%H:%MZ}; removed once idle"
            self._mark(lambda m: m.close(obs, decision.drain, reason), obs, "drain", done, failed)
        if failed:
            raise MarksFailed("; ".join(done + failed))
        return "; ".join(done) or "nothing to apply"

    def _mark(
        self, act: Callable[[NodeMarker], str], obs: GroupObservation, what: str, done: list[str], failed: list[str]
    ) -> None:
        try:
            done.append(act(self._marker(obs)))
        except Exception as exc:  # any marker failure: said, the capacity change still made
            failed.append(f"{what} failed: {type(exc).__name__}: {exc}")

    def _marker(self, obs: GroupObservation) -> NodeMarker:
        marker = self.markers.get(obs.marks) if obs.marks is not None else None
        if marker is None:
            raise RuntimeError(f"{obs.ref.key}: no way to mark its nodes ({obs.marks or 'no mark channel'})")
        return marker

    def _capacity(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        ref = obs.ref
        if ref.kind is GroupKind.HYPERPOD:
            if self.hyperpod is None:
                raise RuntimeError(f"{ref.key}: this function is not wired for HyperPod groups")
            return self.hyperpod.apply(decision, obs)
        if decision.action in (Action.SCALE_OUT, Action.SET_DESIRED):
            if ref.kind is GroupKind.ASG:
                self.autoscaling.set_desired_capacity(
                    AutoScalingGroupName=ref.name, DesiredCapacity=decision.desired, HonorCooldown=False
                )
                return f"SetDesiredCapacity {ref.name} = {decision.desired}"
            return self._update_nodegroup(ref, decision.desired, token)
        if decision.action is Action.SCALE_IN:
            done = []
            for instance_id in decision.victims:
                self.autoscaling.terminate_instance_in_auto_scaling_group(
                    InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
                )
                done.append(instance_id)
            text = (
                f"TerminateInstanceInAutoScalingGroup (decrement) {', '.join(done)}" if done else "victims already gone"
            )
            if ref.kind is GroupKind.EKS_NODEGROUP:
                text += "; " + self._update_nodegroup(ref, decision.desired, token)
            elif decision.desired < decision.current - len(decision.victims):
                # Launches still owed are cancelled too (a gang's partial launch given back): desired down to
                # the instances the group holds, so the ASG chooses no instance to terminate.
                self.autoscaling.set_desired_capacity(
                    AutoScalingGroupName=ref.name, DesiredCapacity=decision.desired, HonorCooldown=False
                )
                text += f"; SetDesiredCapacity {ref.name} = {decision.desired}"
            return text
        return "nothing to apply"

    def _update_nodegroup(self, ref: GroupRef, desired: int, token: str) -> str:
        self.eks.update_nodegroup_config(
            clusterName=ref.cluster or "",
            nodegroupName=ref.name,
            scalingConfig={"desiredSize": desired},
            clientRequestToken=token,
        )
        return f"UpdateNodegroupConfig {ref.cluster}/{ref.name} desiredSize = {desired}"

    def adopt_backing_asg(self, obs: GroupObservation) -> None:
        """EKS does not copy a node group's tags to its Auto Scaling group, and the IAM role may change
        only ASGs tagged gpufleet:managed=true. So before acting on a managed node group's instances, its
        backing ASG is tagged too - under a grant that allows exactly that tag, only on ASGs EKS tagged
        with eks:nodegroup-name (template: AdoptBackingAsgsOfManagedNodegroups)."""
        if not obs.asg_name or obs.asg_tags.get(defaults.TAG_MANAGED) == defaults.TAG_MANAGED_VALUE:
            return
        self.autoscaling.create_or_update_tags(
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

    def mark_unhealthy(self, instance_id: str) -> str:
        """Hand an instance with a failed GPU to its ASG, which replaces it (EKS node groups too: their
        ASG does the replacing). Never for a HyperPod node (no ASG holds it): the guard only tells
        (guard.service, HYPERPOD_NOT_REPLACED)."""
        self.autoscaling.set_instance_health(
            InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
        )
        return f"SetInstanceHealth {instance_id} = Unhealthy"
