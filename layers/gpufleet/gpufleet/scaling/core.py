"""The pure decision core: observations + policy + `now` in, decisions with reasons out.

Nothing here imports boto3, reads the clock or the environment (tests/unit/test_purity.py checks it);
the services feed it and act on what it returns. Invariant (property-tested): a decision's desired
capacity is always inside the effective [min, max], it only leaves the current capacity where a rule
says so, and cooldowns hold for every controller's changes (the spot fallback's included).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property, wraps
from typing import Concatenate, ParamSpec
from zoneinfo import ZoneInfo

from croniter import croniter
from pydantic import Field

from gpufleet.domain import defaults
from gpufleet.domain.models import (
    Action,
    AlarmState,
    Bounds,
    Decision,
    Demand,
    Direction,
    ForeignChange,
    Frozen,
    GroupObservation,
    GroupState,
    InstanceObservation,
    NodeMark,
    SkipReason,
    Trigger,
    TriggerKind,
)
from gpufleet.domain.removal import held_floor, live_instances
from gpufleet.events.model import AlarmEvent
from gpufleet.policy.fleet import Consolidation, GroupSettings, IdleThreshold, Owner, ScheduleWindow
from gpufleet.scaling import gangs
from gpufleet.scaling.consolidate import plan_marks
from gpufleet.scaling.demand import describe_waiting, gpus_text, waiting_sizes

INTERRUPTED = "interrupted:"  # the group's ledger key prefix for replacements launched before an interruption


def window_is_open(window: ScheduleWindow, now: datetime) -> bool:
    """True if a cron firing covers the minute this tick is for: firing <= minute < firing + duration.

    Ticks run a few hundred ms late, so the tick decides for its whole minute: 07:59:00.300 and
    07:59:59.9 are both the 07:59 tick. Firings and durations are on the window's wall clock, as a cron
    is read (KEDA's cron scaler, a CronJob's timeZone): `0 9 * * 1-5` for 600 minutes is 09:00-19:00 local
    on every day, DST days too, and a window lasting its period (a daily one for 1440) never closes. A
    firing in the hour skipped in spring fires when the gap ends (croniter: 02:30 fires at 03:00); in the
    hour repeated in autumn the wall clock reads the same minutes twice, and a window open at them is open
    in both passes.
    """
    minute = now.astimezone(ZoneInfo(window.timezone)).replace(second=0, microsecond=0)
    # get_prev is strictly before its start: from second 1 a firing on the minute counts. replace()
    # keeps `fold` (the second pass of a repeated hour); adding a timedelta would reset it.
    start = croniter(window.cron, minute.replace(second=1)).get_prev(datetime)
    wall, opened = minute.replace(tzinfo=None), start.replace(tzinfo=None)
    # One duration for every firing, so the latest firing ends last: if it has ended, all have.
    return opened <= wall < opened + timedelta(minutes=window.duration_minutes)


def effective_bounds(obs: GroupObservation, settings: GroupSettings, now: datetime) -> Bounds:
    """Policy bounds (or an open window's) clamped into the group's own min/max. Every controller's
    change goes through this: the scaler's, the spot fallback's, the guard's requests."""
    lo = settings.min if settings.min is not None else obs.min_size
    hi = settings.max if settings.max is not None else obs.max_size
    floor: int | None = None
    window_name: str | None = None
    for window in settings.schedules:
        if window_is_open(window, now):
            window_name = window.name
            lo = window.min if window.min is not None else lo
            hi = window.max if window.max is not None else hi
            floor = window.desired
            break
    lo = min(max(lo, obs.min_size), obs.max_size)
    hi = max(min(hi, obs.max_size), lo)
    if floor is not None:
        floor = min(max(floor, lo), hi)
    return Bounds(min=lo, max=hi, floor=floor, window=window_name)


def cooldown_left(direction: Direction, state: GroupState, settings: GroupSettings, now: datetime) -> timedelta:
    """Scale-out waits for the last scale-out; scale-in waits for any last change."""
    if direction is Direction.OUT:
        marks = [(state.last_scale_out_at, settings.scale_out_cooldown_s)]
    else:
        marks = [
            (state.last_scale_in_at, settings.scale_in_cooldown_s),
            (state.last_scale_out_at, settings.scale_in_cooldown_s),
        ]
    left = timedelta(0)
    for at, seconds in marks:
        if at is not None:
            left = max(left, at + timedelta(seconds=seconds) - now)
    return left


class VictimChoice(Frozen):
    """Instances chosen for scale-in and the ones passed over, counted by reason."""

    victims: tuple[str, ...]
    eligible: int
    skipped: dict[SkipReason, int] = Field(default_factory=dict)
    idle: IdleThreshold

    @property
    def note(self) -> str:
        text = f"{self.eligible} idle (<= {self.idle.gpu_utilization:g}% util, <= {self.idle.memory_percent:g}% mem)"
        passed = [f"{n} {reason}" for reason, n in self.skipped.items() if n]
        return text + ("; passed over " + ", ".join(passed) if passed else "")


def skip_reason(inst: InstanceObservation, idle: IdleThreshold) -> SkipReason | None:
    """Why an instance may not be removed, or None when every GPU on it is idle. Unknown is busy."""
    if not inst.in_service:
        return SkipReason.NOT_IN_SERVICE
    if inst.protected_from_scale_in:
        return SkipReason.PROTECTED
    if inst.runs_work:  # a pod loading weights or waiting on data reads idle; it still holds its GPUs
        return SkipReason.RUNS_WORK
    if inst.gpu_utilization is None or inst.gpu_memory_percent is None:
        return SkipReason.NO_METRICS
    if inst.gpu_utilization <= idle.gpu_utilization and inst.gpu_memory_percent <= idle.memory_percent:
        return None
    return SkipReason.BUSY


def choose_scale_in_victims(
    instances: Iterable[InstanceObservation], count: int, idle: IdleThreshold, closed_only: bool = False
) -> VictimChoice:
    """Pick up to `count` instances whose GPUs are all idle, the idlest first. Never an instance with
    busy GPUs, with scale-in protection, not InService, or without metrics; with consolidation by
    attrition (`closed_only`), never one gpufleet has not closed to new work first, so no work can land
    on a node between the idle reading and its removal."""
    eligible: list[InstanceObservation] = []
    skipped: Counter[SkipReason] = Counter()
    for inst in instances:
        reason = skip_reason(inst, idle)
        if reason is None and closed_only and inst.mark is not NodeMark.GPUFLEET:
            reason = SkipReason.NOT_DRAINED
        if reason is None:
            eligible.append(inst)
        else:
            skipped[reason] += 1
    eligible.sort(key=lambda i: (i.gpu_utilization or 0.0, i.gpu_memory_percent or 0.0, i.instance_id))
    victims = tuple(i.instance_id for i in eligible[: max(count, 0)])
    ordered = {r: skipped[r] for r in SkipReason if skipped[r]}
    return VictimChoice(victims=victims, eligible=len(eligible), skipped=ordered, idle=idle)


@dataclass(frozen=True)
class _Group:
    """One group as every rule sees it: built once per decision by `group_rule`, from the four arguments every
    `decide_*` takes; `on` adds the event being answered."""

    obs: GroupObservation
    settings: GroupSettings
    state: GroupState
    now: datetime

    def replacing(self) -> list[str]:
        """Nodes EC2 is about to interrupt, still running, whose replacement gpufleet launched early: the
        group's spare node is spoken for until they go (then the replacement is given back if idle)."""
        running = {i.instance_id for i in self.obs.instances if i.in_service}
        return sorted(
            iid
            for ledger, owed in self.state.owed.items()
            if owed > 0 and ledger.startswith(INTERRUPTED) and (iid := ledger.removeprefix(INTERRUPTED)) in running
        )

    def on_the_way(self, d: Demand) -> int:
        """Nodes that will take waiting work without a launch: instances still Pending and those asked for but
        not listed yet; within the warm-up, for a source that cannot tell which nodes work (Kubernetes
        offers idle nodes as `free_gpus`), also the last scale-out's (InService, not polling yet)."""
        listed = self.obs.instances
        coming = sum(1 for i in listed if i.lifecycle_state.startswith("Pending")) + len(d.not_ready)
        coming += max(0, self.obs.desired - sum(1 for i in listed if not i.lifecycle_state.startswith("Terminat")))
        last, removed = self.state.last_scale_out_at, self.state.last_scale_in_at
        if d.knows_nodes or last is None or (self.now - last).total_seconds() >= self.settings.warmup_s:
            return coming
        if removed is not None and removed >= last:  # a scale-in since: the estimate no longer holds
            return coming
        return max(coming, min(self.state.last_scale_out_added, len(listed)))

    def marks_resting(self) -> str | None:
        """Why node marks are not tried this tick: they failed less than MARKS_REST_S ago."""
        failed = self.state.marks_failed_at
        if failed is None or (self.now - failed).total_seconds() >= defaults.MARKS_REST_S:
            return None
        return f"node marks failed at {failed:%H:%M} UTC (tried again after {defaults.MARKS_REST_S // 60} min)"

    def booting(self) -> int:
        """Nodes asked for but not serving yet - not InService, or InService without GPU metrics when
        those were read - counted only within the warm-up after gpufleet's last scale-out (after it, a
        node that never came is spot_watch's business, not capacity on the way)."""
        last = self.state.last_scale_out_at
        if last is None or (self.now - last).total_seconds() >= self.settings.warmup_s:
            return 0
        serving = [i for i in self.obs.instances if i.in_service]
        if self.obs.instance_metrics_loaded:
            serving = [i for i in serving if i.gpu_utilization is not None]
        return max(0, self.obs.desired - len(serving))

    def on(self, event_id: str, global_dry_run: bool) -> _Ctx:
        """The context for deciding on this group for one event: its id and the dry run (the group's own
        or everyone's) go on every decision."""
        return _Ctx(self.obs, self.settings, self.state, self.now, event_id, global_dry_run or self.settings.dry_run)

    def owned(self, decision: Decision) -> Decision:
        """A change gpufleet may not make on this group becomes advice: held, saying what it would do.
        Reopening nodes gpufleet itself closed goes ahead: it changes no size, and a cordon left behind
        would strand waiting work."""
        settings, state, now = self.settings, self.state, self.now
        if not (decision.changes_capacity or decision.drain):
            return decision
        if settings.owner is Owner.EXTERNAL:
            why = "owner: external - another autoscaler sizes this group"
        elif state.stand_aside_until is not None and now < state.stand_aside_until:
            why = f"standing aside until {state.stand_aside_until:%H:%M} UTC: another actor keeps sizing this group"
        else:
            return decision
        parts = [f"{decision.action} {decision.current} -> {decision.desired}"] if decision.changes_capacity else []
        parts += [f"drain {len(decision.drain)} node(s)"] if decision.drain else []
        would = ", ".join(parts)
        return decision.model_copy(
            update={
                "action": Action.HOLD,
                "desired": decision.current,
                "victims": (),
                "drain": (),  # reopening its own nodes changes no size: it goes ahead
                "reason": f"advice only ({why}): would {would}; {decision.reason}",
            }
        )


@dataclass(frozen=True)
class _Ctx(_Group):
    """What every rule needs to build a decision for one group and one event, and the rules themselves.

    Long because each rule (bounds, steps, cooldowns, demand, gangs, release) is a method over the same
    context: the decision builder, the bounds and the low water mark; split, each part takes it all back.
    """

    event_id: str
    dry_run: bool

    @cached_property
    def bounds(self) -> Bounds:
        return effective_bounds(self.obs, self.settings, self.now)

    def decision(
        self, action: Action, trigger: Trigger, reason: str, desired: int | None = None, **kw: object
    ) -> Decision:
        return Decision(
            group=self.obs.ref.key,
            action=action,
            current=self.obs.desired,
            desired=self.obs.desired if desired is None else desired,
            reason=reason,
            trigger=trigger,
            event_id=self.event_id,
            at=self.now,
            bounds=self.bounds,
            dry_run=self.dry_run,
            **kw,
        )

    def cooling(self, direction: Direction, trigger: Trigger, why: str) -> Decision | None:
        left = cooldown_left(direction, self.state, self.settings, self.now)
        if left > timedelta(0):
            return self.decision(
                Action.HOLD, trigger, f"{why}, but scale-{direction} cooldown has {int(left.total_seconds())}s left"
            )
        return None

    def scale_out_to(self, target: int, trigger: Trigger, why: str, step: str = "") -> Decision:
        b, current = self.bounds, self.obs.desired
        if current >= b.max:
            return self.decision(Action.HOLD, trigger, f"{why}, but already at max {b.max}")
        target = min(target, b.max)
        capped = " (capped at max)" if target == b.max else ""
        return self.decision(Action.SCALE_OUT, trigger, f"{why}: scale out {current} -> {target}{step}{capped}", target)

    @property
    def low_water(self) -> int:
        """No scale-in goes below this: min, an open window's desired, or the nodes that running work of
        the group's source holds (a queue's in-flight messages: their runners may read idle)."""
        return max(self.bounds.min, self.bounds.floor or 0, self.held)

    @property
    def closed_only(self) -> bool:
        """Consolidation by attrition: a node goes only once gpufleet closed it (fail closed: a group whose
        nodes cannot be marked now removes none, and the decision says why)."""
        return self.settings.consolidate is Consolidation.ATTRITION

    @property
    def held(self) -> int:
        d = self.obs.demand
        return d.held_nodes if d is not None and d.known else 0

    def scale_in_by(self, count: int, trigger: Trigger, why: str) -> Decision:
        """Remove up to `count` idle instances, never below min or an open window's desired."""
        b, current, low_water = self.bounds, self.obs.desired, self.low_water
        closed = self.obs.scale_in_closed or (
            self.obs.demand.closed_for_scale_in if self.obs.demand is not None else None
        )
        if closed is not None:  # fail closed: a node that may run work is never a victim
            return self.decision(Action.HOLD, trigger, f"{why}, but no node may be removed: {closed}")
        if current <= low_water:
            what = f"schedule '{b.window}' desired {b.floor}" if b.floor and b.floor > b.min else f"min {b.min}"
            if self.held > max(b.min, b.floor or 0):
                what = (
                    f"the {self.held} node(s) running work holds ({self.obs.demand.source if self.obs.demand else ''})"
                )
            return self.decision(Action.HOLD, trigger, f"{why}, but already at {what}")
        room = min(count, current - low_water)
        if not self.obs.instance_metrics_loaded:
            reason = f"{why}: scale in up to {room}; choosing idle instances"
            return self.decision(Action.SCALE_IN, trigger, reason, needs_instance_metrics=True)
        choice = choose_scale_in_victims(self.obs.instances, room, self.settings.idle, self.closed_only)
        if not choice.victims:
            reason = f"{why}, but no instance is idle: {choice.note}"
            return self.decision(Action.HOLD, trigger, reason, skipped=choice.skipped)
        target = current - len(choice.victims)
        reason = f"{why}: scale in {current} -> {target}, terminating {', '.join(choice.victims)} ({choice.note})"
        return self.decision(Action.SCALE_IN, trigger, reason, target, victims=choice.victims, skipped=choice.skipped)

    def step(self, direction: Direction, trigger: Trigger, why: str) -> Decision:
        """One policy step in `direction`, honouring bounds, cooldowns and (for scale-in) victims. A
        scale-out step counts the nodes still booting from the last one as already added."""
        held = self.cooling(direction, trigger, why)
        if held is not None:
            return held
        s, current = self.settings, self.obs.desired
        if direction is Direction.OUT:
            size, booting = s.scale_out_step.size(current), self.booting()
            if booting >= size:
                since = f"{self.state.last_scale_out_at:%H:%M}" if self.state.last_scale_out_at else "?"
                reason = (
                    f"{why}, but {booting} node(s) from the scale-out at {since} are still booting "
                    f"(warm-up {s.warmup_s}s): capacity on the way"
                )
                return self.decision(Action.HOLD, trigger, reason)
            on_way = f", {booting} already booting" if booting else ""
            return self.scale_out_to(current + size - booting, trigger, why, f" (step {s.scale_out_step}{on_way})")
        waiting = self.waiting_hold(trigger, why)
        if waiting is not None:
            return waiting
        size, replacing = s.scale_in_step.size(current), self.replacing()
        if replacing and size <= len(replacing):
            reason = (
                f"{why}, but {len(replacing)} node(s) launched to replace {', '.join(replacing)} before EC2 "
                "reclaims it: that capacity is spoken for"
            )
            return self.decision(Action.HOLD, trigger, reason)
        return self.scale_in_by(size - len(replacing), trigger, why)

    def waiting_hold(self, trigger: Trigger, why: str) -> Decision | None:
        """No scale-in while work waits for this group: the nodes would be asked for again at once."""
        d = self.obs.demand
        if d is None or not d.known or not d.waiting:
            return None
        return self.decision(Action.HOLD, trigger, f"{why}, but {describe_waiting(d.waiting, self.now, d.noun)}")

    def demand_out(self) -> Decision | None:
        """Work that waits, packed onto the group's node shape (existing room first, then nodes booting,
        then new nodes): one scale-out to the size it needs, within bounds. A gang's nodes come in that one
        change or not at all (`scaling.gangs`). No cooldown: nodes already on the way are counted, so a
        second tick asks only for what is still missing."""
        d = self.obs.demand
        if d is None or not d.known or not d.waiting:
            return None
        trigger = Trigger(kind=TriggerKind.DEMAND, name=d.source)
        what = describe_waiting(d.waiting, self.now, d.noun)
        rest = gangs.resting(self.state, self.now)
        items = [w for w in d.waiting if not (rest and w.gang)]
        if not items:
            why = f"a partial gang launch was given back: gangs are asked for again from {rest:%H:%M} UTC"
            return self.decision(Action.HOLD, trigger, f"{what}, but {why}")
        booting = self.on_the_way(d)
        per_node = f"{gpus_text(d.gpus_per_node)} per node"
        room = max(0, self.bounds.max - self.obs.desired)
        p = gangs.plan(items, d.gpus_per_node, d.free_gpus, booting, room)
        if p.unplaceable == sum(waiting_sizes(items, d.gpus_per_node).values()):
            return self.decision(Action.HOLD, trigger, f"{what}, but none fits a node of this group ({per_node})")
        refused = "; ".join(r.text(room) for r in p.refused[:2]) + (" (and more gangs)" if len(p.refused) > 2 else "")
        if p.new_nodes > 0:
            on_way = f", {booting} already booting" if booting else ""
            step = f" ({per_node}{on_way})" + (f"; {refused}" if refused else "")
            return self.scale_out_to(self.obs.desired + p.new_nodes, trigger, what, step)
        if refused:
            return self.decision(Action.HOLD, trigger, f"{what}, but {refused}")
        if p.capped:
            return self.scale_out_to(self.obs.desired + 1, trigger, what)  # at max: says so
        room_text = f"{booting} node(s) booting" if booting else "room on the group's nodes"
        doubt = f" (no node may be removed: {d.scale_in_closed})" if d.scale_in_closed else ""
        return self.decision(Action.HOLD, trigger, f"{what}: {room_text} will take them, no new node needed{doubt}")

    def gang_give_back(self) -> Decision | None:
        """A gang waits while nodes asked for it have not launched for GANG_LAUNCH_TIMEOUT_S: the nodes
        that came and sit idle go back and the launches still owed are cancelled (desired down to what
        the group holds), so a gang that cannot start bills nothing; gangs then rest GANG_REST_S."""
        part = gangs.partial_launch(self.obs, self.state, self.now)
        if part is None or gangs.resting(self.state, self.now) is not None:
            return None
        trigger = Trigger(kind=TriggerKind.GANG_PARTIAL, name=part.gang)
        minutes = defaults.GANG_LAUNCH_TIMEOUT_S // 60
        why = (
            f"gang {part.gang} cannot start: {part.missing} node(s) asked at {part.asked_at:%H:%M} UTC have not "
            f"launched in {minutes} min"
            if part.missing
            else f"gang {part.gang} has not started {2 * minutes} min after its nodes were asked, with room for it on"
            " the group's nodes: something other than nodes holds it (its queue's limits?)"
        )
        free = [i for i in self.obs.instances if i.in_service and not i.runs_work]
        if free and not self.obs.instance_metrics_loaded:
            return self.decision(Action.SCALE_IN, trigger, f"{why}: choosing idle nodes", needs_instance_metrics=True)
        listed = self.obs.desired - part.missing
        room = max(0, listed - self.low_water)
        # Not only nodes gpufleet closed (consolidation by attrition): those a partial gang launched never ran
        # its work; one that took other work since holds GPUs (runs_work) and is never a victim.
        choice = choose_scale_in_victims(self.obs.instances, room, self.settings.idle, closed_only=False)
        victims = choice.victims if room else ()
        target = max(self.low_water, listed - len(victims))
        if target >= self.obs.desired:
            return None
        reason = (
            f"{why}: scale in {self.obs.desired} -> {target}, giving back {len(victims)} idle node(s)"
            + (f" and the {part.missing} never launched" if part.missing else "")
            + f"; gangs are asked for again after {defaults.GANG_REST_S // 60} min"
        )
        return self.decision(Action.SCALE_IN, trigger, reason, target, victims=victims, skipped=choice.skipped)

    def demand_release(self) -> Decision | None:
        """Nothing waits: every idle node above min (or a window's desired) and above the nodes running
        work holds goes in one change, to 0 if min is 0, whatever the utilization band's switch. A source
        that cannot say which nodes run work keeps every node (fail closed) and says so."""
        d = self.obs.demand
        if d is None or not d.known or d.waiting:
            return None
        keep = self.low_water
        if self.obs.desired <= keep:
            return None
        room = self.obs.desired - keep
        trigger = Trigger(kind=TriggerKind.DEMAND, name=d.source)
        held = f", {d.held_nodes} node(s) held by running {d.noun}s" if d.held_nodes else ""
        if d.scale_in_closed is not None:
            reason = f"no {d.noun}s waiting ({d.source}){held}, but no node may be removed: {d.scale_in_closed}"
            return self.decision(Action.HOLD, trigger, reason)
        if not self.obs.instance_metrics_loaded:
            # Kubernetes names the nodes without work: if one is free, read the metrics to confirm it idle.
            # A queue or a metric names none: read them whenever nodes above what running work holds exist.
            free = [i for i in self.obs.instances if i.in_service and not i.runs_work]
            if not free:
                return None
            spare = f"{len(free)} node(s) without work" if d.knows_nodes else f"{room} node(s) not held by work"
            reason = f"no {d.noun}s waiting ({d.source}){held}, {spare}: choosing idle instances"
            return self.decision(Action.SCALE_IN, trigger, reason, needs_instance_metrics=True)
        choice = choose_scale_in_victims(self.obs.instances, room, self.settings.idle, self.closed_only)
        if not choice.victims:
            return None
        why = f"no {d.noun}s waiting ({d.source}){held}: {len(choice.victims)} idle node(s) not needed"
        return self.cooling(Direction.IN, trigger, why) or self.scale_in_by(room, trigger, why)

    def bounds_fix(self) -> Decision | None:
        """Desired outside [min, max] or below an open window's desired: put it back inside. Brought down,
        every kind goes by named victims only: launches still owed are cancelled first (a count never
        below the instances the group holds), then idle nodes are removed by name, at most down to max; a
        lower count would let the provider choose which nodes go, busy ones included. Nodes that run work
        are held, and said with the numbers (`held_busy`: told once), until their work ends."""
        fix = out_of_bounds(self.bounds, self.obs.desired)
        if fix is None:
            return None
        target, trigger, reason = fix
        if target >= self.obs.desired:
            return self.decision(Action.SET_DESIRED, trigger, reason, target)
        live = live_instances(self.obs)
        if live < self.obs.desired and not self.obs.shrinks_by_victims_only:  # launches still owed go first
            to = max(target, live)
            said = f"desired {self.obs.desired} is above max {target} ({trigger.name})"
            why = f"{said}: {self.obs.desired - to} launch(es) still owed cancelled, {self.obs.desired} -> {to}"
            return self.decision(Action.SET_DESIRED, trigger, why, to)
        why = f"desired {self.obs.desired} is above max {target} ({trigger.name})"
        decision = held_floor(self.scale_in_by(self.obs.desired - target, trigger, why), self.obs)  # never AWS's pick
        held = max(0, decision.desired - target) if decision.action is Action.SCALE_IN else self.obs.desired - target
        if held == 0 or decision.needs_instance_metrics:
            return decision
        busy = f"max {target}, {held} node(s) above it run work: holding them; they go as their work ends"
        return decision.model_copy(update={"reason": f"{decision.reason}; {busy}", "held_busy": held})


def out_of_bounds(b: Bounds, current: int) -> tuple[int, Trigger, str] | None:
    """(target, trigger, reason) when `current` is outside the effective bounds, else None. The reason
    names the bound crossed and what picked the target: an open window's desired can lift it above min."""
    where = f"schedule '{b.window}'" if b.window else "policy bounds"
    trigger = Trigger(kind=TriggerKind.BOUNDS, name=where)
    if current < b.min:
        target = max(b.min, b.floor or 0)
        to = f"the window's desired {target}" if target > b.min else f"min {b.min}"
        return target, trigger, f"desired {current} is below min {b.min} ({where}): raised to {to}"
    if current > b.max:
        return b.max, trigger, f"desired {current} is above max {b.max} ({where}): lowered to max {b.max}"
    if b.floor is not None and current < b.floor:
        reason = f"schedule '{b.window}' wants at least {b.floor} (now {current}): raised to {b.floor}"
        return b.floor, Trigger(kind=TriggerKind.SCHEDULE, name=b.window or ""), reason
    return None


# ---- ownership: who sizes the group ----


def foreign_change(obs: GroupObservation, state: GroupState, now: datetime) -> ForeignChange | None:
    """Desired capacity moved since gpufleet last looked or last changed it: someone else moved it."""
    if state.seen_desired is None or obs.desired == state.seen_desired:
        return None
    return ForeignChange(at=now, before=state.seen_desired, after=obs.desired)


def fight_reason(state: GroupState, now: datetime) -> str | None:
    """Why gpufleet must stand aside, if it must: repeated changes it did not make within the window
    while it changed the group too (one foreign change is an operator's fix, not a fight)."""
    window = timedelta(seconds=defaults.FIGHT_WINDOW_S)
    recent = [c for c in state.foreign if now - c.at <= window]
    ours = [t for t in (state.last_scale_out_at, state.last_scale_in_at) if t is not None and now - t <= window]
    if len(recent) < defaults.FIGHT_FOREIGN_CHANGES or not ours:
        return None
    moves = ", ".join(f"{c.before} -> {c.after} at {c.at:%H:%M}" for c in recent)
    return (
        f"desired capacity changed {len(recent)} times in {defaults.FIGHT_WINDOW_S // 60} min by something other "
        f"than gpufleet ({moves}) while gpufleet also changed it (last at {max(ours):%H:%M})"
    )


P = ParamSpec("P")


def group_rule(
    decide: Callable[Concatenate[_Group, P], Decision],
) -> Callable[Concatenate[GroupObservation, GroupSettings, GroupState, datetime, P], Decision]:
    """A `decide_*` function from its rule: the rule gets the group built once from the four arguments every
    decision takes (observation, settings, state, now), and what it decides goes through the group's
    ownership - advice only for `owner: external` and while standing aside from a fight; bounds, cooldowns
    and victims are decided exactly as they would be."""

    @wraps(decide)
    def decide_on(
        obs: GroupObservation, settings: GroupSettings, state: GroupState, now: datetime, /, *a: P.args, **kw: P.kwargs
    ) -> Decision:
        group = _Group(obs, settings, state, now)
        return _told_unfit(group.owned(decide(group, *a, **kw)), obs)

    return decide_on


def _told_unfit(decision: Decision, obs: GroupObservation) -> Decision:
    """Work of the group's source that fits no group asks for nothing: the decision says so (and
    `gpufleet explain` shows it), the first two sets with their numbers."""
    unfit = obs.demand.unfit if obs.demand is not None else ()
    if not unfit:
        return decision
    more = f" (and {len(unfit) - 2} more sets)" if len(unfit) > 2 else ""
    said = "; ".join(u.text for u in unfit[:2])
    return decision.model_copy(update={"reason": f"{decision.reason}; not asked for: {said}{more}"})


def alarm_hold_reason(alarm: AlarmEvent) -> str | None:
    """Why an alarm must not act at all: not in ALARM, or CloudWatch suppressed or muted its actions
    (then the alarm-action and SNS paths would be silent too, so the EventBridge path holds as well)."""
    if alarm.state is not AlarmState.ALARM:
        return f"alarm {alarm.alarm_name} is {alarm.state}: scaling alarms act only in ALARM"
    if alarm.actions_suppressed_by:
        return f"alarm {alarm.alarm_name} is in ALARM but its actions are suppressed ({alarm.actions_suppressed_by})"
    if alarm.muted_by:
        return f"alarm {alarm.alarm_name} is in ALARM but muted by {alarm.muted_by}"
    return None


@group_rule
def decide_alarm(
    group: _Group, /, *, alarm: AlarmEvent, direction: Direction, global_dry_run: bool = False
) -> Decision:
    """An alarm changed state (delivered by EventBridge, the alarm action or SNS)."""
    ctx = group.on(alarm.event_id, global_dry_run)
    trigger = Trigger(kind=TriggerKind.ALARM, name=alarm.alarm_name)
    held = alarm_hold_reason(alarm)
    if held is not None:
        return ctx.decision(Action.HOLD, trigger, held)
    return ctx.bounds_fix() or ctx.step(direction, trigger, f"alarm {alarm.alarm_name} in ALARM")


@group_rule
def decide_request(
    group: _Group,
    /,
    *,
    event_id: str,
    direction: Direction,
    trigger: Trigger,
    why: str,
    global_dry_run: bool = False,
) -> Decision:
    """Another controller (the OOM guard) asks for a step: the same bounds, windows and cooldowns apply."""
    ctx = group.on(event_id, global_dry_run)
    return ctx.bounds_fix() or ctx.step(direction, trigger, why)


@group_rule
def decide_target(
    group: _Group,
    /,
    *,
    event_id: str,
    target: int,
    trigger: Trigger,
    why: str,
    global_dry_run: bool = False,
) -> Decision:
    """Another controller wants the group at `target` desired (the spot fallback raising or handing
    back on-demand capacity): clamped into the same effective bounds the scaler uses, waiting for the
    same cooldowns, and lowered only by removing idle instances."""
    ctx = group.on(event_id, global_dry_run)
    fix = ctx.bounds_fix()
    if fix is not None:
        return fix
    current = ctx.obs.desired
    if target == current:
        return ctx.decision(Action.HOLD, trigger, f"{why}: already at {current}")
    direction = Direction.OUT if target > current else Direction.IN
    held = ctx.cooling(direction, trigger, why)
    if held is not None:
        return held
    if direction is Direction.OUT:
        return ctx.scale_out_to(target, trigger, why)
    return ctx.scale_in_by(current - target, trigger, why)


@group_rule
def decide_replacement(
    group: _Group,
    /,
    *,
    event_id: str,
    instance_id: str,
    direction: Direction,
    why: str,
    global_dry_run: bool = False,
) -> Decision:
    """A replacement for a spot node about to be interrupted: one node launched before it goes (OUT),
    and given back once it is gone (IN: an idle node only). Not a change of the group's size, so no
    cooldown applies; bounds and windows do, and the group's ledger `interrupted:<id>` counts it."""
    ctx, obs = group.on(event_id, global_dry_run), group.obs
    trigger = Trigger(kind=TriggerKind.INTERRUPTION, name=instance_id)
    owed = {"owed_to": f"{INTERRUPTED}{instance_id}"}
    fix = ctx.bounds_fix()
    if fix is not None:
        return fix
    if direction is Direction.OUT:
        if obs.desired >= ctx.bounds.max:
            reason = f"{why}, but already at max {ctx.bounds.max}: Auto Scaling replaces it once it is gone"
            return ctx.decision(Action.HOLD, trigger, reason)
        target = obs.desired + 1
        reason = f"{why}: launch its replacement now, {obs.desired} -> {target}"
        return ctx.decision(Action.SCALE_OUT, trigger, reason, target, **owed)
    low_water = ctx.low_water
    doomed = next((i for i in obs.instances if i.instance_id == instance_id), None)
    if doomed is not None and doomed.in_service and doomed.healthy:
        return ctx.decision(Action.HOLD, trigger, f"{why}, but {instance_id} is still running")
    if obs.desired <= low_water:
        return ctx.decision(Action.HOLD, trigger, f"{why}, but already at {low_water}: nothing to give back")
    if doomed is not None and doomed.in_service:  # reclaimed (Unhealthy), not replaced yet: take it out ourselves
        reason = (
            f"{why}: EC2 reclaimed {instance_id}; remove it and lower desired {obs.desired} -> {obs.desired - 1} "
            "so Auto Scaling does not replace it a second time"
        )
        return ctx.decision(Action.SCALE_IN, trigger, reason, obs.desired - 1, victims=(instance_id,), **owed)
    staying = [
        i for i in obs.instances if i.instance_id != instance_id and not i.lifecycle_state.startswith("Terminat")
    ]
    if len(staying) < obs.desired and not obs.shrinks_by_victims_only:  # gone, not replaced: just lower desired
        reason = f"{why}: {instance_id} is gone, its replacement is in; desired {obs.desired} -> {obs.desired - 1}"
        return ctx.decision(Action.SET_DESIRED, trigger, reason, obs.desired - 1, **owed)
    decision = ctx.scale_in_by(1, trigger, f"{why} (Auto Scaling replaced it too)")
    return decision.model_copy(update=owed) if decision.action is Action.SCALE_IN else decision


@group_rule
def decide_reconcile(
    group: _Group,
    /,
    *,
    event_id: str,
    firing_alarms: Iterable[tuple[str, Direction]] = (),
    global_dry_run: bool = False,
) -> Decision:
    """One group at a reconcile tick: the nodes to close or reopen (consolidation by attrition, reopened
    before anything is launched), then bounds and windows, then work waiting for it (its demand source),
    then alarms still firing, then (nothing waiting) idle nodes released, then the GPU utilization band. A
    scale-out signal wins over any scale-in signal in the same tick."""
    ctx = group.on(event_id, global_dry_run)
    d = group.obs.demand
    booting = ctx.on_the_way(d) if d is not None and d.known else 0
    plan = plan_marks(group.obs, group.settings, ctx.low_water, booting, group.marks_resting())
    if plan.empty:
        return _reconcile(ctx, firing_alarms)
    return plan.attached(_reconcile(replace(ctx, obs=plan.observed(group.obs, ctx.dry_run)), firing_alarms))


def _reconcile(ctx: _Ctx, firing_alarms: Iterable[tuple[str, Direction]]) -> Decision:
    fix = ctx.bounds_fix() or ctx.gang_give_back() or ctx.demand_out()
    if fix is not None:
        return fix
    alarms = sorted(firing_alarms)
    outs = [name for name, d in alarms if d is Direction.OUT]
    ins = [name for name, d in alarms if d is Direction.IN]
    band, util = ctx.settings.target, ctx.obs.gpu_utilization
    band_rule = Trigger(kind=TriggerKind.UTILIZATION_BAND)
    if outs:
        return ctx.step(Direction.OUT, Trigger(kind=TriggerKind.ALARM, name=outs[0]), f"alarm {outs[0]} still in ALARM")
    demand = ctx.obs.demand
    if band.enabled and util is not None and util > band.high:
        why = f"GPU utilization {util:.1f}% is above the band's high {band.high:g}%"
        if demand is None or not demand.known:
            return ctx.step(Direction.OUT, band_rule, why)
        # A demand source says what waits, and nothing does: busy nodes alone are no reason for more.
        return ctx.decision(Action.HOLD, band_rule, f"{why}, but no {demand.noun}s wait ({demand.source})")
    if ins:
        return ctx.step(Direction.IN, Trigger(kind=TriggerKind.ALARM, name=ins[0]), f"alarm {ins[0]} still in ALARM")
    release = ctx.demand_release()
    if release is not None:
        return release
    if band.enabled and util is not None and util < band.low:
        return ctx.step(Direction.IN, band_rule, f"GPU utilization {util:.1f}% is below the band's low {band.low:g}%")
    if not band.enabled:
        why = "the utilization band is off (target.enabled: false) and no alarm is firing"
    elif util is None:
        why = "no GPU utilization data in the lookback window"
    else:
        why = f"GPU utilization {util:.0f}% is inside the band {band.low:g}-{band.high:g}%"
    return ctx.decision(Action.HOLD, band_rule, why)
