"""Failed launches over time: back off like Cluster Autoscaler, remember unavailable offerings like
Karpenter, and plan an on-demand fallback and its gradual return. Pure: no boto3, no clock.

The fallback group's change itself is decided by `scaling.core.decide_target`: the same effective
bounds (policy and schedule windows clamped into the group's own), the same cooldowns and the same
idle-only victim choice as every other change, so the scaler and the fallback never fight.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import Field

from gpufleet.capacity.classify import FailureClass, LaunchFailure
from gpufleet.domain.models import Decision, Frozen, GroupObservation, GroupState, Trigger, TriggerKind
from gpufleet.policy.capacity import PriceTable, SpotPolicy, SpotSettings
from gpufleet.policy.fleet import GroupSettings
from gpufleet.scaling.core import decide_target

MAX_SEEN = 500


class SpotState(Frozen):
    version: int = 0
    seen: tuple[str, ...] = ()  # activity ids already counted (event + sweep dedup), bounded
    streak_started_at: datetime | None = None  # first spot-capacity failure of the current streak
    last_failure_at: datetime | None = None
    backoff_level: int = 0
    backoff_until: datetime | None = None
    unavailable: dict[str, datetime] = Field(default_factory=dict)  # offering -> until
    fallback_added: int = 0  # instances we added to the fallback group and still owe back
    notified_classes: tuple[FailureClass, ...] = ()  # failure classes already told in the current streak


def fold_failures(
    state: SpotState, failures: list[LaunchFailure], now: datetime, p: SpotPolicy
) -> tuple[SpotState, list[LaunchFailure]]:
    """New failures only (dedup by activity id) folded into the group's state: backoff (5 min doubling to
    30, reset after 3 h quiet), the unavailable-offerings cache, the streak."""
    new = [f for f in sorted(failures, key=lambda f: f.at) if f.activity_id not in state.seen]
    seen = (*state.seen, *(f.activity_id for f in new))[-MAX_SEEN:]
    level, until, streak, last = (
        state.backoff_level,
        state.backoff_until,
        state.streak_started_at,
        state.last_failure_at,
    )
    if last is not None and now - last >= timedelta(seconds=p.backoff_reset_s):
        level, streak = 0, None
    unavailable = {k: v for k, v in state.unavailable.items() if v > now}
    for f in new:
        level = level + 1
        delay = min(p.backoff_max_s, p.backoff_initial_s * 2 ** (level - 1))
        until = f.at + timedelta(seconds=delay)
        last = max(last, f.at) if last else f.at
        if f.failure_class in (FailureClass.SPOT_CAPACITY, FailureClass.ON_DEMAND_CAPACITY):
            unavailable[f.offering] = f.at + timedelta(seconds=p.unavailable_ttl_s)
        if f.failure_class.falls_back and streak is None:
            streak = f.at
    update = {"seen": seen, "backoff_level": level, "backoff_until": until, "streak_started_at": streak}
    return state.model_copy(update={**update, "last_failure_at": last, "unavailable": unavailable}), new


class FallbackPlan(Frozen):
    """What the fallback group should hold for a spot group: its desired capacity if spot's shortfall
    were covered (before bounds and cooldowns, which `decide_target` applies) and why."""

    spot_group: str
    fallback_group: str | None
    unfulfilled: int
    owed_before: int
    fallback_desired: int | None
    reason: str


def _wanted(
    state: SpotState,
    unfulfilled: int,
    spot_trouble: bool,
    blocking: list[LaunchFailure],
    waited: bool,
    wait_s: int,
    now: datetime,
) -> tuple[int, str]:
    """How many on-demand instances spot's shortfall calls for, and why."""
    owed = state.fallback_added
    if owed:  # already fallen back: follow the gap; it shrinks only as spot instances come into service
        want = unfulfilled if spot_trouble else min(owed, unfulfilled)
        if want < owed:
            return want, f"spot delivering again: hand back {owed - want} of {owed}"
        if want > owed:
            return want, f"spot still failing: fallback {owed} -> {want}"
        return want, f"fallback holds {want} while spot is {unfulfilled} short"
    if blocking and not spot_trouble:
        return 0, f"{blocking[-1].failure_class} failure: no fallback (on-demand would fail the same way)"
    if not spot_trouble or unfulfilled == 0:
        return 0, "spot is delivering: no fallback needed"
    if not waited:
        started = state.streak_started_at or now
        left = int((started + timedelta(seconds=wait_s) - now).total_seconds())
        return 0, f"spot capacity failing; fallback in {left}s"
    return unfulfilled, f"spot capacity failing for {wait_s // 60}+ min: raise by {unfulfilled}"


