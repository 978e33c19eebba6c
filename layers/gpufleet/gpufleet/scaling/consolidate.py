"""Consolidation by attrition: which nodes to close to new work so that they empty as their work ends, and
which to open again. Pure: the group as observed, its settings and what it must keep in, a `MarkPlan` out.

Why: kube-scheduler's default scoring (NodeResourcesFit, LeastAllocated) spreads pods over the least
allocated nodes, so every node keeps one long pod and none ever empties. Cluster Autoscaler and Karpenter
consolidate by evicting. gpufleet closes the emptiest surplus nodes instead (cordon, Slurm drain), lets
their work finish, and removes each one once it is idle: nothing is evicted. Closing the surplus also
steers a spreading scheduler: new work can only land on the nodes kept open, so it packs.

Rules, in order:
1. Open before launch. Waiting work is packed first-fit decreasing into the room the group already offers,
   then into the nodes gpufleet closed (most room first), then into nodes booting; a closed node that
   takes an item is opened, and its room is offered to the waiting work, so the core launches only for
   what no closed node can take. Opening is free and immediate; a launch takes minutes and costs money.
2. Close only when nothing waits and the source can say what every node runs. The nodes beyond what the
   running work needs, packed (ceil(GPUs held / GPUs per node)), are surplus, and never more than the
   nodes above what the group must keep (min, a window's desired). The emptiest go first (by GPUs held,
   then the soonest expected to empty, then the newest work); an idle one (no GPUs held, no work) is always
   closed (it is removed next tick), a node with work (a CPU-only pod's included) only while fewer than
   `drain_max_share` percent of the serving nodes with work are closed; never a node with scale-in
   protection or one the channel cannot name.
3. A closed node beyond what the group must keep (min or a window's desired went up) is opened again,
   fullest first. With `consolidate: off`, every node gpufleet closed is opened.
4. A node someone else closed (NodeMark.OTHER) is neither counted nor touched.
5. While marks rest after a failure (`resting`), nothing is closed or counted as reopened room: waiting
   work gets a launch, and no node is removed (the core removes only closed nodes).

Nothing here removes a node: a closed node is removed by the scaler's ordinary rules once it is idle.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime

from gpufleet.domain.models import (
    Decision,
    Demand,
    Frozen,
    GroupObservation,
    InstanceObservation,
    MarkChannel,
    NodeMark,
)
from gpufleet.policy.fleet import Consolidation, GroupSettings
from gpufleet.scaling.demand import gpus_text, waiting_sizes

_EPSILON = 1e-9
_FAR = datetime.max.replace(tzinfo=None)


class MarkPlan(Frozen):
    """Nodes to close and to open this tick, the room the opened ones offer waiting work, and why."""

    drain: tuple[str, ...] = ()
    undrain: tuple[str, ...] = ()
    room: tuple[float, ...] = ()  # free GPUs on each node opened for waiting work
    note: str = ""

    @property
    def empty(self) -> bool:
        return not (self.drain or self.undrain or self.note)

    def observed(self, obs: GroupObservation, dry_run: bool = False) -> GroupObservation:
        """The group as the rest of the core decides on it: the nodes opened here count as open, and
        their room is offered to the waiting work (so no node is launched for what they take). In a dry
        run the nodes it would close count as closed, so it shows the removal that would follow."""
        if not self.undrain and not (dry_run and self.drain):
            return obs
        opened, shut = set(self.undrain), set(self.drain) if dry_run else set()
        instances = tuple(
            i.model_copy(update={"mark": NodeMark.NONE})
            if i.instance_id in opened
            else i.model_copy(update={"mark": NodeMark.GPUFLEET})
            if i.instance_id in shut
            else i
            for i in obs.instances
        )
        demand = obs.demand
        if demand is not None and self.room:
            demand = demand.model_copy(update={"free_gpus": (*demand.free_gpus, *self.room)})
        return obs.model_copy(update={"instances": instances, "demand": demand})

    def attached(self, decision: Decision) -> Decision:
        """The decision with the marks added: a node the decision removes is not closed first, and the
        reason says what drains or reopens and why."""
        going = set(decision.victims)
        drain = tuple(i for i in self.drain if i not in going)
        undrain = tuple(i for i in self.undrain if i not in going)
        if not (drain or undrain or self.note):
            return decision
        reason = f"{decision.reason}; {self.note}" if self.note else decision.reason
        return decision.model_copy(update={"drain": drain, "undrain": undrain, "reason": reason})


def held(inst: InstanceObservation, per_node: float) -> float | None:
    """GPUs a node's work holds: what the source says (a number that is not finite: all of them), else all
    of them if it runs work, else unknown."""
    if inst.gpus_held is not None:
        return max(0.0, min(inst.gpus_held, per_node)) if math.isfinite(inst.gpus_held) else per_node
    return per_node if inst.runs_work else None


def _room(inst: InstanceObservation, per_node: float) -> float:
    """Room a closed node may offer waiting work: what it does not hold; all of it when unknown (HyperPod
    reads Slurm's word only when a scale-in is weighed: reopening a busy node costs nothing, a launch it
    spares is minutes and money)."""
    h = held(inst, per_node)
    return per_node if h is None else per_node - h


def plan_marks(
    obs: GroupObservation,
    settings: GroupSettings,
    keep: int,
    booting: int = 0,
    resting: str | None = None,
) -> MarkPlan:
    """What to close and open on one group this tick (rules in the module docstring). `keep` is the size
    below which nothing may be removed (the core's low water); `booting` the nodes already on their way;
    `resting` why marks are not tried now (they failed a moment ago): nothing drains, and no closed node's
    room is counted, so waiting work gets a launch."""
    ours = [i for i in obs.instances if i.mark is NodeMark.GPUFLEET and not i.lifecycle_state.startswith("Terminat")]
    if settings.consolidate is Consolidation.OFF:
        if ours and obs.marks is not None and resting is None:
            ids = _ids(ours)
            return MarkPlan(undrain=ids, note=f"consolidation is off: reopening {_listed(ids)}, which gpufleet drained")
        return MarkPlan()
    d = obs.demand
    if obs.marks is None or d is None or not d.known or resting is not None:
        why = resting or ("its nodes cannot be marked" if obs.marks is None else "what waits for it is unknown")
        return MarkPlan(note=f"consolidate: attrition is on, but {why}: nothing drains, no node is removed")
    per_node = d.gpus_per_node
    # An instance Kubernetes does not know as a node (never registered, its node object deleted) holds no
    # pod and cannot be marked: it is left out, so it neither blocks nor counts toward the drains.
    serving = [
        i
        for i in obs.instances
        if i.in_service
        and i.mark is not NodeMark.OTHER
        and (i.node_name is not None or obs.marks is not MarkChannel.KUBERNETES)
    ]
    closed = [i for i in serving if i.mark is NodeMark.GPUFLEET]
    if d.waiting:
        opened, room = _reopen_for(d, closed, per_node, booting)
        return _plan(opened, room, d)
    removable = max(0, obs.desired - keep)
    if len(closed) > removable:  # min or a window's desired went up: the fullest go back
        return _plan(_fullest(closed, len(closed) - removable, per_node), (), d)
    if obs.scale_in_closed or d.closed_for_scale_in:
        return MarkPlan()
    return _drain_plan(serving, closed, (removable, settings.drain_max_share), per_node)


def _drain_plan(
    serving: Sequence[InstanceObservation],
    closed: Sequence[InstanceObservation],
    bounds: tuple[int, float],
    per_node: float,
) -> MarkPlan:
    """Nothing waits: the nodes to close (rule 2), and a busy closed node swapped for an idle open one.
    `bounds`: the nodes that may be removed, and drain_max_share (percent)."""
    removable, share = bounds
    holding = {i.instance_id: held(i, per_node) for i in serving}
    if any(h is None for h in holding.values()):
        return MarkPlan()
    gpus = {k: h or 0.0 for k, h in holding.items()}  # every one known (above)
    # Idle: no GPUs held and no work at all. A node whose work holds no GPU (a CPU-only Job) is not: it does
    # not go next tick, so it is closed, and swapped, as a node with work is.
    idle = {i.instance_id for i in serving if gpus[i.instance_id] == 0.0 and not i.runs_work}
    work = sum(gpus.values())
    need = math.ceil(work / per_node - _EPSILON)
    cap = math.floor(len(serving) * share / 100 + _EPSILON)
    open_ = [i for i in serving if i.mark is NodeMark.NONE and not i.protected_from_scale_in]
    busy_closed = [i for i in closed if i.instance_id not in idle]
    limits = (removable, len(serving) - need, cap)
    chosen = _closing(open_, (gpus, idle), (len(closed), len(busy_closed)), limits)
    swap_out, swap_in = _swaps(open_, busy_closed, set(chosen), (gpus, idle))
    chosen += swap_in
    if not chosen:
        return MarkPlan()
    why = (
        f"draining {_listed(chosen)} by attrition: {len(serving)} serving node(s) hold {gpus_text(work)} of work, "
        f"which {need} node(s) hold packed; closed to new work and removed once idle, nothing evicted"
    )
    if swap_out:
        why += f"; reopening {_listed(swap_out)} instead (still busy, while an idle node can go now)"
    return MarkPlan(drain=chosen, undrain=swap_out, note=why)


def _swaps(
    open_: Sequence[InstanceObservation],
    busy_closed: Sequence[InstanceObservation],
    chosen: set[str],
    weighed: tuple[Mapping[str, float], set[str]],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Idle open nodes left open only because closed busy nodes use up what may be removed (a drained node
    whose work runs on and on): each swaps with the fullest such busy node, which reopens, so the idle node
    goes next tick instead of never. `weighed`: GPUs held per node, and the idle nodes."""
    if not busy_closed:
        return (), ()
    gpus, idle_ids = weighed
    idle = sorted(i.instance_id for i in open_ if i.instance_id not in chosen and i.instance_id in idle_ids)
    count = min(len(idle), len(busy_closed))
    fullest = sorted(busy_closed, key=lambda i: (-gpus[i.instance_id], i.instance_id))
    return tuple(i.instance_id for i in fullest[:count]), tuple(idle[:count])


def _closing(
    open_: Sequence[InstanceObservation],
    weighed: tuple[Mapping[str, float], set[str]],
    closed: tuple[int, int],
    limits: tuple[int, int, int],
) -> tuple[str, ...]:
    """Open nodes to close, emptiest first (`closed`: how many are closed already, and of them with work),
    within `limits` = (removable: the nodes above what the group keeps; surplus: the nodes beyond what holds
    all the work, packed; cap: drain_max_share of the serving nodes). An idle node is closed whenever it is
    removable: it holds nothing, and it goes next tick, as it would go without attrition. A node with work
    is closed only while the closed nodes stay within the surplus and fewer than `cap` with work are closed.
    `weighed`: GPUs held per node, and the idle nodes (none held, no work)."""
    removable, surplus, cap = limits
    total, busy = closed
    gpus, idle = weighed
    if (total >= surplus or busy >= cap) and not any(i.instance_id in idle for i in open_):
        return ()  # the common steady tick: no sort
    chosen: list[str] = []
    for inst in sorted(open_, key=lambda i: _drain_order(i, gpus[i.instance_id], i.instance_id not in idle)):
        if total >= removable:
            break
        if inst.instance_id not in idle:
            if total >= surplus or busy >= cap:
                break
            busy += 1
        total += 1
        chosen.append(inst.instance_id)
    return tuple(chosen)


def _reopen_for(
    d: Demand, closed: Sequence[InstanceObservation], per_node: float, booting: int
) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """First-fit decreasing of the waiting work into the offered room, then the closed nodes (most room
    first), then booting nodes: the closed nodes that take an item, and their room."""
    sizes = Counter({s: n for s, n in waiting_sizes(d.waiting, per_node).items() if s <= per_node + _EPSILON})
    if not sizes or not closed:
        return (), ()
    rooms = [_Bin(r, None) for r in d.free_gpus if r > _EPSILON]
    by_room = sorted(closed, key=lambda i: (-_room(i, per_node), i.instance_id))
    rooms += [_Bin(_room(i, per_node), i.instance_id) for i in by_room]
    rooms += [_Bin(per_node, None) for _ in range(min(booting, 10_000))]
    for size in sorted(sizes, reverse=True):
        count = sizes[size]
        for b in rooms:
            if count <= 0:
                break
            fit = min(count, int((b.room + _EPSILON) // max(size, 1e-3)))
            if fit:
                b.room -= fit * size
                b.took = True
                count -= fit
    opened = [b for b in rooms if b.node is not None and b.took]
    return tuple(str(b.node) for b in opened), tuple(b.start for b in opened)


class _Bin:
    __slots__ = ("node", "room", "start", "took")

    def __init__(self, room: float, node: str | None) -> None:
        self.room = self.start = max(0.0, room)
        self.node = node
        self.took = False


def _drain_order(inst: InstanceObservation, gpus: float, busy: bool) -> tuple[float, bool, datetime, float, str]:
    """Emptiest by GPUs held, an idle node before one whose work holds no GPU, then the soonest expected to
    empty, then the newest work (work that has run longer is likely to run longer), then by id. The nodes
    beyond what holds all the work packed (ceil(GPUs held / GPUs per node)) drain: the replay tried counting
    only the work on open nodes (closing more), and new work then waited for reopened nodes so often that
    the bursty trace cost 1.58x the oracle instead of 1.42x."""
    return (gpus, busy, _naive(inst.empties_by), -_since(inst.work_since), inst.instance_id)


def _fullest(closed: Sequence[InstanceObservation], count: int, per_node: float) -> tuple[str, ...]:
    """`count` closed nodes, the fullest first (the ones least likely to empty soon)."""
    ordered = sorted(closed, key=lambda i: (-(held(i, per_node) or per_node), i.instance_id))
    return _ids(ordered[:count])


def _plan(undrain: tuple[str, ...], room: tuple[float, ...], d: Demand) -> MarkPlan:
    if not undrain:
        return MarkPlan()
    if room:
        what = f"waiting {d.noun}s fit {len(room)} drained node(s) ({gpus_text(sum(room))} free)"
        note = f"reopening {_listed(undrain)} before any launch: {what}"
    else:
        note = f"reopening {_listed(undrain)}: the group must keep more nodes than stay open"
    return MarkPlan(undrain=undrain, room=room, note=note)


def _ids(instances: Sequence[InstanceObservation]) -> tuple[str, ...]:
    return tuple(i.instance_id for i in instances)


def _listed(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:5])
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _naive(at: datetime | None) -> datetime:
    return _FAR if at is None else at.replace(tzinfo=None)


def _since(at: datetime | None) -> float:
    """Newest work first among nodes that hold as much: work running longer is likely to run longer."""
    return float("inf") if at is None else at.timestamp()
