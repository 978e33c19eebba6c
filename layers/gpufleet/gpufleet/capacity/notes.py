"""What spot_watch tells on-call (pure): one note per new failure class in a streak, the fallback's
moves with their cost, and the recovery - all in the group's capacity incident."""

from __future__ import annotations

from datetime import datetime

from gpufleet.capacity.classify import FailureClass, LaunchFailure
from gpufleet.capacity.core import SpotState, hourly_cost_difference
from gpufleet.capacity.policy import PriceTable
from gpufleet.domain.models import Decision, GroupObservation
from gpufleet.notify.model import Notification, NotificationKind, Severity, note

SOURCE = "spot_watch"


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
    delta = acted.desired - acted.current
    facts = {
        "fallback group": acted.group,
        "capacity": f"{acted.current} -> {acted.desired}",
        "owed back to spot": str(owed),
        "outcome": str(acted.outcome),
    }
    cost = hourly_cost_difference(instance_type, abs(delta), prices)
    if cost is not None:
        facts["cost"] = f"{'+' if delta > 0 else '-'}${cost:.2f}/h vs spot ({instance_type})"
    verb = "fell back to on-demand" if delta > 0 else "handing capacity back to spot"
    title = f"{verb}: {acted.group} {acted.current} -> {acted.desired}"
    return tell(title, facts, reason, Severity.WARNING, f"fallback-{acted.desired}")


def recovered_note(tell: _Teller) -> Notification:
    facts = {"in service": f"{tell.obs.in_service} of {tell.obs.desired} desired"}
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
    if fallback is not None and fallback[0].outcome.acted:
        itype = next((f.instance_type for f in new if f.instance_type), None) or (obs.instance_types or (None,))[0]
        out.append(fallback_note(tell, fallback[0], after.fallback_added, fallback[1], itype, prices))
    if streak_over and after.fallback_added == 0 and before.streak_started_at is not None:
        out.append(recovered_note(tell))
    return out
