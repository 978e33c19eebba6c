"""What spot_watch tells on-call (pure): one note per new failure class in a streak, the fallback's
moves with their cost, and the recovery - all in the group's capacity incident; spot interruptions and
rebalance recommendations with what ran on the node; Capacity Blocks ending, with the nodes they carry."""

from __future__ import annotations

from datetime import datetime, timedelta

from gpufleet.capacity.classify import FailureClass, LaunchFailure
from gpufleet.capacity.core import SpotState, hourly_cost_difference
from gpufleet.domain import defaults
from gpufleet.domain.models import Decision, GroupObservation
from gpufleet.domain.notification import Notification, NotificationKind, Severity, note
from gpufleet.events.model import CapacityBlockEvent, EventKind, InstanceWarning
from gpufleet.policy.capacity import PriceTable

SOURCE = "spot_watch"
TERMINATE_BEFORE_END = timedelta(minutes=30)  # EC2 starts terminating a Capacity Block's instances then


class _Teller:
    """Builds the group's notes with what they all share (group, time, event, region)."""

    def __init__(self, obs: GroupObservation, now: datetime, event_id: str, region: str) -> None:
        self.obs, self.now, self.event_id, self.region = obs, now, event_id, region

    def __call__(
        self, title: str, facts: dict[str, str], reason: str, severity: Severity, what: str, resolved: bool = False
    ) -> Notification:
        key = self.obs.ref.key
        return note(
            NotificationKind.SPOT,
            severity,
            key,
            f"{key}: {title}",
            at=self.now,
            source=SOURCE,
            id_parts=(self.event_id, key, "spot", what),
            reason=reason,
            facts=facts,
            resolved=resolved,
            region=self.region,
        )


def failure_notes(tell: _Teller, before: SpotState, after: SpotState, new: list[LaunchFailure]) -> list[Notification]:
    """One note per failure class not yet told in this streak: spot trouble is a WARNING (the fallback
    covers it), a quota, subnet or configuration failure is CRITICAL (someone has to fix it)."""
    by_class: dict[FailureClass, list[LaunchFailure]] = {}
    for f in new:
        by_class.setdefault(f.failure_class, []).append(f)
    out = []
    obs = tell.obs
    for cls, fs in by_class.items():
        if cls in before.notified_classes:
            continue
        facts = {
            "class": str(cls),
            "failed launches": str(len(fs)),
            "type/AZ/capacity": ", ".join(sorted({f.offering for f in fs})),
            "in service": f"{obs.in_service} of {obs.desired} desired",
            "next retry (backoff)": f"{after.backoff_until:%H:%M:%S} UTC" if after.backoff_until else "-",
            "fix": fs[-1].hint,
        }
        severity = Severity.CRITICAL if cls.needs_a_fix else Severity.WARNING
        out.append(tell(f"{len(fs)} launch(es) failed: {cls}", facts, fs[-1].message, severity, str(cls)))
    return out


def fallback_note(
    tell: _Teller, acted: Decision, owed: int, reason: str, instance_type: str | None, prices: PriceTable
) -> Notification:
    """The fallback group's move, with the ledger as it stands after it (`owed`). A hand-back tells the
    decision's own reason: it removes idle nodes only, so it may give back fewer than the plan asked."""
    delta = acted.desired - acted.current
    facts = {
        "fallback group": acted.group,
        "capacity": f"{acted.current} -> {acted.desired}",
        "owed back to spot": f"{owed} (all handed back)" if delta < 0 and owed == 0 else str(owed),
        "outcome": str(acted.outcome),
    }
    cost = hourly_cost_difference(instance_type, abs(delta), prices)
    if cost is not None:
        facts["cost"] = f"{'+' if delta > 0 else '-'}${cost:.2f}/h vs spot ({instance_type})"
    verb = "fell back to on-demand" if delta > 0 else "handing capacity back to spot"
    title = f"{verb}: {acted.group} {acted.current} -> {acted.desired}"
    return tell(title, facts, reason if delta > 0 else acted.reason, Severity.WARNING, f"fallback-{acted.desired}")


def recovered_note(tell: _Teller, handed_back: Decision | None = None) -> Notification:
    """The streak is over: the resolving message states the ledger now (nothing owed), and the fallback
    group's size after a hand-back in the same pass, so no earlier note's facts stand for the present."""
    facts = {"in service": f"{tell.obs.in_service} of {tell.obs.desired} desired", "owed back to spot": "0"}
    if handed_back is not None:
        facts["fallback group"] = f"{handed_back.group} at {handed_back.desired} (was {handed_back.current})"
    reason = "spot launches succeed again and nothing is owed to the fallback group"
    return tell("launches recovered, capacity back on spot", facts, reason, Severity.INFO, "recovered", resolved=True)


