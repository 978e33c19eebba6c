"""An SQS queue of jobs (`demand.sqs`): visible messages wait; in-flight ones run (they hold nodes, never
ask for more). The groups that read one queue split it in order (`scaling.demand_share`).

A FIFO queue runs one message of a message group at a time: only the waiting messages that can start
count (`demand.sqs.message_groups`, else at most one beyond the runners at work, told once)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from gpufleet.aws.backlog import BacklogUnreadable, queue_counts
from gpufleet.domain.models import GroupObservation, UnfitWork
from gpufleet.policy.fleet import DemandSource, QueueDemand
from gpufleet.scaling.demand_rules import Member, Tick, shared
from gpufleet.scaling.demand_share import bounded_count, fifo_startable
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
        visible, in_flight = bounded_count(visible), bounded_count(in_flight)
        queue = _queue(d)
        if not queue.fifo:
            return out | shared(sized, run, source, "message", per, visible, in_flight)
        startable = fifo_startable(visible, in_flight, queue.message_groups)
        found = shared(sized, run, source, "message", per, startable, in_flight)
        return out | {k: _fifo_said(o, source, queue, (visible, startable, in_flight)) for k, o in found.items()}


def _fifo_said(
    obs: GroupObservation, source: str, queue: QueueDemand, counts: tuple[int, int, int]
) -> GroupObservation:
    """A FIFO queue's group: its reason says how many of the visible messages can start; where the message
    groups are unknown and messages were left uncounted, that is told once (one notice per queue)."""
    visible, startable, in_flight = counts
    demand = obs.demand
    if demand is None or demand.unreadable is not None:
        return obs
    groups = f"{queue.message_groups} message groups" if queue.message_groups else "message groups unknown"
    said = f"{source}: {visible} visible, {startable} can start (FIFO, {groups}), {in_flight} running"
    notes = demand.queue_notes
    if queue.message_groups is None and visible > startable:
        text = (
            f"{source} is a FIFO queue: a message group runs one message at a time and SQS counts no groups, "
            f"so of {visible} visible messages ({in_flight} in flight) at most {startable} is asked for "
            "beyond the runners at work; set demand.sqs.message_groups to the most message groups with work"
        )
        notes = (*notes, UnfitWork(key=f"sqs-fifo-groups/{queue.queue_url}", count=visible - startable, text=text))
    return obs.model_copy(update={"demand": demand.model_copy(update={"source": said, "queue_notes": notes})})


def _queue(d: DemandSource) -> QueueDemand:
    """The queue of a group this reader was handed (the hub hands it only groups of `demand.sqs`)."""
    spec = d.source
    assert isinstance(spec, QueueDemand), spec
    return spec
