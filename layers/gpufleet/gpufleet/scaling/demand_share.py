"""Backlogs that several groups read, split so each unit of work counts for one group only, and nodes that
are not GPU-ready yet. Pure: counts, groups and `now` in; per-group shares and node states out.

A queue (or a backlog metric) names no node and no group: it says how many jobs wait and how many are
being worked on. Groups that read one source split it in one stated order: the lowest `demand.order`
first, then a spot group before its fallback, then by key. Waiting work first fills the room the groups'
free nodes already have (any runner takes the next message), then each group in order takes what it can
still grow by; the last takes the rest (and says "already at max" when it cannot).

Running work (SQS: in-flight messages) holds nodes. Which nodes is not said, but a node whose worker
marked it busy (`gpufleet-node busy`, kept as instance scale-in protection) or that is protected holds
one: the in-flight units those nodes account for are held by them, across every group of the source.
Only the units no protected node accounts for hold unprotected nodes, up to that many in each group
(fail closed: never a busy runner removed). Where nobody marks, that is every running unit, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from pydantic import Field

from gpufleet.domain import defaults
from gpufleet.domain.models import Frozen, InstanceObservation
from gpufleet.domain.nodes import NodeReadiness

_UNORDERED = 10_000


class Sharer(Frozen):
    """One group that reads a shared backlog, as the split needs it."""

    key: str
    order: int | None = None
    fallback: bool = False  # another group's spot fallback: served after the groups it covers
    per_node: int = Field(ge=0)  # units of work one node takes at once (0: one unit is bigger than a node)
    nodes_per_unit: int = Field(default=1, ge=1)  # nodes one unit needs (more than 1 only when per_node is 0)
    ready: int = Field(default=0, ge=0)  # InService nodes that can serve GPUs: room for waiting units
    in_service: int = Field(default=0, ge=0)  # every InService node, ready or not: any may run a unit
    protected: int = Field(default=0, ge=0)  # InService nodes protected from scale-in (busy marks among them)
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


def fifo_startable(visible: int, in_flight: int, message_groups: int | None) -> int:
    """Waiting messages of a FIFO queue that runners can start now. SQS returns no message of a message
    group while another of it is in flight, yet counts them all as visible, and counts no groups. Known
    groups: the groups with work, less those in flight (each in-flight message taken to hold its own
    group), bounded by the messages. Unknown: at most one beyond the runners at work, so a free group
    still starts and runners grow one at a time while each new one finds work, never the whole backlog."""
    if message_groups is None:
        return min(visible, 1)
    return min(visible, max(0, message_groups - in_flight))


def split_backlog(sharers: Sequence[Sharer], visible: int, in_flight: int) -> dict[str, Share]:
    """Each group's share of a backlog of `visible` waiting units and `in_flight` running ones.

    Held (fail closed): a protected node accounts for one in-flight unit (a share of one, where a unit needs
    several nodes) and counts as held while units run (protection beyond them keeps a node, not a run);
    `unaccounted_units` are the rest, which the source cannot place, so each group also keeps as many of
    its unprotected InService nodes as those units could be spread over, ready or not. Never more than
    without protection: where nobody marks, every running unit holds, as before.

    Room (for waiting units): the running units are taken to fill the groups' ready nodes first, in order,
    each group at its own units per node; the nodes left take waiting units, and those nodes are held too
    (they are the room the waiting units use)."""
    ordered = share_order(sharers)
    unplaced = unaccounted_units(ordered, in_flight)
    marked_left = in_flight - unplaced  # units a protected node runs: that node is busy, no other room is
    busy_left, cover_left = unplaced, visible
    taking: dict[str, int] = {}
    for s in ordered:
        if s.per_node == 0:
            taking[s.key] = 0
            continue
        marked = min(marked_left, min(s.protected, s.in_service) // s.nodes_per_unit)
        marked_left -= marked
        busy = min(s.ready, marked * s.nodes_per_unit)
        placed = min(s.ready - busy, -(-busy_left // s.per_node))
        busy_left = max(0, busy_left - placed * s.per_node)
        busy += placed
        covered = min(cover_left, (s.ready - busy) * s.per_node)
        cover_left -= covered
        taking[s.key] = -(-covered // s.per_node)
    out: dict[str, Share] = {}
    for i, s in enumerate(ordered):
        last = i == len(ordered) - 1
        take = cover_left if last else min(cover_left, (s.coming + s.growth) * s.per_node)
        cover_left -= take
        protected = min(s.protected, s.in_service)  # held by their runs, up to the nodes the runs need
        running = min(protected, in_flight * s.nodes_per_unit)
        running += min(s.in_service - protected, unplaced * s.nodes_per_unit)
        out[s.key] = Share(key=s.key, waiting=take, held_nodes=min(s.in_service, running + taking[s.key]))
    return out


def unaccounted_units(sharers: Iterable[Sharer], in_flight: int) -> int:
    """In-flight units that no protected node accounts for. A protected node is taken to run one unit (or
    its share of one that needs several nodes), never more: a node marked for one job must not let a
    runner of another go. Protection nobody explains counts too; it is never a victim either way."""
    accounted = sum(min(s.protected, s.in_service) // s.nodes_per_unit for s in sharers)
    return max(0, in_flight - accounted)


# ---- GPU-ready nodes ----


class NotReady(Frozen):
    instance_id: str
    age_s: int = Field(ge=0)
    overdue: bool  # past the GPU-ready timeout: an incident, and no longer capacity on the way
    said: str  # what the node did report, for the incident
    again: bool = False  # overdue, but another of the group's nodes already counts as nothing: on the way


def not_gpu_ready(
    instances: Iterable[InstanceObservation],
    readiness: Mapping[str, NodeReadiness],
    now: datetime,
    timeout_s: int,
) -> list[NotReady]:
    """InService nodes that cannot serve GPUs yet: no GPU work bound to them and no GPUs reported. Within
    the timeout they are on the way; past it they are overdue. Only the oldest overdue node of a group is
    counted as nothing (its work gets one new node); the others stay counted as on the way, so nodes that
    never become ready are replaced once, not one more every timeout up to max."""
    out: list[NotReady] = []
    for inst in instances:
        r = readiness.get(inst.instance_id)
        if not inst.in_service or inst.runs_work or r is None or r.gpus_reported or r.launched_at is None:
            continue
        age = now - r.launched_at
        if age < timedelta(0):  # a launch time ahead of the clock: not known, not claimed
            continue
        seconds = int(age.total_seconds())
        said = "no GPU metrics from its publisher and no GPU pod bound to it"
        out.append(NotReady(instance_id=inst.instance_id, age_s=seconds, overdue=seconds > timeout_s, said=said))
    overdue = sorted((n for n in out if n.overdue), key=lambda n: (-n.age_s, n.instance_id))
    again = {n.instance_id for n in overdue[1:]}
    return [
        n.model_copy(
            update={"said": f"{n.said}; not replaced again (one node of the group already was)", "again": True}
        )
        if n.instance_id in again
        else n
        for n in out
    ]
