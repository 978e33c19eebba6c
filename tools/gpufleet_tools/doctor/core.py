"""`gpufleet doctor`'s rules (pure): a policy checked against what an account holds, before it is trusted
with a fleet. Each finding says what is wrong, where, and what to do; the exit code follows the worst one.

Checks: the policy's static mistakes (`domain.policy_checks`); named groups that do not exist; groups a
rule selects that lack the managed tag (gpufleet would not change them, and IAM would deny it); policy or
schedule bounds outside the group's own; spot and fallback groups missing or untagged; another
autoscaler on a group gpufleet owns (native scaling policies, Cluster Autoscaler tags on a plain ASG);
scaling alarms that resolve to no group or direction, that point at a group gpufleet does not manage, or
that read a managed group's metrics without the policy's alarm prefix (the EventBridge rule never sees
them); managed groups no alarm points at; notification routes that lead nowhere; each group's demand
source - the cluster (exists, reachable, an access entry with AmazonEKSViewPolicy), the queue, the backlog
metric (a datum lately).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from enum import StrEnum

from gpufleet.domain import defaults
from gpufleet.domain.models import AlarmState, Frozen, GroupKind, GroupObservation, GroupRef, MetricRef
from gpufleet.domain.policy import FleetPolicy, GroupSettings, Owner
from gpufleet.domain.policy_checks import policy_problems
from gpufleet.events.model import AlarmEvent, AlarmSource
from gpufleet.scaling.targets import resolve_alarm_target
from gpufleet_node import schema


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    ERROR = "error"


class Finding(Frozen):
    level: Level
    subject: str  # the group, alarm, rule or route it is about
    text: str


class AlarmView(Frozen):
    name: str
    tags: dict[str, str] = {}
    metrics: tuple[MetricRef, ...] = ()
    composite: bool = False


class Presence(StrEnum):
    NOT_CONFIGURED = "not configured"
    MISSING = "missing"
    PRESENT = "present"


class DemandView(Frozen):
    """What doctor found of one managed group's demand source: `problem` (the scaler cannot read it: an
    error), `doubt` (it may not: a warning), else `found` (what checked out)."""

    group: str
    source: str
    problem: str | None = None
    doubt: str | None = None
    found: str = ""


class AccountView(Frozen):
    """What doctor read: every ASG (EKS backing ones included) and node group, the native scaling policies
    of the ASGs, the alarms, whether the notification targets exist, and the demand sources."""

    groups: tuple[GroupObservation, ...] = ()
    scaling_policies: dict[str, tuple[str, ...]] = {}  # ASG name -> its scaling policies' names
    alarms: tuple[AlarmView, ...] = ()
    slack_secret: Presence = Presence.NOT_CONFIGURED
    topic: Presence = Presence.NOT_CONFIGURED
    demand: tuple[DemandView, ...] = ()


def worst(findings: list[Finding]) -> Level:
    levels = {f.level for f in findings}
    return Level.ERROR if Level.ERROR in levels else Level.WARNING if Level.WARNING in levels else Level.OK


def diagnose(policy: FleetPolicy, view: AccountView) -> list[Finding]:
    """Every finding, errors and warnings first within each check, then what checked out."""
    found = [Finding(level=Level.ERROR, subject="policy", text=p) for p in policy_problems(policy)]
    groups = [g for g in view.groups if not _is_backing_asg(g)]
    by_ref = {g.ref: g for g in groups}
    managed = [(g, s) for g in groups if (s := policy.settings_for(g.ref, g.tags)) is not None]
    found += list(_named_groups(policy, by_ref))
    for obs, settings in managed:
        found += list(_group_findings(obs, settings, view, policy))
    found += list(_spot_groups(policy, by_ref))
    tracked = {g.ref for g, s in managed if s.target.enabled}
    found += list(_alarms(policy, view, {g.ref for g, _ in managed}, tracked))
    found += list(_routes(policy, view))
    found += [_demand_finding(d) for d in view.demand]
    return found


def _demand_finding(d: DemandView) -> Finding:
    if d.problem:
        text = f"demand source {d.source}: {d.problem}; until fixed the group scales on utilization only"
        return Finding(level=Level.ERROR, subject=d.group, text=text)
    if d.doubt:
        return Finding(level=Level.WARNING, subject=d.group, text=f"demand source {d.source}: {d.doubt}")
    return Finding(level=Level.OK, subject=d.group, text=f"demand source {d.source}: {d.found}")


def _is_backing_asg(g: GroupObservation) -> bool:
    return g.ref.kind is GroupKind.ASG and bool(g.asg_tags.get(defaults.TAG_EKS_NODEGROUP))


def _tagged(g: GroupObservation, policy: FleetPolicy) -> bool:
    return g.tags.get(policy.discovery.tag_key) == policy.discovery.tag_value


def _named_groups(policy: FleetPolicy, by_ref: dict[GroupRef, GroupObservation]) -> Iterator[Finding]:
    for ref in policy.explicit_groups():
        if ref not in by_ref:
            yield Finding(
                level=Level.ERROR,
                subject=ref.key,
                text=f"a rule names {ref.key}, which this account and region do not have (a typo, or another region)",
            )


def _group_findings(
    obs: GroupObservation, s: GroupSettings, view: AccountView, policy: FleetPolicy
) -> Iterator[Finding]:
    key = obs.ref.key
    if not _tagged(obs, policy):
        tag = f"{policy.discovery.tag_key}={policy.discovery.tag_value}"
        yield Finding(
            level=Level.ERROR,
            subject=key,
            text=f"a rule selects it but it is not tagged {tag}: gpufleet will not change it (IAM denies it "
            "too); tag it, or narrow the rule",
        )
    yield from _bounds(obs, s)
    if s.owner is Owner.EXTERNAL:
        return
    asg = obs.asg_name or obs.ref.name
    if policies := view.scaling_policies.get(asg):
        yield Finding(
            level=Level.WARNING,
            subject=key,
            text=f"native scaling policies ({', '.join(policies)}) also size it: two controllers fight; delete "
            "them or set `owner: external` on its rule",
        )
    if obs.ref.kind is GroupKind.ASG and defaults.TAG_CLUSTER_AUTOSCALER in obs.asg_tags:
        yield Finding(
            level=Level.WARNING,
            subject=key,
            text=f"tagged {defaults.TAG_CLUSTER_AUTOSCALER} (Cluster Autoscaler discovery): if it runs, set `owner: "
            "external` on the rule (its FAQ: metric-based autoscalers must not size the same groups)",
        )


def _bounds(obs: GroupObservation, s: GroupSettings) -> Iterator[Finding]:
    key, top = obs.ref.key, obs.max_size
    if s.max is not None and s.max > top:
        yield Finding(
            level=Level.WARNING,
            subject=key,
            text=f"the policy's max {s.max} is above the group's own max {top}: gpufleet stays within {top}",
        )
    if s.min is not None and s.min > top:
        yield Finding(
            level=Level.ERROR, subject=key, text=f"the policy's min {s.min} is above the group's own max {top}"
        )
    for w in s.schedules:
        for name in ("min", "desired"):
            value = getattr(w, name)
            if value is not None and value > top:
                yield Finding(
                    level=Level.ERROR,
                    subject=key,
                    text=f"schedule '{w.name}' {name} {value} is above the group's own max {top}: the window "
                    f"can never be met (raise the group's max or lower the window)",
                )


def _spot_groups(policy: FleetPolicy, by_ref: dict[GroupRef, GroupObservation]) -> Iterator[Finding]:
    for spot in policy.spot.groups:
        pairs = [("spot group", spot.group)]
        if spot.fallback is not None:
            pairs.append(("fallback group", spot.fallback.group))
        for role, key in pairs:
            try:
                ref = GroupRef.parse_key(key)
            except ValueError:
                continue  # a static problem, already reported
            obs = by_ref.get(ref)
            if obs is None:
                yield Finding(level=Level.ERROR, subject=ref.key, text=f"the {role} does not exist in this account")
            elif not _tagged(obs, policy):
                yield Finding(
                    level=Level.ERROR,
                    subject=ref.key,
                    text=f"the {role} is not tagged {policy.discovery.tag_key}={policy.discovery.tag_value}: "
                    "gpufleet may not raise or lower it",
                )


def _alarm_event(alarm: AlarmView) -> AlarmEvent:
    return AlarmEvent(
        event_id="doctor",
        source=AlarmSource.RECONCILE,
        alarm_name=alarm.name,
        state=AlarmState.ALARM,
        at=datetime(2000, 1, 1, tzinfo=UTC),  # not read: resolution looks at names, tags and metrics only
        metrics=alarm.metrics,
        composite=alarm.composite,
    )


def reads_gpufleet_metrics(metrics: tuple[MetricRef, ...]) -> bool:
    return any(m.namespace == schema.NAMESPACE for m in metrics)


def _alarms(
    policy: FleetPolicy, view: AccountView, managed: set[GroupRef], tracked: set[GroupRef]
) -> Iterator[Finding]:
    pointed: set[GroupRef] = set()
    for alarm in view.alarms:
        prefixed = alarm.name.startswith(policy.alarm_prefix)
        target = resolve_alarm_target(_alarm_event(alarm), alarm.tags, policy)
        if not prefixed:
            if target.group in managed and reads_gpufleet_metrics(alarm.metrics):
                yield Finding(
                    level=Level.WARNING,
                    subject=alarm.name,
                    text=f"reads {target.group.key if target.group else '?'}'s GPU metrics but its name lacks "
                    f"the prefix '{policy.alarm_prefix}': the stack's EventBridge rule never delivers it",
                )
            continue
        if target.group is None or target.direction is None:
            yield Finding(level=Level.ERROR, subject=alarm.name, text=f"cannot act on it: {target.found_by}")
        elif target.group not in managed:
            yield Finding(
                level=Level.WARNING,
                subject=alarm.name,
                text=f"points at {target.group.key}, which no rule selects and discovery does not find",
            )
        else:
            pointed.add(target.group)
            yield Finding(
                level=Level.OK,
                subject=alarm.name,
                text=f"acts on {target.found_by}",
            )
    for ref in sorted(tracked - pointed, key=lambda r: r.key):  # a fallback (target off) needs none
        yield Finding(
            level=Level.WARNING,
            subject=ref.key,
            text=f"no alarm named '{policy.alarm_prefix}*' points at it: only the reconcile tick's band scales it, "
            f"and nothing lifts it from 0 nodes (`gpufleet alarms {ref.key}` makes them)",
        )


def _routes(policy: FleetPolicy, view: AccountView) -> Iterator[Finding]:
    routes = [(f"notifications.routes[{i}]", r) for i, r in enumerate(policy.notifications.routes)]
    routes.append(("notifications.default_route", policy.notifications.default_route))
    for where, route in routes:
        slack = route.slack and view.slack_secret is Presence.PRESENT
        sns = route.sns and view.topic is Presence.PRESENT
        if slack or sns:
            continue
        why = []
        if route.slack:
            why.append(f"Slack secret {view.slack_secret}")
        if route.sns:
            why.append(f"SNS topic {view.topic}")
        yield Finding(
            level=Level.ERROR,
            subject=where,
            text="leads nowhere: " + ("; ".join(why) if why else "neither slack nor sns is on"),
        )
