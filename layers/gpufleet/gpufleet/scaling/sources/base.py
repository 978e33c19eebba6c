"""What every demand source's reader shares: one WARNING per source and cause (`Warnings`, one for the
whole tick's hub, so a cause is told once whichever reader meets it), the GPUs per node of a backlog's
groups (`Sizes`), and what a reader is built from (`SourceDeps`), the cluster pod listing's among them
(`ClusterPodsReader`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from aws_lambda_powertools import Logger

from gpufleet.aws.groups.provider import GroupShapes
from gpufleet.domain.models import Demand, GroupObservation, QueuedSource
from gpufleet.kubernetes.pods import ClusterPods, NodeListing
from gpufleet.scaling.demand_rules import NO_GPN, Member, Sized

TypeGpus = Callable[[Sequence[str]], float | None]  # instance types -> the fewest GPUs any has (None: unknown)
InstancesOf = Callable[[Iterable[str]], dict[str, str]]  # node names -> instance ids


class ClusterPodsReader(Protocol):
    """One cluster's pods, read for the groups of one tick (the composition root's `runtime.ClusterPodsReader`)."""

    def read(
        self,
        cluster: str,
        resources: Mapping[str, float],
        nodes: NodeListing,
        queued: Collection[QueuedSource],
        now: datetime,
    ) -> ClusterPods:
        """The pods waiting for and holding GPUs (`resources`: what counts as one), the nodes `nodes` asks
        for, and the jobs of the queueing systems `queued` as of `now`; ClusterUnreadable when they
        cannot be read."""
        ...


@dataclass
class Warnings:
    """One WARNING per source and cause, and a group's demand when its source cannot be read."""

    logger: Logger
    _warned: dict[str, str] = field(default_factory=dict, init=False)  # source -> the cause last told

    def unreadable(
        self, obs: GroupObservation, source: str, cause: str, gpus_per_node: float = 1.0
    ) -> GroupObservation:
        self.warn_once(source, cause, "demand source unreadable: no node of its groups may be removed")
        demand = Demand(source=source, gpus_per_node=gpus_per_node, unreadable=cause)
        return obs.model_copy(update={"demand": demand})

    def warn_once(self, source: str, cause: str, message: str) -> None:
        """One WARNING per source and cause, again only once the source has read well in between."""
        if self._warned.get(source) != cause:
            self._warned[source] = cause
            self.logger.warning(message, extra={"source": source, "cause": cause})

    def read_well(self, source: str) -> None:
        self._warned.pop(source, None)

    def weighted(self, obs: GroupObservation) -> GroupObservation:
        """A group whose desired counts weight units: its demand is not read (told once, fails closed)."""
        return self.unreadable(obs, f"group {obs.ref.key}", str(obs.demand_refused))

    def tell_shape(self, key: str) -> Callable[[str], None]:
        """Where a self-managed ASG's shape tells what its tags say that is not used: once per group."""
        return lambda line: self.warn_once(f"node template of {key}", line, "ASG tags not used for its node shape")

    def all_unreadable(self, sized: Iterable[Sized], source: str, why: str) -> dict[str, GroupObservation]:
        return {m[0].ref.key: self.unreadable(m[0], source, why, gpn) for m, gpn in sized}


def _no_type_gpus(types: Sequence[str]) -> float | None:
    return None


@dataclass(frozen=True)
class Sizes:
    """GPUs per node of a backlog's groups (a queue's, a metric's): the policy's gpus_per_node, else what
    the group's kind knows of what it launches (`GroupShapes.gpus_per_node`)."""

    groups: GroupShapes
    type_gpus: TypeGpus | None = None  # None: no kind's GPUs per node come from its types

    def sized(
        self, members: Iterable[Member], told: Warnings, source: str, why: str = NO_GPN
    ) -> tuple[dict[str, GroupObservation], list[Sized]]:
        """The groups whose GPUs per node are known, with them; the others unreadable, saying `why`."""
        out: dict[str, GroupObservation] = {}
        sized: list[Sized] = []
        for m in members:
            obs, _, d = m
            gpn = d.gpus_per_node if d.gpus_per_node is not None else self._kinds(obs)
            if gpn is None:
                out[obs.ref.key] = told.unreadable(obs, source, why)
            else:
                sized.append((m, gpn))
        return out, sized

    def _kinds(self, obs: GroupObservation) -> float | None:
        return self.groups.gpus_per_node(obs, self.type_gpus or _no_type_gpus)


@dataclass(frozen=True)
class SourceDeps:
    """What the readers are built from, once per hub (`scaling.demand_source.READERS` builds each)."""

    sqs: Any
    cloudwatch: Any
    cluster_pods: ClusterPodsReader
    groups: GroupShapes
    instances_of: InstancesOf
    type_gpus: TypeGpus | None
    told: Warnings

    @property
    def sizes(self) -> Sizes:
        return Sizes(self.groups, self.type_gpus)
