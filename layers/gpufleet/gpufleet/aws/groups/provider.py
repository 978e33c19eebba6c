"""The group seam: what every group kind's adapter does, so nothing above it tests a kind.

A kind is one adapter implementing `GroupProvider`, one row of `domain.kinds` (what differs as data) and
one registration (`aws.fleet.GroupRegistry`). What a kind cannot do it says: `ShapeUnknown` for a node
shape it cannot tell, (None, why) for a cluster it joins none of, `NotSupported` for an action it has no
API for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import Decision, GroupObservation, GroupRef
from gpufleet.domain.nodes import NodeShape
from gpufleet.policy.fleet import Discovery


class NotSupported(RuntimeError):
    """An action this kind has no API for (e.g. handing a failed node to an ASG a kind has none of)."""


class GroupProvider(Protocol):
    """One group kind's adapter: observe its groups, grow them, shrink them by named victims, and what
    else a kind needs (its work marks, its node shape, the cluster its nodes join)."""

    @property
    def kind(self) -> GroupKind: ...

    # ---- reading ----
    def observe(
        self, discovery: Discovery, named: Sequence[GroupRef], attrition: Collection[str]
    ) -> list[GroupObservation]:
        """The groups discovered by tag (where the kind is discoverable) and those named, that exist.
        `attrition`: keys of the named groups that consolidate by attrition."""
        ...

    def observe_one(self, ref: GroupRef) -> GroupObservation | None: ...

    def every_group(self) -> list[GroupObservation]:
        """Every group of this kind in the region, managed or not (`gpufleet doctor`'s census)."""
        ...

    def work_marks(
        self,
        observations: Sequence[GroupObservation],
        now: datetime,
        candidates: Mapping[str, Collection[str]] | None,
    ) -> list[GroupObservation]:
        """The same groups with what the kind says of which nodes run work, read when a scale-in is
        weighed; kinds whose observations already carry it return them unchanged."""
        ...

    # ---- changing ----
    def prepare(self, obs: GroupObservation) -> None:
        """Before anything is done to the group or its nodes (e.g. a node group's backing ASG tagged so
        the IAM grant lets gpufleet act on it)."""
        ...

    def grow(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        """Raise (or set) the group's count to `decision.desired`; a short account of what was done."""
        ...

    def last_look(self, obs: GroupObservation, victims: Sequence[str]) -> dict[str, str]:
        """The victims that what the kind itself knows says may not go now (instance id -> why), from a
        fresh read made right before the removal call: scale-in protection and lifecycle in its ASG,
        Slurm's state. Raises when it cannot be read (the caller keeps every victim)."""
        ...

    def shrink(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        """Remove `decision.victims` by name (and cancel launches still owed down to `decision.desired`)."""
        ...

    def replace_failed(self, obs: GroupObservation, instance_id: str) -> str:
        """Have a node whose GPU failed replaced; raises NotSupported where the kind replaces its own."""
        ...

    # ---- what demand needs of a kind ----
    def joined_cluster(self, obs: GroupObservation, named: str | None) -> tuple[str | None, str]:
        """The EKS cluster the group's nodes join (`named`: the rule's demand.kubernetes.cluster), or
        (None, why) where the kind joins none."""
        ...

    def node_shape(
        self, obs: GroupObservation, overrides: Mapping[str, str] | None, tell: Callable[[str], None] | None
    ) -> NodeShape:
        """What one of the group's nodes offers a pod; raises ShapeUnknown when it cannot be told.
        `tell`: where a kind says what of its configuration it could not use."""
        ...

    def gpus_per_node(self, obs: GroupObservation, type_gpus: Callable[[Sequence[str]], float | None]) -> float | None:
        """GPUs per node where the kind knows what it launches (None: the policy must say)."""
        ...

    def metric_namespace(self, obs: GroupObservation, named: str) -> tuple[str | None, str]:
        """Where the group's `demand.metric` named `named` is read: `named`, unless the kind binds that
        namespace to its writer (HyperPod: Slurm's report, from the controller node's own namespace only);
        (None, why) when it cannot be read."""
        ...


def of_kind(observations: Iterable[GroupObservation], kind: GroupKind) -> list[GroupObservation]:
    return [o for o in observations if o.ref.kind is kind]


class GroupShapes(Protocol):
    """What the demand readers ask of the group seam, whatever the kind (the registry answers it by
    asking the group's own adapter)."""

    def joined_cluster(self, obs: GroupObservation, named: str | None) -> tuple[str | None, str]: ...

    def node_shape(
        self,
        obs: GroupObservation,
        overrides: Mapping[str, str] | None = None,
        tell: Callable[[str], None] | None = None,
    ) -> NodeShape: ...

    def gpus_per_node(
        self, obs: GroupObservation, type_gpus: Callable[[Sequence[str]], float | None]
    ) -> float | None: ...

    def metric_namespace(self, obs: GroupObservation, named: str) -> tuple[str | None, str]: ...
