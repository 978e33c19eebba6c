"""Gangs launched whole: work whose pods start together (a Kueue Workload, a Volcano PodGroup) gets the
nodes it needs in one change, or none. Pure: the waiting work, the group's room and `now` in; what to
launch for, what not and why, and when a partial launch is given back, out.

Why: a gang that gets 3 of its 4 nodes runs nothing and bills 3 nodes (karpenter#3138; Cluster
Autoscaler's AWS provider does not implement AtomicIncreaseSize). On AWS no group API launches N nodes
atomically: the ASG's desired capacity (and a node group's size) is raised by N and EC2 may start fewer.
So gpufleet (1) asks for a gang only when `max` leaves room for all of it, (2) asks in one change, and
(3) when some of its nodes have not launched `GANG_LAUNCH_TIMEOUT_S` after that change, gives back the
ones that came and sit idle and cancels the rest, then lets gangs rest `GANG_REST_S` before asking again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from pydantic import Field

from gpufleet.domain import defaults
from gpufleet.domain.models import Frozen, GroupObservation, GroupState, WaitingWork
from gpufleet.scaling.demand import gpus_text, pack, waiting_sizes

_EARLY = datetime.max.replace(tzinfo=UTC)


class GangRefusal(Frozen):
    gang: str
    pods: int = Field(ge=1)
    gpus: float  # per pod, the largest of its pods
    nodes: int = Field(ge=0)  # new nodes it would need on its own

    def text(self, room: int) -> str:
        """'gang volcano:ml/train (4x8 GPUs) needs 4 new nodes, max leaves room for 3: none launched for it'."""
        return (
            f"gang {self.gang} ({self.pods}x{gpus_text(self.gpus)}) needs {self.nodes} new node(s), "
            f"max leaves room for {room}: none launched for it"
        )


class GangPlan(Frozen):
    """New nodes for the work that may be launched for, within `room` (max less desired)."""

    new_nodes: int = Field(ge=0)
    capped: bool = False  # all of it would need more than `room`
    unplaceable: int = Field(default=0, ge=0)
    refused: tuple[GangRefusal, ...] = ()  # gangs that cannot start whole within max: nothing asked for them


def gangs_of(items: Sequence[WaitingWork]) -> dict[str, list[WaitingWork]]:
    """Each gang's work, the gang waiting longest first (then by key)."""
    found: dict[str, list[WaitingWork]] = {}
    for w in items:
        if w.gang:
            found.setdefault(w.gang, []).append(w)
    return dict(sorted(found.items(), key=lambda kv: (min((w.since or _EARLY) for w in kv[1]), kv[0])))


def plan(
    items: Sequence[WaitingWork], gpus_per_node: float, free: Sequence[float], booting: int, room: int
) -> GangPlan:
    """Everything fits within `room`: one change for all of it. Else gangs, longest waiting first, are
    taken while all of each still fits (a gang is never asked for in part), and work on its own fills
    what room is left (each such pod starts on its own, so a part of them is worth a node)."""
    whole = pack(waiting_sizes(items, gpus_per_node), gpus_per_node, free, booting)
    if whole.new_nodes <= room:
        return GangPlan(new_nodes=whole.new_nodes, unplaceable=whole.unplaceable)
    # Capped, with work on its own waiting too: the room existing nodes have is not counted for a gang (that
    # work may take it first, and the gang would never start): a gang taken gets all its nodes new.
    singles = [w for w in items if not w.gang]
    room_for_gangs = () if singles else free
    taken: list[WaitingWork] = []
    refused: list[GangRefusal] = []
    for gang, work in gangs_of(items).items():
        trial = pack(waiting_sizes([*taken, *work], gpus_per_node), gpus_per_node, room_for_gangs, booting)
        if trial.new_nodes <= room:
            taken += work
            continue
        alone = pack(waiting_sizes(work, gpus_per_node), gpus_per_node, (), booting).new_nodes
        pods = sum(w.count for w in work)
        refused.append(GangRefusal(gang=gang, pods=pods, gpus=max(w.gpus for w in work), nodes=alone))
    for_gangs = pack(waiting_sizes(taken, gpus_per_node), gpus_per_node, room_for_gangs, booting)
    rest = pack(waiting_sizes(singles, gpus_per_node), gpus_per_node, free, 0 if taken else booting)
    new = for_gangs.new_nodes + min(rest.new_nodes, room - for_gangs.new_nodes)
    unplaceable = for_gangs.unplaceable + rest.unplaceable
    return GangPlan(new_nodes=new, capped=True, unplaceable=unplaceable, refused=tuple(refused))


def resting(state: GroupState, now: datetime) -> datetime | None:
    """Until when gangs are not launched for (a partial launch was given back less than GANG_REST_S ago)."""
    at = state.gang_gave_back_at
    if at is None or (now - at).total_seconds() >= defaults.GANG_REST_S:
        return None
    return at + timedelta(seconds=defaults.GANG_REST_S)


class Partial(Frozen):
    """A gang waits while nodes the group asked for have not launched for too long."""

    missing: int = Field(ge=0)  # nodes asked for and never listed (EC2 did not start them); 0: all came
    asked_at: datetime
    gang: str


def partial_launch(obs: GroupObservation, state: GroupState, now: datetime) -> Partial | None:
    """The group's last scale-out is over GANG_LAUNCH_TIMEOUT_S old, some of its nodes were never listed
    (desired above the instances the group holds), and a gang still waits: its launch came in part."""
    d, asked = obs.demand, state.last_scale_out_at
    if d is None or not d.known or asked is None or obs.shrinks_by_victims_only:
        return None
    # Only a gang that has itself waited the timeout counts on the nodes still owed: a gang that came a
    # minute ago does not cancel a launch EC2 is still filling (for it or for work on its own).
    waited = now - timedelta(seconds=defaults.GANG_LAUNCH_TIMEOUT_S)
    gangs = {g: w for g, w in gangs_of(d.waiting).items() if all(x.since is not None and x.since <= waited for x in w)}
    if not gangs or (now - asked).total_seconds() < defaults.GANG_LAUNCH_TIMEOUT_S:
        return None
    listed = sum(1 for i in obs.instances if not i.lifecycle_state.startswith("Terminat"))
    missing = obs.desired - listed
    if missing > 0:
        return Partial(missing=missing, asked_at=asked, gang=next(iter(gangs)))
    # Every node came, the group has room for the gang, and it still has not started twice the timeout
    # after: something other than nodes holds it (a Volcano Queue's capability, a namespace Kueue's queue
    # does not take): the idle nodes go back, and gangs rest, rather than wait idle for ever.
    gang, work = next(iter(gangs.items()))
    stuck = (now - asked).total_seconds() >= 2 * defaults.GANG_LAUNCH_TIMEOUT_S
    fits = pack(waiting_sizes(work, d.gpus_per_node), d.gpus_per_node, d.free_gpus, 0).new_nodes == 0
    if stuck and fits:  # the idle nodes' room holds the whole gang (not merely as many GPUs, fragmented)
        return Partial(missing=0, asked_at=asked, gang=gang)
    return None
