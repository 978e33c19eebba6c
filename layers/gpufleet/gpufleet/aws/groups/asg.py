"""EC2 Auto Scaling groups as a group kind: read by tag or by name, grown with SetDesiredCapacity,
shrunk only by named victims (TerminateInstanceInAutoScalingGroup with decrement).

`AutoScalingReads` is shared: an EKS managed node group's instances sit in its backing ASG, so the node
group adapter reads them through it."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpufleet.aws.asg_shape import asg_node_shape, cluster_of, weighted_why
from gpufleet.aws.busy_marks import BusyMarks, MarksUnreadable, auto_scaling_instances
from gpufleet.aws.clients import chunks
from gpufleet.domain import defaults
from gpufleet.domain.busy import with_marks
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import CapacityType, Decision, GroupObservation, GroupRef, InstanceObservation
from gpufleet.domain.nodes import NodeShape
from gpufleet.policy.fleet import Discovery

if TYPE_CHECKING:
    from mypy_boto3_autoscaling import AutoScalingClient

# The names Auto Scaling accepts (its documented pattern): anything else is a group that cannot exist.
ASG_NAME = re.compile("[\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff\r\n\t]{1,255}")
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


def instances_of(asg: Mapping[str, Any]) -> tuple[InstanceObservation, ...]:
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


def tags_of(asg: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in asg.get("Tags", [])}


def _mixed_instances_market(asg: Mapping[str, Any]) -> CapacityType:
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


def _instance_types(asg: Mapping[str, Any]) -> tuple[str, ...]:
    overrides = asg.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get("Overrides", [])
    found = [o["InstanceType"] for o in overrides if o.get("InstanceType")]
    found += [i["InstanceType"] for i in asg.get("Instances", []) if i.get("InstanceType")]
    return tuple(dict.fromkeys(found))


def _launch_template(asg: Mapping[str, Any]) -> tuple[str, str] | None:
    """A group launched straight from a launch template (no mixed-instances policy): its market is in the
    template's InstanceMarketOptions, read only when a failure needs it (capacity.service)."""
    spec = asg.get("LaunchTemplate")
    if not spec or asg.get("MixedInstancesPolicy"):
        return None
    ref = spec.get("LaunchTemplateId") or spec.get("LaunchTemplateName")
    return (str(ref), str(spec.get("Version") or "$Default")) if ref else None


def asg_ref(name: str) -> GroupRef:
    """An ASG named by Auto Scaling itself (a termination request, an instance's group): whatever group
    it backs, the ASG is first read as one."""
    return GroupRef(kind=GroupKind.ASG, name=name)


def asg_observation(asg: Mapping[str, Any]) -> GroupObservation:
    """One DescribeAutoScalingGroups item as a group of kind asg."""
    tags = tags_of(asg)
    tagged = capacity_type_from_word(tags.get(TAG_CAPACITY_TYPE))
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.ASG, name=asg["AutoScalingGroupName"]),
        min_size=asg["MinSize"],
        max_size=asg["MaxSize"],
        desired=asg["DesiredCapacity"],
        asg_name=asg["AutoScalingGroupName"],
        instances=instances_of(asg),
        tags=tags,
        asg_tags=tags,
        capacity_type=tagged if tagged is not CapacityType.UNKNOWN else _mixed_instances_market(asg),
        instance_types=_instance_types(asg),
        launch_template=_launch_template(asg),
        # desired counts weight units: no instance count is safe to lower, no demand can size it
        scale_in_closed=weighted_why(asg),
        demand_refused=weighted_why(asg),
    )


def backs_a_nodegroup(asg: Mapping[str, Any]) -> bool:
    """EKS tags the ASG it made for a managed node group with eks:nodegroup-name (a discovered ASG with the
    key is skipped whatever its value; a named one is skipped only when it names a node group)."""
    return any(t.get("Key") == defaults.TAG_EKS_NODEGROUP for t in asg.get("Tags", []))


