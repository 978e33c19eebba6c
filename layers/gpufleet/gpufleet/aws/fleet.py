"""The fleet: the group kinds' adapters registered once (`GroupRegistry`, built by the composition root),
and the reader and actuator that every controller uses, which ask each group's own adapter and never
test a kind. A new kind registers its adapter here and its traits row in `domain.kinds`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpufleet.aws.busy_marks import BusyMarks
from gpufleet.aws.groups.asg import AsgGroups, AutoScalingReads
from gpufleet.aws.groups.hyperpod import HyperPodGroups
from gpufleet.aws.groups.nodegroup import NodegroupGroups, owning_group
from gpufleet.aws.groups.provider import GroupProvider
from gpufleet.aws.marks import MarksFailed, NodeMarker
from gpufleet.domain.kinds import GroupKind, traits
from gpufleet.domain.models import Action, Decision, GroupObservation, GroupRef, MarkChannel
from gpufleet.domain.nodes import NodeShape
from gpufleet.policy.fleet import Discovery

if TYPE_CHECKING:
    from mypy_boto3_autoscaling import AutoScalingClient
    from mypy_boto3_eks import EKSClient

    from gpufleet.aws.hyperpod import HyperPodFleet


class GroupRegistry:
    """One adapter per group kind, in the order they were registered (the order groups are read in)."""

    def __init__(self, providers: Iterable[GroupProvider] = ()) -> None:
        self._by_kind: dict[GroupKind, GroupProvider] = {}
        for provider in providers:
            self.register(provider)

    def register(self, provider: GroupProvider) -> None:
        """A kind's adapter, once; its traits row must be registered first (`domain.kinds.register`)."""
        traits(provider.kind)  # a kind without its row is refused here, not on its first group
        if provider.kind in self._by_kind:
            raise ValueError(f"group kind {provider.kind} has an adapter already")
        self._by_kind[provider.kind] = provider

    def __iter__(self) -> Iterator[GroupProvider]:
        return iter(self._by_kind.values())

    def provider(self, kind: GroupKind) -> GroupProvider:
        found = self._by_kind.get(kind)
        if found is None:
            raise LookupError(f"this function is not wired for {traits(kind).label}s (kind {kind})")
        return found

    def has(self, kind: GroupKind) -> bool:
        return kind in self._by_kind

    # ---- what demand asks of a group's kind (`aws.groups.provider.GroupShapes`) ----

    def joined_cluster(self, obs: GroupObservation, named: str | None) -> tuple[str | None, str]:
        return self.provider(obs.ref.kind).joined_cluster(obs, named)

    def node_shape(
        self,
        obs: GroupObservation,
        overrides: Mapping[str, str] | None = None,
        tell: Callable[[str], None] | None = None,
    ) -> NodeShape:
        return self.provider(obs.ref.kind).node_shape(obs, overrides, tell)

    def gpus_per_node(self, obs: GroupObservation, type_gpus: Callable[[Sequence[str]], float | None]) -> float | None:
        return self.provider(obs.ref.kind).gpus_per_node(obs, type_gpus)

    def metric_namespace(self, obs: GroupObservation, named: str) -> tuple[str | None, str]:
        return self.provider(obs.ref.kind).metric_namespace(obs, named)


def builtin_groups(
    autoscaling: AutoScalingClient,
    eks: EKSClient,
    hyperpod: HyperPodFleet | None = None,
    logger: Any = None,
    ec2: Callable[[], Any] = lambda: None,
    busy: BusyMarks | None = None,
) -> GroupRegistry:
    """The three kinds gpufleet ships: ASGs, EKS managed node groups, and (given its fleet) HyperPod
    instance groups. `ec2`: the EC2 client, made when a node shape is first asked; `busy`: the queue
    workers' busy marks (both ASG-backed kinds read them)."""
    asgs = AutoScalingReads(autoscaling, busy)
    providers: list[GroupProvider] = [AsgGroups(asgs, ec2, logger), NodegroupGroups(eks, asgs, ec2)]
    if hyperpod is not None:
        providers.append(HyperPodGroups(hyperpod))
    return GroupRegistry(providers)