def plan_fallback(
    spot: GroupObservation,
    fallback: GroupObservation | None,
    settings: SpotSettings,
    state: SpotState,
    recent: list[LaunchFailure],
    now: datetime,
    owed: int | None = None,
) -> FallbackPlan:
    """Raise the on-demand group by what spot cannot deliver (desired - in service) after a bounded wait
    of spot-capacity failures; hand it back as spot instances come into service. Never for quota, subnet
    or configuration failures (on-demand would fail the same way). `owed`: the fallback group's ledger
    for this spot group (what was really added and not yet handed back); default the spot state's copy."""
    owed = state.fallback_added if owed is None else owed
    state = state.model_copy(update={"fallback_added": owed})
    unfulfilled = max(0, spot.desired - spot.in_service)
    base = {"spot_group": spot.ref.key, "unfulfilled": unfulfilled, "owed_before": owed}
    if settings.fallback is None or fallback is None:
        return FallbackPlan(**base, fallback_group=None, fallback_desired=None, reason="no fallback configured")
    wait_s = settings.fallback.wait_minutes * 60
    # Auto Scaling backs off between attempts, so a tick without a new failure is not a recovery: the
    # streak lasts while spot is short of what was asked for.
    ongoing = state.streak_started_at is not None and unfulfilled > 0
    spot_trouble = bool([f for f in recent if f.failure_class.falls_back]) or ongoing
    blocking = [f for f in recent if not f.failure_class.falls_back]
    waited = state.streak_started_at is not None and now - state.streak_started_at >= timedelta(seconds=wait_s)
    want, reason = _wanted(state, unfulfilled, spot_trouble, blocking, waited, wait_s, now)
    desired = max(0, fallback.desired - state.fallback_added + want)
    return FallbackPlan(**base, fallback_group=settings.fallback.group, fallback_desired=desired, reason=reason)


def fallback_change(
    plan: FallbackPlan,
    fallback: GroupObservation,
    settings: GroupSettings,
    state: GroupState,
    now: datetime,
    *,
    event_id: str,
    global_dry_run: bool,
) -> Decision | None:
    """The fallback group's decision for the plan (None when it already holds what the plan wants)."""
    if plan.fallback_desired is None or plan.fallback_desired == fallback.desired:
        return None
    decision = decide_target(
        fallback,
        settings,
        state,
        now,
        event_id=event_id,
        target=plan.fallback_desired,
        trigger=Trigger(kind=TriggerKind.SPOT_FALLBACK, name=plan.spot_group),
        why=f"{plan.reason} ({plan.fallback_group})",
        global_dry_run=global_dry_run,
    )
    if decision.trigger.kind is not TriggerKind.SPOT_FALLBACK:  # a bounds fix is not a fallback move
        return decision
    return decision.model_copy(update={"owed_to": plan.spot_group})  # the commit counts it in the ledger


def owed_after(owed_before: int, acted: Decision | None) -> int:
    """Instances still owed back to spot after the fallback group's change (what was really done)."""
    if acted is None or not acted.outcome.acted:
        return owed_before
    return max(0, owed_before + acted.desired - acted.current)


def hourly_cost_difference(instance_type: str | None, instances: int, prices: PriceTable) -> float | None:
    if not instance_type or instance_type not in prices.on_demand or instance_type not in prices.spot:
        return None
    return instances * (prices.on_demand[instance_type] - prices.spot[instance_type])