@dataclass
class AutoScalingReads:
    """DescribeAutoScalingGroups in as few calls as the API allows (by tag, by name, everything), and the
    queue workers' busy marks (`busy`: None where a function is built without the busy table)."""

    autoscaling: AutoScalingClient
    busy: BusyMarks | None = None

    def describe(self, **kwargs: Any) -> list[dict[str, Any]]:
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

    def by_name(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The named ASGs that exist; a name Auto Scaling refuses (ValidationError) exists nowhere, so it
        is never sent (an alarm's dimensions are anyone's text)."""
        wanted = sorted({n for n in names if ASG_NAME.fullmatch(n)})
        found: dict[str, dict[str, Any]] = {}
        for batch in chunks(wanted, defaults.DESCRIBE_ASG_MAX_NAMES):
            for asg in self.describe(AutoScalingGroupNames=list(batch)):
                found[asg["AutoScalingGroupName"]] = asg
        return found

    def standing(self, asg_name: str | None, victims: Sequence[str]) -> dict[str, str]:
        """The victims Auto Scaling says may not go now (id -> why), read fresh: scale-in protection (a
        queue worker that took a job protects itself; TerminateInstanceInAutoScalingGroup would not stop for
        it), not InService any more, or no longer in the group. One call per 50 ids."""
        seen = auto_scaling_instances(self.autoscaling, victims)
        busy: dict[str, str] = {}
        for v in victims:
            found = seen.get(v)
            if found is None or (asg_name and found.get("AutoScalingGroupName") != asg_name):
                busy[v] = "no longer in the group"
            elif found.get("ProtectedFromScaleIn"):
                busy[v] = "scale-in protected now"
            elif found.get("LifecycleState") != "InService":
                busy[v] = f"{found.get('LifecycleState')} now, not InService"
        left = [v for v in victims if v not in busy]
        if left and self.busy is not None:
            busy |= self.busy.marked(left)  # raises MarksUnreadable: no victim goes on this look
        return busy

    def with_busy_marks(self, observations: Sequence[GroupObservation]) -> list[GroupObservation]:
        """The groups with each node its own busy mark names counted as protected (never a victim); when
        the marks cannot be read, no node of these groups may be removed on this read."""
        if self.busy is None or not observations:
            return list(observations)
        try:
            marked: Collection[str] = self.busy.read().marked
        except MarksUnreadable as exc:  # every node may hold a job: none is a victim (the termination policy too)
            closed = [o.model_copy(update={"scale_in_closed": o.scale_in_closed or str(exc)}) for o in observations]
            return [with_marks(o, [i.instance_id for i in o.instances]) for o in closed]
        return [with_marks(o, marked) for o in observations]

    def terminate(self, victims: Sequence[str]) -> str:
        """Each named victim terminated with its desired capacity decremented: Auto Scaling picks none."""
        done = []
        for instance_id in victims:
            self.autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
            )
            done.append(instance_id)
        return f"TerminateInstanceInAutoScalingGroup (decrement) {', '.join(done)}" if done else "victims already gone"

    def set_desired(self, name: str, desired: int) -> str:
        self.autoscaling.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=desired, HonorCooldown=False)
        return f"SetDesiredCapacity {name} = {desired}"

    def mark_unhealthy(self, instance_id: str) -> str:
        """Hand an instance with a failed GPU to its ASG, which replaces it."""
        self.autoscaling.set_instance_health(
            InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
        )
        return f"SetInstanceHealth {instance_id} = Unhealthy"


@dataclass
class AsgGroups:
    """The asg kind's adapter (`aws.groups.provider.GroupProvider`)."""

    reads: AutoScalingReads
    ec2: Callable[[], Any] = field(default=lambda: None)  # made when a node shape is first asked
    logger: Any = None  # told once of a rule that names a managed node group's own ASG
    _told: set[str] = field(default_factory=set, init=False, repr=False)

    @property
    def kind(self) -> GroupKind:
        return GroupKind.ASG

    def _named_backing_asg(self, asg: Mapping[str, Any]) -> bool:
        """Whether a named ASG is the one EKS made for a managed node group: named by a kind: asg rule it
        would be sized twice, as itself and as its node group. Told once."""
        tags = tags_of(asg)
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

    def observe(
        self, discovery: Discovery, named: Sequence[GroupRef], attrition: Collection[str] = ()
    ) -> list[GroupObservation]:
        """Tagged ASGs (a managed node group's own ASG carries the managed tag once gpufleet adopted it: it
        is sized through its node group, never as a group of its own) and the named ones."""
        asgs: dict[str, dict[str, Any]] = {}
        if discovery.enabled and discovery.asg:
            tagged = self.reads.describe(
                Filters=[{"Name": f"tag:{discovery.tag_key}", "Values": [discovery.tag_value]}]
            )
            asgs.update({a["AutoScalingGroupName"]: a for a in tagged if not backs_a_nodegroup(a)})
        missing = [g.name for g in named if g.name not in asgs]
        asgs.update({n: a for n, a in self.reads.by_name(missing).items() if not self._named_backing_asg(a)})
        return [asg_observation(a) for a in asgs.values()]

    def observe_one(self, ref: GroupRef) -> GroupObservation | None:
        asg = self.reads.by_name([ref.name]).get(ref.name)
        return asg_observation(asg) if asg else None

    def every_group(self) -> list[GroupObservation]:
        return [asg_observation(a) for a in self.reads.describe()]

    def work_marks(
        self, observations: Sequence[GroupObservation], now: datetime, candidates: Mapping[str, Collection[str]] | None
    ) -> list[GroupObservation]:
        return self.reads.with_busy_marks(observations)  # protection is in the observation; marks are not yet

    def prepare(self, obs: GroupObservation) -> None:
        return None  # its own tags are what the IAM grant reads: nothing to adopt

    def grow(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        return self.reads.set_desired(obs.ref.name, decision.desired)

    def last_look(self, obs: GroupObservation, victims: Sequence[str]) -> dict[str, str]:
        return self.reads.standing(obs.asg_name or obs.ref.name, victims)

    def shrink(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        text = self.reads.terminate(decision.victims)
        if decision.desired < decision.current - len(decision.victims):
            # Launches still owed are cancelled too (a gang's partial launch given back): desired down to
            # the instances the group holds, so the ASG chooses no instance to terminate.
            text += "; " + self.reads.set_desired(obs.ref.name, decision.desired)
        return text

    def replace_failed(self, obs: GroupObservation, instance_id: str) -> str:
        return self.reads.mark_unhealthy(instance_id)

    def joined_cluster(self, obs: GroupObservation, named: str | None) -> tuple[str | None, str]:
        """A self-managed node group's cluster: the rule's, else its tags' (`aws.asg_shape.cluster_of`)."""
        return (named, "") if named else cluster_of(obs.asg_tags)

    def node_shape(
        self, obs: GroupObservation, overrides: Mapping[str, str] | None, tell: Callable[[str], None] | None
    ) -> NodeShape:
        return asg_node_shape(self.reads.autoscaling, self.ec2(), obs.ref.name, overrides=overrides, tell=tell)

    def gpus_per_node(self, obs: GroupObservation, type_gpus: Callable[[Sequence[str]], float | None]) -> float | None:
        """Not an ASG's: the types it runs now (or lists in overrides) need not be what it launches next (a
        launch template moved on, attribute-based types), so the policy says it."""
        return None

    def metric_namespace(self, obs: GroupObservation, named: str) -> tuple[str | None, str]:
        return named, ""  # a metric names its own namespace: its writer is whoever IAM lets write there