@dataclass
class FleetReader:
    """Finds managed groups and describes them, each kind through its own adapter. `autoscaling`: the
    Auto Scaling API itself, for what is asked of an ASG whatever group it backs (its scaling policies,
    recent activities, the group an instance is in)."""

    groups: GroupRegistry
    autoscaling: AutoScalingClient | None = None
    eks: EKSClient | None = None  # the client the node group adapter was built on (call counts)

    @classmethod
    def of(
        cls, autoscaling: AutoScalingClient, eks: EKSClient, hyperpod: HyperPodFleet | None = None, logger: Any = None
    ) -> FleetReader:
        """A reader over the built-in kinds (`builtin_groups`)."""
        return cls(builtin_groups(autoscaling, eks, hyperpod, logger), autoscaling, eks)

    @property
    def hyperpod(self) -> HyperPodFleet | None:
        """The HyperPod adapter's fleet, where one is registered (tests and the rehearsal set its clock)."""
        if not self.groups.has(GroupKind.HYPERPOD):
            return None
        provider = self.groups.provider(GroupKind.HYPERPOD)
        return provider.fleet if isinstance(provider, HyperPodGroups) else None

    def every_group(self) -> list[GroupObservation]:
        """Every group of every kind in the region, tagged or not: `gpufleet doctor`'s census (read-only)."""
        return [obs for provider in self.groups for obs in provider.every_group()]

    def observe(
        self, discovery: Discovery, explicit: Iterable[GroupRef] = (), attrition: Collection[str] = ()
    ) -> list[GroupObservation]:
        """Discovered (tagged) groups plus explicitly named ones; a missing explicit one is skipped, and so is
        a group whose kind this function has no adapter for. `attrition`: keys of the named groups that
        consolidate by attrition (their adapter may read their marks)."""
        explicit = list(explicit)
        found: list[GroupObservation] = []
        for provider in self.groups:
            named = [g for g in explicit if g.kind is provider.kind]
            found += provider.observe(discovery, named, attrition)
        return found

    def observe_one(self, ref: GroupRef) -> GroupObservation | None:
        if not self.groups.has(ref.kind):
            return None
        return self.groups.provider(ref.kind).observe_one(ref)

    def work_marks(
        self,
        observations: list[GroupObservation],
        now: datetime,
        candidates: Mapping[str, Collection[str]] | None = None,
    ) -> list[GroupObservation]:
        """The groups with what their adapter says of which nodes run work, read when a scale-in is weighed
        (HyperPod: Slurm's idle report, for `candidates` only); the same order as given."""
        marked: dict[int, GroupObservation] = {}
        for provider in self.groups:
            mine = [i for i, o in enumerate(observations) if o.ref.kind is provider.kind]
            if mine:
                again = provider.work_marks([observations[i] for i in mine], now, candidates)
                marked.update(zip(mine, again, strict=True))
        return [marked.get(i, o) for i, o in enumerate(observations)]

    def owner_of_asg(self, asg_name: str) -> GroupObservation | None:
        """The managed group an ASG's instances belong to: the EKS node group EKS tagged it with, else the
        ASG itself (None when neither exists)."""
        backing = self.observe_one(GroupRef(kind=GroupKind.ASG, name=asg_name))
        if backing is None:
            return None
        owner = owning_group(backing)
        return backing if owner == backing.ref else self.observe_one(owner)

    def _autoscaling(self) -> AutoScalingClient:
        if self.autoscaling is None:
            raise RuntimeError("this fleet reader was built without the Auto Scaling API")
        return self.autoscaling

    def scaling_policies(self) -> dict[str, tuple[str, ...]]:
        """The region's native scaling policies' names, by ASG (DescribePolicies, all pages)."""
        found: dict[str, list[str]] = {}
        for page in self._autoscaling().get_paginator("describe_policies").paginate():
            for p in page.get("ScalingPolicies", []):
                found.setdefault(p["AutoScalingGroupName"], []).append(p["PolicyName"])
        return {k: tuple(v) for k, v in found.items()}

    def recent_activities(self, asg_name: str, limit: int = 5) -> list[str]:
        """What Auto Scaling says changed the group lately (each activity's Cause, newest first)."""
        page = self._autoscaling().describe_scaling_activities(AutoScalingGroupName=asg_name, MaxRecords=limit)
        return [str(a.get("Cause") or a.get("Description", "")) for a in page.get("Activities", [])]

    def asg_of_instance(self, instance_id: str) -> str | None:
        found = self._autoscaling().describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
        return found[0]["AutoScalingGroupName"] if found else None


@dataclass
class FleetActuator:
    """Applies one decision through the group's own adapter. Idempotent per decision: EKS updates carry
    a client request token; a HyperPod count already reached is not asked again and a node already
    deleted is done."""

    groups: GroupRegistry
    markers: Mapping[MarkChannel, NodeMarker] = field(default_factory=dict)  # consolidation by attrition
    # The clients the built-in adapters were built on, for counting calls (tests, the bench); unused here.
    autoscaling: AutoScalingClient | None = None
    eks: EKSClient | None = None

    @classmethod
    def of(
        cls,
        autoscaling: AutoScalingClient,
        eks: EKSClient,
        hyperpod: HyperPodFleet | None = None,
        markers: Mapping[MarkChannel, NodeMarker] | None = None,
    ) -> FleetActuator:
        """An actuator over the built-in kinds (`builtin_groups`)."""
        return cls(builtin_groups(autoscaling, eks, hyperpod), dict(markers or {}), autoscaling, eks)

    def apply(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        """Returns a short account of what was done; raises on failure. Nodes are reopened before any
        launch (waiting work takes them first) and closed after the capacity change."""
        if self.groups.has(obs.ref.kind):
            self.groups.provider(obs.ref.kind).prepare(obs)
        done: list[str] = []
        failed: list[str] = []
        if decision.undrain:
            self._mark(lambda m: m.reopen(obs, decision.undrain), obs, "reopen", done, failed)
        if decision.changes_capacity:  # a failed reopen never holds back a launch
            done.append(self._capacity(self._provider(obs), decision, obs, token))
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

    def _provider(self, obs: GroupObservation) -> GroupProvider:
        try:
            return self.groups.provider(obs.ref.kind)
        except LookupError as exc:  # said with the group, as any failed change is
            raise RuntimeError(f"{obs.ref.key}: {exc}") from None

    @staticmethod
    def _capacity(provider: GroupProvider, decision: Decision, obs: GroupObservation, token: str) -> str:
        if decision.action in (Action.SCALE_OUT, Action.SET_DESIRED):
            return provider.grow(decision, obs, token)
        if decision.action is Action.SCALE_IN:
            return provider.shrink(decision, obs, token)
        return "nothing to apply"

    def replace_failed(self, obs: GroupObservation, instance_id: str) -> str:
        """Have a node whose GPU failed replaced by whoever replaces the group's nodes (its ASG)."""
        return self._provider(obs).replace_failed(obs, instance_id)
