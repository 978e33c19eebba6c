"""The demand reader's adapters from a test's functions: its cluster pod listing (`Pods`) and what a
group's kind says of it (`shapes`: the group registry over a test's node shapes), so a test fakes
only what it reads and the kinds' rules stay the seam's."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from gpufleet.aws.fleet import GroupRegistry
from gpufleet.aws.groups.asg import AsgGroups, AutoScalingReads
from gpufleet.aws.groups.hyperpod import HyperPodGroups
from gpufleet.aws.groups.nodegroup import NodegroupGroups
from gpufleet.domain.models import GroupObservation, QueuedSource
from gpufleet.domain.nodes import NodeShape
from gpufleet.kubernetes.pods import ClusterPods, NodeListing

Tell = Callable[[str], None]


class Pods:
    """A `ClusterPodsReader` from a function of (cluster, resources, nodes=, queued=, now=)."""

    def __init__(self, listing: Callable[..., ClusterPods]) -> None:
        self.listing = listing

    def read(
        self,
        cluster: str,
        resources: Mapping[str, float],
        nodes: NodeListing,
        queued: Collection[QueuedSource],
        now: datetime,
    ) -> ClusterPods:
        return self.listing(cluster, resources, nodes=nodes, queued=queued, now=now)


class _Asgs(AsgGroups):
    def __init__(self, shape: Callable[[str, Tell | None], NodeShape]) -> None:
        super().__init__(AutoScalingReads(None))  # type: ignore[arg-type]  # never called: shapes are the test's
        self.shape = shape

    def node_shape(self, obs: GroupObservation, overrides: Mapping[str, str] | None, tell: Tell | None) -> NodeShape:
        return self.shape(obs.ref.name, tell)


class _Nodegroups(NodegroupGroups):
    def __init__(self, shape: Callable[[str, str], NodeShape]) -> None:
        super().__init__(None, AutoScalingReads(None))  # type: ignore[arg-type]  # never called
        self.shape = shape

    def node_shape(self, obs: GroupObservation, overrides: Mapping[str, str] | None, tell: Tell | None) -> NodeShape:
        return self.shape(obs.ref.cluster or "", obs.ref.name)


def shapes(
    managed: Callable[[str, str], NodeShape] | None = None,
    asg: Callable[[str, Tell | None], NodeShape] | None = None,
) -> GroupRegistry:
    """The real group registry (each kind's own rules: which cluster it joins, its GPUs per node) with the
    test's node shapes: `managed`, a node group's by (cluster, name); `asg`, a self-managed ASG's by
    (name, tell). One not given is a shape nobody may ask for."""

    def unasked(*args: Any) -> NodeShape:
        raise AssertionError(f"a node shape was asked that the test does not expect: {args}")

    return GroupRegistry(
        [
            _Asgs(asg or (lambda n, tell: unasked(n))),
            _Nodegroups(managed or (lambda c, n: unasked(c, n))),
            HyperPodGroups(None),  # type: ignore[arg-type]  # its fleet is never read here
        ]
    )
