"""Backlogs that several groups read, split so each unit of work counts for one group only, and nodes that
are not GPU-ready yet. Pure: counts, groups and `now` in; per-group shares and node states out.

A queue (or a backlog metric) names no node and no group: it says how many jobs wait and how many are
being worked on. Groups that read one source split it in one stated order: the lowest `demand.order`
first, then a spot group before its fallback, then by key. Waiting work first fills the room the groups'
free nodes already have (any runner takes the next message), then each group in order takes what it can
still grow by; the last takes the rest (and says "already at max" when it cannot).

Running work (SQS: in-flight messages) holds nodes. Which nodes is not said, so each group keeps up to that
many nodes while it runs (fail closed: never a busy runner removed); the busy marker on the node itself
(instance scale-in protection) is what lets the idle ones go sooner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from pydantic import Field

from gpufleet.domain import defaults
from gpufleet.domain.models import Frozen, InstanceObservation

_UNORDERED = 10_000


class Sharer(Frozen):
    """One group that reads a shared backlog, as the split needs it."""

    key: str
    order: int | None = None
    fallback: bool = False  # another group's spot fallback: served after the groups it covers
    per_node: int = Field(ge=0)  # units of work one node takes at once (0: one unit is bigger than a node)
    in_service: int = Field(default=0, ge=0)  # nodes that serve (GPU-ready), busy or not
    coming: int = Field(default=0, ge=0)  # nodes booting or asked for
    growth: int = Field(default=0, ge=0)  # nodes it may still add (effective max - desired)


class Share(Frozen):
    key: str
    waiting: int = Field(ge=0)  # units that wait for this group (not covered by free room anywhere)
    held_nodes: int = Field(ge=0)  # nodes this group keeps while running work holds them


def share_order(sharers: Iterable[Sharer]) -> list[Sharer]:
    return sorted(sharers, key=lambda s: (s.order if s.order is not None else _UNORDERED, s.fallback, s.key))


def bounded_count(value: float | int) -> int:
    """A count from outside (a queue's, a metric's) as a bounded whole number: negative is 0, past the
    cap (or infinite) is the cap. NaN never gets here (the readers refuse it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return defaults.MAX_BACKLOG_ITEMS if value > 0 else 0
    return int(min(max(0, math.ceil(value)), defaults.MAX_BACKLOG_ITEMS))


def split_backlog(sharers: Sequence[Sharer], visible: int, in_flight: int) -> dict[str, Share]:
    """Each group's share of a backlog of `visible` waiting units and `in_flight` running ones."""
    ordered = share_order(sharers)
    per_node = max((s.per_node for s in ordered), default=0)
    held_total = -(-in_flight // per_node) if per_node else 0
    free_units = max(0, sum(s.in_service for s in ordered) - held_total) * per_node
    # Free runners about to take the waiting messages are held too: they are the room those messages use.
    taking = -(-min(visible, free_units) // per_node) if per_node else 0
    left = max(0, visible - free_units)
    out: dict[str, Share] = {}
    for i, s in enumerate(ordered):
        last = i == len(ordered) - 1
        take = left if last else min(left, (s.coming + s.growth) * s.per_node)
        left -= take
        out[s.key] = Share(key=s.key, waiting=take, held_nodes=min(s.in_service, held_total + taking))
    return out


# ---- GPU-ready nodes ----


class NodeReadiness(Frozen):
    """What is known of one node's start: when it launched and whether its publisher has reported GPUs."""

    launched_at: datetime | None = None
    gpus_reported: bool = False


class NotReady(Frozen):
    instance_id: str
    age_s: int = Field(ge=0)
    overdue: bool  # past the GPU-ready timeout: an incident, and no longer capacity on the way
    said: str  # what the node did report, for the incident


def not_gpu_ready(
    instances: Iterable[InstanceObservation],
    readiness: Mapping[str, NodeReadiness],
    now: datetime,
    timeout_s: int,
) -> list[NotReady]:
    """InService nodes that cannot serve GPUs yet: no GPU work bound to them, no GPUs reported, and
    launched within twice the timeout (older ones are not probed: what is not known is not claimed).
    Within the timeout they are on the way; past it they are overdue (told, and counted as nothing)."""
    out: list[NotReady] = []
    window = timedelta(seconds=2 * timeout_s)
    for inst in instances:
        r = readiness.get(inst.instance_id)
        if not inst.in_service or inst.runs_gpu_work or r is None or r.gpus_reported or r.launched_at is None:
            continue
        age = now - r.launched_at
        if age < timedelta(0) or age > window:
            continue
        seconds = int(age.total_seconds())
        said = "no GPU metrics from its publisher and no GPU pod bound to it"
        out.append(NotReady(instance_id=inst.instance_id, age_s=seconds, overdue=seconds > timeout_s, said=said))
    return out
