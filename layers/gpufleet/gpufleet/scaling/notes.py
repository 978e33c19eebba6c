"""What the scaler tells on-call (pure): changes, would-be changes (dry-run), failures, an alarm back to
OK closing the group's capacity incident, and standing aside from a group another actor keeps sizing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpufleet.domain.models import Action, AlarmState, Decision, GroupObservation, GroupState, Outcome, TriggerKind
from gpufleet.domain.notification import (
    Notification,
    NotificationKind,
    Severity,
    capacity_incident_key,
    console_links,
    note,
)
from gpufleet.events.model import AlarmEvent
from gpufleet.policy.notify import NotificationPolicy
from gpufleet.scaling.metric_trust import Verdict

_SEVERITY = {Outcome.APPLIED: Severity.INFO, Outcome.DRY_RUN: Severity.INFO, Outcome.FAILED: Severity.CRITICAL}
_VERB = {Outcome.APPLIED: "scaled", Outcome.DRY_RUN: "would scale (dry-run)", Outcome.FAILED: "failed to scale"}


def decision_notes(
    decisions: Sequence[Decision], region: str, policy: NotificationPolicy, source: str = "scaler"
) -> list[Notification]:
    """The decisions worth telling: changes, would-be changes (dry-run) and failures (holds only when
    the policy asks for them)."""
    out = [held_busy_note(d, region, source) for d in decisions if d.held_busy and d.outcome is not Outcome.FAILED]
    for d in decisions:
        severity = _SEVERITY.get(d.outcome)
        if severity is None and not (policy.notify_holds and d.action is not Action.HOLD):
            continue
        facts = {"action": str(d.action), "capacity": f"{d.current} -> {d.desired}", "trigger": str(d.trigger)}
        if d.victims:
            facts["instances removed"] = ", ".join(d.victims)
        if d.drain:
            facts["nodes drained (no new work; removed once idle)"] = ", ".join(d.drain)
        if d.undrain:
            facts["nodes reopened"] = ", ".join(d.undrain)
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
                _title(d),
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


def held_busy_note(d: Decision, region: str, source: str = "scaler") -> Notification:
    """Nodes kept above a lowered max because they run work: told once per (group, bound, count held),
    as the same notice every tick repeats it (its id folds the repeats into one)."""
    bound = d.bounds.max if d.bounds is not None else d.desired - d.held_busy
    return note(
        NotificationKind.SCALING,
        Severity.WARNING,
        d.group,
        f"{d.group}: holding {d.held_busy} node(s) above max {bound}: they run work",
        at=d.at,
        source=source,
        id_parts=(d.group, "held-busy", str(bound), str(d.held_busy)),
        reason=d.reason,
        facts={"capacity": f"{d.current} -> {d.desired}", "max": str(bound), "held (running work)": str(d.held_busy)},
        links=console_links(d.group, region, None),
    )


def _title(d: Decision) -> str:
    """'scaled 3 -> 4', or for node marks alone 'drained 2 node(s) and reopened 1 node(s) by attrition'."""
    if d.changes_capacity or not d.changes_marks:
        return f"{d.group}: {_VERB.get(d.outcome, str(d.outcome))} {d.current} -> {d.desired}"
    past = d.outcome is Outcome.APPLIED
    done = [
        f"{past_verb if past else verb} {len(ids)} node(s)"
        for verb, past_verb, ids in (("drain", "drained", d.drain), ("reopen", "reopened", d.undrain))
        if ids
    ]
    lead = {Outcome.DRY_RUN: "would ", Outcome.FAILED: "failed to "}.get(d.outcome, "")
    suffix = " (dry-run)" if d.outcome is Outcome.DRY_RUN else ""
    return f"{d.group}: {lead}{' and '.join(done)}{suffix} by attrition"


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


CANNOT_ACT = "cannot act: the alarm's group is missing, unmanaged or unknown"


def broken_alarm_notes(alarm: AlarmEvent, decisions: Sequence[Decision], region: str) -> list[Notification]:
    """A gpufleet alarm in ALARM whose group does not exist, is not managed or cannot be told: a WARNING,
    one incident per alarm (its notification id is the alarm's and the group's, so every later delivery
    folds into it), closed when the alarm is OK again. A broken alarm never fails silently."""
    if alarm.state is AlarmState.INSUFFICIENT_DATA:
        return []
    out = []
    for d in decisions:
        if d.detail != CANNOT_ACT or (alarm.state is AlarmState.OK and alarm.previous_state is not AlarmState.ALARM):
            continue
        back = alarm.state is AlarmState.OK
        out.append(
            note(
                NotificationKind.CONTROL,
                Severity.INFO if back else Severity.WARNING,
                d.group,
                f"alarm {alarm.alarm_name} is OK again" if back else f"alarm {alarm.alarm_name} cannot scale anything",
                at=d.at,
                source="scaler",
                id_parts=("broken-alarm", alarm.alarm_name, d.group, str(alarm.state)),
                reason=d.reason
                if back
                else f"{d.reason}. Fix the alarm's dimensions or its gpufleet:target tag, "
                "tag the group gpufleet:managed=true, or delete the alarm (gpufleet doctor lists alarms like it).",
                incident_key=f"alarm:{alarm.alarm_name}|cannot-act",
                links=console_links(d.group, region, alarm.alarm_name),
                resolved=back,
            )
        )
    return out


def fight_note(
    obs: GroupObservation, state: GroupState, why: str, activities: Sequence[str], now: datetime, region: str
) -> Notification:
    """gpufleet stands aside from a group another actor keeps sizing: what changed, what Auto Scaling
    says caused it, until when, and how to settle who owns the group."""
    key = obs.ref.key
    until = f"{state.stand_aside_until:%Y-%m-%d %H:%M} UTC" if state.stand_aside_until else "further notice"
    facts = {
        "changes gpufleet did not make": ", ".join(f"{c.before} -> {c.after} at {c.at:%H:%M}" for c in state.foreign),
        "standing aside until": until,
    }
    for i, text in enumerate(activities[:3], 1):
        facts[f"Auto Scaling activity {i}"] = text
    reason = (
        f"{why}. gpufleet stops changing {key} and only advises until {until}. If Cluster Autoscaler, Karpenter, "
        "a target-tracking, step or scheduled policy sizes this group, set `owner: external` for it in the fleet "
        "policy (gpufleet then advises, tells and answers termination requests) or remove the other autoscaler."
    )
    return note(
        NotificationKind.CONTROL,
        Severity.WARNING,
        key,
        f"{key}: another actor keeps changing desired capacity; gpufleet stands aside",
        at=now,
        source="scaler",
        id_parts=("fight", key, f"{state.stand_aside_until}"),
        reason=reason,
        facts=facts,
        incident_key=f"{key}|ownership",
        region=region,
    )


def parked_note(group: str, event_id: str, why: str, at: datetime, region: str) -> Notification:
    """A decision's audit record DynamoDB refused: set aside so it blocks nothing, and told once."""
    return note(
        NotificationKind.CONTROL,
        Severity.WARNING,
        group,
        f"{group}: a decision record could not be stored and was parked",
        at=at,
        source="scaler",
        id_parts=("parked", group, event_id),
        reason=f"DynamoDB refused it: {why}. The change itself stands; other groups and later decisions go on. "
        "The record is kept under PARKED# in the state table (gpufleet explain shows the rest).",
        incident_key=f"{group}|parked",
        region=region,
    )


