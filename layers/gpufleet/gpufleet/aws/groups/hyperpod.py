"""SageMaker HyperPod (Slurm) instance groups as a group kind: read only where a rule names one (no tag
discovery), grown with UpdateCluster, shrunk only by named idle nodes (BatchDeleteClusterNodes). The
reads and calls are `aws.hyperpod.HyperPodFleet`'s; this is its place behind the group seam."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpufleet.aws.eks_nodes import ShapeUnknown
from gpufleet.aws.groups.provider import NotSupported
from gpufleet.aws.hyperpod import HyperPodFleet
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import Decision, GroupObservation, GroupRef
from gpufleet.domain.nodes import NodeShape
from gpufleet.policy.fleet import Discovery
from gpufleet_node import schema


@dataclass
class HyperPodGroups:
    """The hyperpod kind's adapter (`aws.groups.provider.GroupProvider`)."""

    fleet: HyperPodFleet

    @property
    def kind(self) -> GroupKind:
        return GroupKind.HYPERPOD

    def observe(
        self, discovery: Discovery, named: Sequence[GroupRef], attrition: Collection[str] = ()
    ) -> list[GroupObservation]:
        return self.fleet.observe(named, attrition) if named else []

    def observe_one(self, ref: GroupRef) -> GroupObservation | None:
        return next(iter(self.fleet.observe([ref])), None)

    def every_group(self) -> list[GroupObservation]:
        return []  # read only where a rule names one: no census

    def work_marks(
        self, observations: Sequence[GroupObservation], now: datetime, candidates: Mapping[str, Collection[str]] | None
    ) -> list[GroupObservation]:
        """Slurm's idle report, read only for `candidates` (per group key the nodes whose GPUs read idle;
        the others are marked running work)."""
        return self.fleet.marked(observations, now, candidates)

    def prepare(self, obs: GroupObservation) -> None:
        return None

    def grow(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        return self.fleet.apply(decision, obs)

    def last_look(self, obs: GroupObservation, victims: Sequence[str]) -> dict[str, str]:
        """Nothing here: `HyperPodFleet.delete_nodes` reads Slurm's word again right before the delete, in
        the same call, and keeps a node a job landed on (docs/hyperpod.md)."""
        return {}

    def shrink(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        return self.fleet.apply(decision, obs)

    def replace_failed(self, obs: GroupObservation, instance_id: str) -> str:
        raise NotSupported(f"{obs.ref.key}: HyperPod replaces its own failed nodes (no ASG holds them)")

    def joined_cluster(self, obs: GroupObservation, named: str | None) -> tuple[str | None, str]:
        return None, "a hyperpod group joins no EKS cluster: demand.kubernetes cannot read its pods"

    def node_shape(
        self, obs: GroupObservation, overrides: Mapping[str, str] | None, tell: Callable[[str], None] | None
    ) -> NodeShape:
        why = "a HyperPod instance group runs Slurm jobs, not Kubernetes pods"
        raise ShapeUnknown(obs.ref.cluster or "", obs.ref.name, why, what=f"group {obs.ref.key}")

    def metric_namespace(self, obs: GroupObservation, named: str) -> tuple[str | None, str]:
        """Where a `demand.metric` of this group is read. `Slurm` (or any `Slurm/...`) is Slurm's report,
        which only the cluster's controller node writes: its own namespace is read instead, never the one
        named (any role with PutMetricData there could size the group); (None, why) when the controller
        cannot be told. Any other namespace is read as named."""
        if named != schema.SLURM_NAMESPACE and not named.startswith(schema.SLURM_NAMESPACE_PREFIX):
            return named, ""
        source = self.fleet.sources.source(obs.ref.cluster or "", self.fleet.now())
        return source.namespace, f"Slurm's report is not trusted: {source.why}" if source.why else ""

    def gpus_per_node(self, obs: GroupObservation, type_gpus: Callable[[Sequence[str]], float | None]) -> float | None:
        """Its one instance type's GPUs."""
        return type_gpus(obs.instance_types) if obs.instance_types else None