def spot_notes(
    obs: GroupObservation,
    before: SpotState,
    after: SpotState,
    new: list[LaunchFailure],
    fallback: tuple[Decision, str] | None,
    streak_over: bool,
    prices: PriceTable,
    *,
    now: datetime,
    event_id: str,
    region: str,
) -> list[Notification]:
    """Everything one spot_watch pass tells about one group, in the order it happened."""
    tell = _Teller(obs, now, event_id, region)
    out = failure_notes(tell, before, after, new)
    moved = fallback[0] if fallback is not None and fallback[0].outcome.acted else None
    if fallback is not None and moved is not None:
        itype = next((f.instance_type for f in new if f.instance_type), None) or (obs.instance_types or (None,))[0]
        out.append(fallback_note(tell, moved, after.fallback_added, fallback[1], itype, prices))
    if streak_over and after.fallback_added == 0 and before.streak_started_at is not None:
        out.append(recovered_note(tell, moved if moved is not None and moved.desired < moved.current else None))
    return out


# ---- capacity going away: interruptions, rebalance recommendations, Capacity Blocks ----


def gpu_activity(gpu: tuple[float | None, float | None]) -> tuple[str, bool]:
    """What the node's GPUs were doing (busiest GPU, fullest memory over the lookback) and whether busy."""
    util, mem = gpu
    if util is None or mem is None:
        return "no GPU metrics (treated as busy)", True
    busy = util > defaults.DEFAULT_IDLE_GPU_UTILIZATION or mem > defaults.DEFAULT_IDLE_GPU_MEMORY_PERCENT
    return f"{'busy' if busy else 'idle'}: GPU {util:.0f}% util, {mem:.0f}% memory", busy


def warning_note(
    obs: GroupObservation,
    warning: InstanceWarning,
    gpu: tuple[float | None, float | None],
    replacement: str,
    *,
    region: str,
) -> Notification:
    """A spot node about to go (or at risk), in the group's capacity incident, with what ran there."""
    key, iid = obs.ref.key, warning.instance_id
    activity, busy = gpu_activity(gpu)
    if warning.kind is EventKind.SPOT_INTERRUPTION:
        title = f"{key}: spot interruption in 2 min: {iid} ({activity.split(':')[0]})"
        reason = f"EC2 reclaims {iid} in about two minutes ({warning.action or 'terminate'}); jobs on it stop then"
        severity = Severity.WARNING if busy else Severity.INFO
    else:
        title = f"{key}: rebalance recommendation: {iid} at elevated risk of interruption"
        reason = f"EC2 expects {iid} may be interrupted soon; an interruption warning (2 min) may follow, or not"
        severity = Severity.INFO
    facts = {"instance": iid, "GPUs": activity, "replacement": replacement}
    return note(
        NotificationKind.INTERRUPTION,
        severity,
        key,
        title,
        at=warning.at,
        source=SOURCE,
        id_parts=(str(warning.kind), iid),
        reason=reason,
        facts=facts,
        region=region,
    )


def handback_note(obs: GroupObservation, acted: Decision, instance_id: str, *, region: str) -> Notification:
    key = obs.ref.key
    return note(
        NotificationKind.INTERRUPTION,
        Severity.INFO,
        key,
        f"{key}: {instance_id} is gone; its early replacement stays, desired {acted.current} -> {acted.desired}",
        at=acted.at,
        source=SOURCE,
        id_parts=("handback", instance_id),
        reason=acted.reason,
        facts={
            "instance": instance_id,
            "capacity": f"{acted.current} -> {acted.desired}",
            "outcome": str(acted.outcome),
        },
        region=region,
    )


def capacity_block_note(
    block: CapacityBlockEvent, affected: dict[str, dict[str, tuple[float | None, float | None]]], *, region: str
) -> Notification:
    """A Capacity Block delivered or ending, naming the managed groups and nodes it carries and which of
    them are busy (EC2 terminates them 30 minutes before the end date)."""
    first = next(iter(affected))
    busy_nodes = [iid for nodes in affected.values() for iid, gpu in nodes.items() if gpu_activity(gpu)[1]]
    count = sum(len(nodes) for nodes in affected.values())
    facts = {
        group: f"{len(nodes)} node(s): " + ", ".join(f"{iid} {gpu_activity(gpu)[0]}" for iid, gpu in nodes.items())
        for group, nodes in affected.items()
    }
    if block.end is not None:
        facts["ends"] = f"{block.end:%Y-%m-%d %H:%M} UTC"
    if block.phase == "expiring":
        stop = f"{block.end - TERMINATE_BEFORE_END:%H:%M} UTC" if block.end else "in about 10 minutes"
        facts["instances terminate from"] = stop
        title = f"Capacity Block {block.reservation_id} ends: {count} node(s), {len(busy_nodes)} busy"
        reason = (
            f"EC2 terminates the instances in Capacity Block {block.reservation_id} 30 minutes before it ends "
            f"(from {stop}); checkpoint or drain the busy nodes ({', '.join(busy_nodes) or 'none'}) now"
        )
        severity = Severity.CRITICAL if busy_nodes else Severity.WARNING
    else:
        title = f"Capacity Block {block.reservation_id} delivered: {count} node(s) can launch into it"
        reason = f"Capacity Block {block.reservation_id} is active" + (
            f" until {facts['ends']}" if "ends" in facts else ""
        )
        severity = Severity.INFO
    return note(
        NotificationKind.RESERVATION,
        severity,
        first,
        title,
        at=block.at,
        source=SOURCE,
        id_parts=("capacity-block", block.reservation_id, block.phase),
        reason=reason,
        facts=facts,
        incident_key=f"{block.reservation_id}|capacity-block",
        region=region,
    )