def invalid_policy_note(
    problems: Sequence[str], source: str, saved_at: str, bad_digest: str, now: datetime, service: str
) -> Notification:
    """The fleet policy was edited into something invalid: gpufleet keeps running on the last good one
    (changes in the edit are not in force) until it is fixed."""
    shown = list(problems[:3]) + ([f"and {len(problems) - 3} more"] if len(problems) > 3 else [])
    return note(
        NotificationKind.CONTROL,
        Severity.CRITICAL,
        "policy",
        f"fleet policy in {source} is invalid: running on the last good one (saved {saved_at})",
        at=now,
        source=service,
        id_parts=("policy-invalid", bad_digest),
        reason="; ".join(shown) + ". Fix it (gpufleet validate-policy) and put it again; until then the edit is "
        "not in force.",
        facts={"policy": source, "last good saved at": saved_at},
        incident_key="policy|invalid",
        links=(),
    )


def demand_notes(observations: Sequence[GroupObservation], now: datetime, region: str) -> list[Notification]:
    """What the demand path must tell, once each (the notification id is the finding's, so every later
    tick's copy is the same notification): work that fits no group, with the numbers, queued jobs that do
    not count (waiting for quota, an admission check) or a queueing system that cannot be read, and nodes
    that never became GPU-ready (an incident per instance)."""
    found: dict[str, tuple[NotificationKind, str, str, str, dict[str, str], str]] = {}
    for obs in observations:
        d = obs.demand
        if d is None:
            continue
        for u in d.unfit:
            title = f"{u.count} {_plural(u.count, 'pod')} fit no group ({d.source}): nothing launched"
            facts = {"source": d.source, "waiting": str(u.count)}
            found.setdefault(f"unfit/{u.key}", (NotificationKind.SCALING, obs.ref.key, title, u.text, facts, "unfit"))
        for u in d.queue_notes:  # queued jobs seen and not counted (quota, admission checks), systems unreadable
            title = f"queued jobs not counted as demand ({d.source})"
            facts = {"source": d.source, "jobs": str(u.count)}
            found.setdefault(f"queued/{u.key}", (NotificationKind.SCALING, obs.ref.key, title, u.text, facts, "queued"))
        for n in d.never_ready:
            title = f"{obs.ref.key}: {n.instance_id} never became GPU-ready"
            facts = {"instance": n.instance_id}
            found.setdefault(n.key, (NotificationKind.GPU_HEALTH, obs.ref.key, title, n.text, facts, "gpu-ready"))
    return [
        note(
            kind,
            Severity.WARNING,
            group,
            title,
            at=now,
            source="scaler",
            id_parts=(what, key),
            reason=text,
            facts=facts,
            incident_key=key,
            links=console_links(group, region),
        )
        for key, (kind, group, title, text, facts, what) in found.items()
    ]


