"""What the scaler tells on-call (pure): changes, would-be changes (dry-run), failures, and an alarm
back to OK closing the group's capacity incident."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.domain.models import Action, AlarmState, Decision, Outcome, TriggerKind
from gpufleet.events.model import AlarmEvent
from gpufleet.notify.model import Notification, NotificationKind, Severity, capacity_incident_key, console_links, note
from gpufleet.notify.policy import NotificationPolicy

_SEVERITY = {Outcome.APPLIED: Severity.INFO, Outcome.DRY_RUN: Severity.INFO, Outcome.FAILED: Severity.CRITICAL}
_VERB = {Outcome.APPLIED: "scaled", Outcome.DRY_RUN: "would scale (dry-run)", Outcome.FAILED: "failed to scale"}


def decision_notes(
    decisions: Sequence[Decision], region: str, policy: NotificationPolicy, source: str = "scaler"
) -> list[Notification]:
    """The decisions worth telling: changes, would-be changes (dry-run) and failures (holds only when
    the policy asks for them)."""
    out = []
    for d in decisions:
        severity = _SEVERITY.get(d.outcome)
        if severity is None and not (policy.notify_holds and d.action is not Action.HOLD):
            continue
        facts = {"action": str(d.action), "capacity": f"{d.current} -> {d.desired}", "trigger": str(d.trigger)}
        if d.victims:
            facts["instances removed"] = ", ".join(d.victims)
        if d.bounds is not None:
            facts["bounds"] = f"min {d.bounds.min} / max {d.bounds.max}"
        if d.detail:
            facts["detail"] = d.detail
        alarm = d.trigger.name if d.trigger.kind is TriggerKind.ALARM else None
        out.append(
            note(
                NotificationKind.SCALING,
                severity or Severity.INFO,
                d.group,
                f"{d.group}: {_VERB.get(d.outcome, str(d.outcome))} {d.current} -> {d.desired}",
                at=d.at,
                source=source,
                id_parts=(d.event_id, d.group, str(d.action), str(d.outcome)),
                reason=d.reason,
                facts=facts,
                links=console_links(d.group, region, alarm),
                incident_key=capacity_incident_key(d.owed_to or d.group),  # a fallback move is its spot group's story
            )
        )
    return out


def alarm_resolved_notes(alarm: AlarmEvent, decisions: Sequence[Decision], region: str) -> list[Notification]:
    """The alarm that drove a group's scaling is back to OK: close its capacity incident."""
    if alarm.state is not AlarmState.OK or alarm.previous_state is not AlarmState.ALARM:
        return []
    return [
        note(
            NotificationKind.SCALING,
            Severity.INFO,
            d.group,
            f"{d.group}: {alarm.alarm_name} is OK again",
            at=d.at,
            source="scaler",
            id_parts=(alarm.event_id, d.group, "resolved"),
            reason=f"alarm {alarm.alarm_name} returned to OK",
            links=console_links(d.group, region, alarm.alarm_name),
            resolved=True,
        )
        for d in decisions
    ]
