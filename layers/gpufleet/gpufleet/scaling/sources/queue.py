"""An SQS queue of jobs (`demand.sqs`): visible messages wait; in-flight ones run (they hold nodes, never
ask for more). The groups that read one queue split it in order (`scaling.demand_share`)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from gpufleet.aws.backlog import BacklogUnreadable, queue_counts
from gpufleet.domain.models import GroupObservation
from gpufleet.policy.fleet import DemandSource, QueueDemand
from gpufleet.scaling.demand_rules import Member, Tick, shared
from gpufleet.scaling.demand_share import bounded_count
from gpufleet.scaling.sources.base import Sizes, SourceDeps, Warnings


@dataclass(frozen=True)
class QueueReader:
    """One queue's groups from one read of its counts."""

    sqs: Any
    sizes: Sizes
    told: Warnings

    @classmethod
    def of(cls, deps: SourceDeps) -> QueueReader:
        return cls(deps.sqs, deps.sizes, deps.told)

    def unit_of(self, obs: GroupObservation, d: DemandSource) -> Hashable:
        return _queue(d).queue_url

    def source(self, d: DemandSource) -> str:
        return f"queue {_queue(d).queue_url.rstrip('/').rsplit('/', 1)[-1]}"

    def read(self, unit: list[Member], run: Tick) -> dict[str, GroupObservation]:
        d = unit[0][2]
        source = self.source(d)
        out, sized = self.sizes.sized(unit, self.told, source)
        if not sized:
            return out
        try:
            visible, in_flight = queue_counts(self.sqs, _queue(d).queue_url)
        except BacklogUnreadable as err:
            return out | self.told.all_unreadable(sized, source, err.why)
        self.told.read_well(source)
        per = {m[0].ref.key: _queue(m[2]).gpus_per_message for m, _ in sized}
        return out | shared(sized, run, source, "message", per, bounded_count(visible), bounded_count(in_flight))


def _queue(d: DemandSource) -> QueueDemand:
    """The queue of a group this reader was handed (the hub hands it only groups of `demand.sqs`)."""
    spec = d.source
    assert isinstance(spec, QueueDemand), spec
    return spec
