"""One reader per demand source (the policy's `demand: {kubernetes | sqs | metric: ...}`), each behind
`DemandSourceReader` and registered once under its `SourceName` (`scaling.demand_source.READERS`): the
tick's hub hands each reader its groups, a unit at a time, and keeps one reader's failure its own.

The readers are glue (they read through the adapters and tell what they cannot read); what their answers
make of each group is `scaling.demand_rules`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from gpufleet.domain.models import GroupObservation
from gpufleet.policy.fleet import DemandSource
from gpufleet.scaling.demand_rules import Member, Tick


class DemandSourceReader(Protocol):
    """One demand source's reader. Its groups are read a unit at a time (`unit_of`: one cluster's, one
    queue's, one metric series'); every group of a unit gets its demand, or says why it has none."""

    def unit_of(self, obs: GroupObservation, d: DemandSource) -> Hashable:
        """What the group is read with: groups of one unit share one read."""
        ...

    def read(self, unit: list[Member], run: Tick) -> dict[str, GroupObservation]:
        """Each group of the unit by key, with its demand attached."""
        ...

    def source(self, d: DemandSource) -> str:
        """The source as its groups' demand names it (where reading it failed outright, too)."""
        ...
