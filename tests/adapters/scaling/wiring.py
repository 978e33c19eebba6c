"""The demand reader's adapters from a test's functions: its cluster pod listing (`Pods`) and what a
group's kind says of it (`shapes`: the interim `GroupShapes` over a test's node shapes), so a test fakes
only what it reads and the kinds' rules stay the seam's."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from gpufleet.aws.groups.shapes_interim import InterimShapes
from gpufleet.domain.models import QueuedSource
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


def shapes(
    managed: Callable[[str, str], NodeShape] | None = None,
    asg: Callable[[str, Tell | None], NodeShape] | None = None,
) -> InterimShapes:
    """`managed`: a node group's shape by (cluster, name); `asg`: a self-managed ASG's by (name, tell).
    One not given is a shape nobody may ask for."""

    def unasked(*args: Any) -> NodeShape:
        raise AssertionError(f"a node shape was asked that the test does not expect: {args}")

    return InterimShapes(
        managed=(lambda c, n, o: managed(c, n)) if managed else (lambda c, n, o: unasked(c, n)),
        self_managed=(lambda n, o, tell: asg(n, tell)) if asg else (lambda n, o, tell: unasked(n)),
    )