def _plural(n: int, noun: str) -> str:
    return noun if n == 1 else f"{noun}s"


def forged_series_note(group: str, verdict: Verdict, at: datetime, event_id: str, region: str) -> Notification:
    """A GPU series that would have driven a group's scaling holds what no member could publish (a
    member's own series over its bounds, values outside 0-100): a node wrote on another's series
    (docs/scaler.md, "Forged metrics"); or it cannot be checked at all (GPUs unknown, the read failed).
    Told with the numbers and what the scaler used instead, or that it held; one incident per group, so
    every tick that sees it again folds into it. A group series over its current members' bound alone
    (a member just left) is not told: `Verdict.tell`."""
    held = verdict.held is not None
    facts = {"seen": "; ".join(d for d in verdict.dropped if d)[:900] or "-", "used": verdict.source}
    if verdict.utilization is not None:
        facts["utilization used"] = f"{verdict.utilization:.1f}%"
    title = "GPU metrics hold data no member could publish" if verdict.forged else "GPU metrics cannot be checked"
    hint = (
        "Any node may write the GPUFleet namespace: look for a node writing other groups' series."
        if verdict.forged
        else "Scaling on this group's GPU series waits until they can be checked."
    )
    return note(
        NotificationKind.CONTROL,
        Severity.WARNING,
        group,
        f"{group}: {title}" + (": scaling held" if held else ""),
        at=at,
        source="scaler",
        id_parts=("forged-series", event_id, group),
        reason=f"{verdict.held or f'decided on {verdict.source} instead'}. {hint}",
        facts=facts,
        incident_key=f"forged-series:{group}",
        links=console_links(group, region, None),
    )


def _kept_nodes_note(
    key: str, group: str, instances: Sequence[str], kept: str, reason: str, shown: str, at: datetime, region: str
) -> Notification:
    """A group's nodes kept from scale-in by something on-call should look at: one incident per group
    (`key`), one notification per set of nodes (a stable id folds every later tick into it)."""
    return note(
        NotificationKind.CONTROL,
        Severity.WARNING,
        group,
        f"{group}: {len(instances)} node(s) {kept}, kept",
        at=at,
        source="scaler",
        id_parts=(key, group, *sorted(instances)),
        reason=reason,
        facts={"instances": shown or "-"},
        incident_key=f"{key}:{group}",
        links=console_links(group, region, None),
    )


def unexplained_protection_note(group: str, instances: Sequence[str], at: datetime, region: str) -> Notification:
    """Scale-in protection that gpufleet did not set and no busy mark explains: the nodes are kept (never
    removed: someone protected them for a reason gpufleet cannot see), and told once per group and set of
    nodes. Nodes cannot set protection any more (their role lacks SetInstanceProtection), so this is a
    principal with Auto Scaling rights: your own tooling, a person, or a forger keeping nodes (money)."""
    shown = ", ".join(instances[:20]) + (f" (+{len(instances) - 20} more)" if len(instances) > 20 else "")
    reason = (
        "Protection gpufleet did not set and no busy mark (gpufleet-node busy) explains keeps these nodes "
        "from every scale-in. If no tool of yours protects them, look in CloudTrail for "
        "SetInstanceProtection calls; clear it with `aws autoscaling set-instance-protection "
        "--no-protected-from-scale-in`."
    )
    kept = "scale-in protected by someone else"
    return _kept_nodes_note("unexplained-protection", group, instances, kept, reason, shown, at, region)


def busy_marks_failed_note(why: str, at: datetime, region: str) -> Notification:
    """The busy marks could not be kept as scale-in protection (the table or Auto Scaling refused): the
    scaler still never removes a marked node, but Auto Scaling's own scale-in (a lower max, a native
    policy) may choose one. One incident, folded per cause."""
    return note(
        NotificationKind.CONTROL,
        Severity.WARNING,
        "busy-marks",
        "busy marks are not kept as scale-in protection",
        at=at,
        source="scaler",
        id_parts=("busy-marks-failed", why),
        reason=f"{why}. The scaler removes no marked node and, if it cannot read the marks, no node of an ASG-backed "
        "group; Auto Scaling's own scale-in is not stopped for them until this is fixed.",
        incident_key="busy-marks-failed",
        region=region,
    )


def stale_mark_note(group: str, instances: Sequence[str], at: datetime, region: str) -> Notification:
    """Busy marks older than a day (their `since`): still obeyed (a job may run for days), told once per
    group and set of nodes, because a helper killed with SIGKILL or a reboot leaves its mark behind and
    would keep an idle node for good."""
    reason = (
        "A busy mark (gpufleet-node busy) keeps its node from every scale-in. If no job runs there any more "
        "(its helper was killed, the node rebooted), delete its item from the table gpufleet-busy: its key "
        "is ROLEID:INSTANCE (`aws dynamodb scan --table-name gpufleet-busy` lists them)."
    )
    shown = ", ".join(instances[:20])
    return _kept_nodes_note(
        "stale-busy-mark", group, instances, "marked busy for over a day", reason, shown, at, region
    )
