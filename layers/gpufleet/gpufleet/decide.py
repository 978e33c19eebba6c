"""The pure decision core: observations + policy + `now` in, decisions with reasons out.

Nothing here imports boto3, reads the clock or the environment; the controller feeds it and acts on
what it returns. Invariant (property-tested): a decision's desired capacity is always inside the
effective [min, max], and it only leaves the current capacity where a rule says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

from gpufleet.fleet_policy import GroupSettings, IdleThreshold, ScheduleWindow
from gpufleet.models import (
    Action,
    AlarmState,
    Bounds,
    Decision,
    Direction,
    GroupObservation,
    GroupState,
    InstanceObservation,
)


def window_is_open(window: ScheduleWindow, now: datetime) -> bool:
    """True if the latest cron firing (in the window's time zone) plus its duration covers now."""
    local_now = now.astimezone(ZoneInfo(window.timezone))
    # croniter steps back from "now + 1 minute" so a firing at exactly `now` counts as open.
    start = croniter(window.cron, local_now + timedelta(minutes=1)).get_prev(datetime)
    return start <= local_now < start + timedelta(minutes=window.duration_minutes)


def effective_bounds(obs: GroupObservation, settings: GroupSettings, now: datetime) -> Bounds:
    """Policy bounds (or an open window's) clamped into the group's own min/max."""
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


def choose_scale_in_victims(
    instances: Iterable[InstanceObservation], count: int, idle: IdleThreshold
) -> tuple[list[str], str]:
    """Pick up to `count` instances whose GPUs are all idle, the idlest first.

    Never an instance with busy GPUs, with scale-in protection, not InService, or without metrics
    (unknown is treated as busy). Returns the victims and a sentence on who was passed over.
    """
    eligible: list[InstanceObservation] = []
    busy = protected = unknown = other = 0
    for inst in instances:
        if inst.lifecycle_state != "InService":
            other += 1
        elif inst.protected_from_scale_in:
            protected += 1
        elif inst.gpu_utilization is None or inst.gpu_memory_percent is None:
            unknown += 1
        elif inst.gpu_utilization <= idle.gpu_utilization and inst.gpu_memory_percent <= idle.memory_percent:
            eligible.append(inst)
        else:
            busy += 1
    eligible.sort(key=lambda i: (i.gpu_utilization or 0.0, i.gpu_memory_percent or 0.0, i.instance_id))
    victims = [i.instance_id for i in eligible[: max(count, 0)]]
    skipped = [
        f"{n} {what}"
        for n, what in (
            (busy, "busy"),
            (protected, "scale-in protected"),
            (unknown, "without GPU metrics"),
            (other, "not InService"),
        )
        if n
    ]
    note = f"{len(eligible)} idle (<= {idle.gpu_utilization:g}% util, <= {idle.memory_percent:g}% mem)"
    if skipped:
        note += "; passed over " + ", ".join(skipped)
    return victims, note


class _Ctx:
    """What every rule needs to build a decision for one group."""

    def __init__(
        self,
        obs: GroupObservation,
        settings: GroupSettings,
        state: GroupState,
        now: datetime,
        event_id: str,
        global_dry_run: bool,
    ) -> None:
        self.obs = obs
        self.settings = settings
        self.state = state
        self.now = now
        self.event_id = event_id
        self.bounds = effective_bounds(obs, settings, now)
        self.dry_run = global_dry_run or settings.dry_run

    def decision(
        self,
        action: Action,
        trigger: str,
        reason: str,
        desired: int | None = None,
        victims: tuple[str, ...] = (),
        needs_instance_metrics: bool = False,
    ) -> Decision:
        return Decision(
            group=self.obs.ref.key,
            action=action,
            current=self.obs.desired,
            desired=self.obs.desired if desired is None else desired,
            victims=victims,
            needs_instance_metrics=needs_instance_metrics,
            reason=reason,
            trigger=trigger,
            event_id=self.event_id,
            at=self.now,
            bounds=self.bounds,
            dry_run=self.dry_run,
        )

    def scale(self, direction: Direction, trigger: str, why: str) -> Decision:
        """Move one step in `direction`, honouring bounds, cooldowns and (for scale-in) victims."""
        obs, b, s = self.obs, self.bounds, self.settings
        current = obs.desired
        left = cooldown_left(direction, self.state, s, self.now)
        if left > timedelta(0):
            return self.decision(
                Action.HOLD,
                trigger,
                f"{why}, but scale-{direction} cooldown has {int(left.total_seconds())}s left",
            )
        if direction is Direction.OUT:
            if current >= b.max:
                return self.decision(Action.HOLD, trigger, f"{why}, but already at max {b.max}")
            target = min(current + s.scale_out_step.size(current), b.max)
            capped = " (capped at max)" if target == b.max else ""
            return self.decision(
                Action.SCALE_OUT,
                trigger,
                f"{why}: scale out {current} -> {target} (step {s.scale_out_step}){capped}",
                desired=target,
            )
        low_water = max(b.min, b.floor or 0)
        if current <= low_water:
            what = f"schedule '{b.window}' desired {b.floor}" if b.floor and b.floor > b.min else f"min {b.min}"
            return self.decision(Action.HOLD, trigger, f"{why}, but already at {what}")
        room = min(s.scale_in_step.size(current), current - low_water)
        if not obs.instance_metrics_loaded:
            return self.decision(
                Action.SCALE_IN,
                trigger,
                f"{why}: scale in up to {room}; choosing idle instances",
                desired=current,
                needs_instance_metrics=True,
            )
        victims, note = choose_scale_in_victims(obs.instances, room, s.idle)
        if not victims:
            return self.decision(Action.HOLD, trigger, f"{why}, but no instance is idle: {note}")
        target = current - len(victims)
        return self.decision(
            Action.SCALE_IN,
            trigger,
            f"{why}: scale in {current} -> {target}, terminating {', '.join(victims)} ({note})",
            desired=target,
            victims=tuple(victims),
        )

    def bounds_fix(self) -> Decision | None:
        """Desired outside [min, max] or below an open window's desired: put it back inside."""
        b, current = self.bounds, self.obs.desired
        where = f"schedule '{b.window}'" if b.window else "policy bounds"
        if current < b.min:
            target = max(b.min, b.floor or 0)
            return self.decision(
                Action.SET_DESIRED, f"bounds:{where}", f"desired {current} is below min {b.min} ({where})", target
            )
        if current > b.max:
            return self.decision(
                Action.SET_DESIRED, f"bounds:{where}", f"desired {current} is above max {b.max} ({where})", b.max
            )
        if b.floor is not None and current < b.floor:
            return self.decision(
                Action.SET_DESIRED,
                f"schedule:{b.window}",
                f"schedule '{b.window}' wants at least {b.floor} (now {current})",
                b.floor,
            )
        return None


def decide_alarm(
    obs: GroupObservation,
    settings: GroupSettings,
    state: GroupState,
    now: datetime,
    *,
    event_id: str,
    alarm_name: str,
    alarm_state: AlarmState,
    direction: Direction,
    global_dry_run: bool = False,
) -> Decision:
    """An alarm changed state (or is still in ALARM at a reconcile tick)."""
    ctx = _Ctx(obs, settings, state, now, event_id, global_dry_run)
    trigger = f"alarm:{alarm_name}"
    if alarm_state is not AlarmState.ALARM:
        return ctx.decision(
            Action.HOLD, trigger, f"alarm {alarm_name} is {alarm_state}: scale-{direction} alarms act only in ALARM"
        )
    return decide_request(
        obs,
        settings,
        state,
        now,
        event_id=event_id,
        direction=direction,
        trigger=trigger,
        why=f"alarm {alarm_name} in ALARM",
        global_dry_run=global_dry_run,
    )


def decide_request(
    obs: GroupObservation,
    settings: GroupSettings,
    state: GroupState,
    now: datetime,
    *,
    event_id: str,
    direction: Direction,
    trigger: str,
    why: str,
    global_dry_run: bool = False,
) -> Decision:
    """Another controller (the OOM guard) asks for a step: the same bounds, windows and cooldowns apply."""
    ctx = _Ctx(obs, settings, state, now, event_id, global_dry_run)
    fix = ctx.bounds_fix()
    if fix is not None:
        return fix
    return ctx.scale(direction, trigger, why)


def decide_reconcile(
    obs: GroupObservation,
    settings: GroupSettings,
    state: GroupState,
    now: datetime,
    *,
    event_id: str,
    firing_alarms: Iterable[tuple[str, Direction]] = (),
    global_dry_run: bool = False,
) -> Decision:
    """One group at a reconcile tick: bounds and windows, then alarms still firing, then the GPU
    target band. A scale-out signal wins over any scale-in signal in the same tick."""
    ctx = _Ctx(obs, settings, state, now, event_id, global_dry_run)
    fix = ctx.bounds_fix()
    if fix is not None:
        return fix
    alarms = sorted(firing_alarms)
    outs = [name for name, d in alarms if d is Direction.OUT]
    ins = [name for name, d in alarms if d is Direction.IN]
    band = settings.target
    util = obs.gpu_utilization
    if outs:
        return ctx.scale(Direction.OUT, f"alarm:{outs[0]}", f"alarm {outs[0]} still in ALARM")
    if band.enabled and util is not None and util > band.high:
        return ctx.scale(
            Direction.OUT, "target-tracking", f"GPU utilization {util:.1f}% is above the band's high {band.high:g}%"
        )
    if ins:
        return ctx.scale(Direction.IN, f"alarm:{ins[0]}", f"alarm {ins[0]} still in ALARM")
    if band.enabled and util is not None and util < band.low:
        return ctx.scale(
            Direction.IN, "target-tracking", f"GPU utilization {util:.1f}% is below the band's low {band.low:g}%"
        )
    if not band.enabled:
        why = "target tracking is off and no alarm is firing"
    elif util is None:
        why = "no GPU utilization data in the lookback window"
    else:
        why = f"GPU utilization {util:.0f}% is inside the band {band.low:g}-{band.high:g}%"
    return ctx.decision(Action.HOLD, "target-tracking", why)
