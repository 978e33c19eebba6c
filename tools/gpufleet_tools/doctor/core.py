"""`gpufleet doctor`'s rules (pure): a policy checked against what an account holds, before it is trusted
with a fleet. Each finding says what is wrong, where, and what to do; the exit code follows the worst one.

Checks: the policy's static mistakes (`domain.policy_checks`); named groups that do not exist; groups a
rule selects that lack the managed tag (gpufleet would not change them, and IAM would deny it); policy or
schedule bounds outside the group's own; spot and fallback groups missing or untagged; another
autoscaler on a group gpufleet owns (native scaling policies, Cluster Autoscaler tags on a plain ASG);
scaling alarms that resolve to no group or direction, that point at a group the account does not have or
gpufleet does not manage, or that read a managed group's metrics without the policy's alarm prefix (the
EventBridge rule never sees them); a group's alarm pairs inverted (scale-out at or below scale-in) or
doubled; managed groups no scale-out alarm points at; notification routes that lead nowhere; each group's
demand source - the cluster (exists, reachable, an access entry with AmazonEKSViewPolicy), the queue, the
backlog metric (a datum lately); a cluster where a group consolidates by attrition lets nodes be patched
(a SelfSubjectAccessReview: the cordon's RBAC); a cluster whose groups count queued jobs (Kueue, Volcano)
lets each installed system's objects be listed and its access entries carry the group bound to that (one
review per resource: `queued_jobs_view`); a queue-driven group whose workers hold messages while none of its
instances is protected from scale-in (nothing marks the busy nodes); two groups reading one queue or one
metric with no `demand.order` between them; each HyperPod cluster's execution roles (`hyperpod_roles`: Slurm's
controller group known, its role shared with other groups or not, the Deny on other Slurm namespaces). A group
name not found comes with the closest the account has.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from enum import StrEnum

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import AlarmState, Direction, Frozen, GroupObservation, GroupRef, MetricRef
from gpufleet.events.model import AlarmEvent, AlarmSource
from gpufleet.policy.checks import policy_problems
from gpufleet.policy.fleet import FleetPolicy, GroupSettings, Owner
from gpufleet.scaling.targets import AlarmTarget, resolve_alarm_target
from gpufleet_node import schema
from gpufleet_tools.alarm_specs import DEFAULT_HIGH, DEFAULT_LOW, scaling_alarms
from gpufleet_tools.doctor.hyperpod_roles import ClusterRoles, role_findings


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    ERROR = "error"


class Finding(Frozen):
    level: Level
    subject: str  # the group, alarm, rule or route it is about
    text: str


class AlarmView(Frozen):
    """An alarm as doctor read it; `threshold` and `comparison` only for a plain one-metric alarm (not
    math, not composite), where the threshold is on the metric itself and pairs can be compared."""

    name: str
    tags: dict[str, str] = {}
    metrics: tuple[MetricRef, ...] = ()
    composite: bool = False
    threshold: float | None = None
    comparison: str | None = None  # CloudWatch's ComparisonOperator


class Presence(StrEnum):
    NOT_CONFIGURED = "not configured"
    MISSING = "missing"
    PRESENT = "present"


class DemandView(Frozen):
    """What doctor found of one managed group's demand source: `problem` (the scaler cannot read it: an
    error), `doubt` (it may not: a warning), else `found` (what checked out)."""

    group: str
    source: str
    what: str = "demand source"  # or "node marks (nodes: patch)": the cordon consolidation needs
    problem: str | None = None
    doubt: str | None = None
    found: str = ""
    in_flight: int | None = None  # a queue's messages being worked on (ApproximateNumberOfMessagesNotVisible)


class AccountView(Frozen):
    """What doctor read: every ASG (EKS backing ones included) and node group, the native scaling policies
    of the ASGs, the alarms, whether the notification targets exist, and the demand sources."""

    groups: tuple[GroupObservation, ...] = ()
    scaling_policies: dict[str, tuple[str, ...]] = {}  # ASG name -> its scaling policies' names
    alarms: tuple[AlarmView, ...] = ()
    slack_secret: Presence = Presence.NOT_CONFIGURED
    topic: Presence = Presence.NOT_CONFIGURED
    demand: tuple[DemandView, ...] = ()
    hyperpod: tuple[ClusterRoles, ...] = ()  # the execution roles of the HyperPod clusters the policy names


def worst(findings: list[Finding]) -> Level:
    levels = {f.level for f in findings}
    return Level.ERROR if Level.ERROR in levels else Level.WARNING if Level.WARNING in levels else Level.OK


def diagnose(policy: FleetPolicy, view: AccountView) -> list[Finding]:
    """Every finding, errors and warnings first within each check, then what checked out."""
    found = [Finding(level=Level.ERROR, subject="policy", text=p) for p in policy_problems(policy)]
    groups = [g for g in view.groups if not is_backing_asg(g)]
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
    found += list(_queue_workers(managed, view))
    found += list(_shared_sources(policy, managed))
    found += [
        Finding(level=Level(lv), subject=sub, text=text) for c in view.hyperpod for lv, sub, text in role_findings(c)
    ]
    return found


def _queue_workers(managed: list[tuple[GroupObservation, GroupSettings]], view: AccountView) -> Iterator[Finding]:
    """Queue-driven groups whose workers hold messages while none of their instances is protected from
    scale-in. In-flight messages keep that many nodes, but nothing says which: an idle node may be kept and
    a busy one removed. AWS's answer for queue workers is scale-in protection while a job runs (EC2 Auto
    Scaling user guide, "Use instance scale-in protection"); `gpufleet-node busy -- COMMAND` does it. Groups
    on one queue are judged together: a protected instance in any of them shows the workers mark their nodes."""
    in_flight = {d.group: d.in_flight for d in view.demand if d.in_flight is not None}
    by_queue: dict[str, list[GroupObservation]] = {}
    for obs, s in managed:
        if s.demand is not None and s.demand.sqs is not None and s.owner is not Owner.EXTERNAL:
            by_queue.setdefault(s.demand.sqs.queue_url.rstrip("/"), []).append(obs)
    for url, groups in sorted(by_queue.items()):
        held = max((in_flight.get(g.ref.key) or 0 for g in groups), default=0)
        if held == 0 or any(i.protected_from_scale_in for g in groups for i in g.instances):
            continue
        queue = url.rsplit("/", 1)[-1]
        for obs in sorted((g for g in groups if g.in_service), key=lambda g: g.ref.key):
            yield Finding(
                level=Level.WARNING,
                subject=obs.ref.key,
                text=f"{held} message(s) of queue {queue} are being worked on, but none of its instances is "
                "protected from scale-in: gpufleet keeps as many nodes as messages run, not the ones that run "
                "them, and may remove a busy node; run each job as `gpufleet-node busy -- COMMAND` (or call "
                "SetInstanceProtection around it: docs/scaler.md, Queue workers)",
            )


def _source_key(obs: GroupObservation, s: GroupSettings) -> str | None:
    """What a group's demand reads, when other groups can read the very same thing: a queue, or a metric
    with explicit dimensions (without them each group reads its own dimension)."""
    d = s.demand
    if d is None:
        return None
    if d.sqs is not None:
        return f"queue {d.sqs.queue_url.rstrip('/').rsplit('/', 1)[-1]} ({d.sqs.queue_url.rstrip('/')})"
    if d.metric is not None and d.metric.dimensions is not None:
        dims = ", ".join(f"{k}={v}" for k, v in sorted(d.metric.dimensions.items()))
        return f"metric {d.metric.namespace}/{d.metric.metric_name} ({dims})"
    return None


def _spot_pairs(policy: FleetPolicy) -> set[frozenset[str]]:
    pairs: set[frozenset[str]] = set()
    for spot in policy.spot.groups:
        if spot.fallback is None:
            continue
        try:
            pairs.add(frozenset((GroupRef.parse_key(spot.group).key, GroupRef.parse_key(spot.fallback.group).key)))
        except ValueError:
            continue  # a static problem, already reported
    return pairs


def _shared_sources(policy: FleetPolicy, managed: list[tuple[GroupObservation, GroupSettings]]) -> Iterator[Finding]:
    """Groups that read one source split it: the lowest `demand.order` first, then a spot group before
    its fallback, then by name. Two groups that only the name orders were put in that order by nobody."""
    by_source: dict[str, list[tuple[str, int | None]]] = {}
    for obs, s in managed:
        key = _source_key(obs, s)
        if key is not None and s.demand is not None:
            by_source.setdefault(key, []).append((obs.ref.key, s.demand.order))
    spot = _spot_pairs(policy)
    for source, readers in sorted(by_source.items()):
        readers.sort()
        tied = [
            (a, b)
            for i, (a, order_a) in enumerate(readers)
            for b, order_b in readers[i + 1 :]
            if order_a == order_b and frozenset((a, b)) not in spot
        ]
        if not tied:
            continue
        names = sorted({g for pair in tied for g in pair})
        yield Finding(
            level=Level.WARNING,
            subject=", ".join(names),
            text=f"{', '.join(names)} read one source, {source}, with no `demand.order` between them: each "
            f"would take the same work, so they split it by name ({names[0]} first); set `demand.order` on "
            "their rules (lowest first) to say which takes it (a spot group and its fallback need none)",
        )


def _demand_finding(d: DemandView) -> Finding:
    if d.problem:
        after = (
            "until fixed the group scales on utilization only"
            if d.what == "demand source"
            else "until fixed the scaler counts a queued job only once its pods exist"
            if d.what.startswith("queued jobs")
            else "until fixed no node of the group drains (consolidate: attrition does nothing)"
        )
        return Finding(level=Level.ERROR, subject=d.group, text=f"{d.what} {d.source}: {d.problem}; {after}")
    if d.doubt:
        return Finding(level=Level.WARNING, subject=d.group, text=f"{d.what} {d.source}: {d.doubt}")
    return Finding(level=Level.OK, subject=d.group, text=f"{d.what} {d.source}: {d.found}")


class ResourceAccess(Frozen):
    """One review's answer: may the identity doctor reads with `list` this resource ("workloads.kueue.x-k8s.io")?
    `optional`: the system reads well without it (Volcano Jobs: only the tasks' shapes)."""

    resource: str
    allowed: bool
    optional: bool = False
    reason: str = ""


QUEUED_GRANT = "deploy/kubernetes/gpufleet-queued-jobs.yaml"


def queued_jobs_view(
    cluster: str,
    system: str,
    installed: bool,
    access: tuple[ResourceAccess, ...],
    whose: str,
    holders: tuple[str, ...] | None,
) -> DemandView:
    """What doctor says of one queueing system's objects on one cluster. AmazonEKSViewPolicy covers no
    custom resources: the scaler lists them through the Kubernetes group `defaults.QUEUED_JOBS_GROUP`,
    which QUEUED_GRANT binds to get and list. `access`: one review per resource served; `whose`: whose
    identity was reviewed (the caller's on EKS); `holders`: the access entries that carry the group (None
    where that does not apply: a token of the scaler's own, or entries that could not be read)."""
    source, what = f"cluster {cluster}", f"queued jobs ({system})"
    if not installed:
        return DemandView(group="", source=source, what=what, found=f"{system} is not installed: nothing to read")
    group = defaults.QUEUED_JOBS_GROUP
    apply = f"kubectl apply -f {QUEUED_GRANT}"
    entry = f"put the scaler's access entry in the Kubernetes group {group} (the template's ScalerEksAccess* do)"
    denied = [a.resource for a in access if not a.allowed and not a.optional]
    if denied:
        problem = f"{whose} may not list {', '.join(denied)}: {apply}, and {entry}"
        return DemandView(group="", source=source, what=what, problem=problem)
    if holders is not None and not holders:
        problem = (
            f"list is allowed to {whose}, but no access entry carries the Kubernetes group {group}, so the "
            f"scaler's role is not in it: {entry}, or `aws eks update-access-entry --cluster-name {cluster} "
            f"--principal-arn SCALER_ROLE_ARN --kubernetes-groups {defaults.NODE_MARKS_GROUP} {group}` "
            "(the list replaces the entry's groups)"
        )
        return DemandView(group="", source=source, what=what, problem=problem)
    listed = ", ".join(a.resource for a in access if a.allowed)
    in_group = f"; the group {group} is on the access entry of {', '.join(holders)}" if holders else ""
    found = f"list allowed on {listed} ({whose}){in_group}"
    optional = [a.resource for a in access if not a.allowed and a.optional]
    if optional:
        doubt = (
            f"{found}, but not on {', '.join(optional)}: a gang is read from its PodGroup's minResources, not its "
            f"tasks' shapes; {apply}"
        )
        return DemandView(group="", source=source, what=what, doubt=doubt)
    return DemandView(group="", source=source, what=what, found=found)


def is_backing_asg(g: GroupObservation) -> bool:
    """An EKS node group's own Auto Scaling group: the node group stands for it (its observation carries
    the same tags), so it is not a group of its own."""
    return g.ref.kind is GroupKind.ASG and bool(g.asg_tags.get(defaults.TAG_EKS_NODEGROUP))


def _tagged(g: GroupObservation, policy: FleetPolicy) -> bool:
    return g.tags.get(policy.discovery.tag_key) == policy.discovery.tag_value


def closest(key: str, keys: Iterable[str]) -> list[str]:
    """The group keys most like `key` (a typo's likely meaning), best first: difflib's ratio, at least 0.6 and
    within 0.05 of the best, so a shared `asg:train-` does not drag in every sibling."""
    scored = sorted((-difflib.SequenceMatcher(None, key, k).ratio(), k) for k in set(keys) - {key})
    best = -scored[0][0] if scored else 0.0
    return [k for r, k in scored[:3] if -r >= max(0.6, best - 0.05)]  # the best, and any as good


def did_you_mean(key: str, keys: Iterable[str]) -> str:
    """'did you mean asg:train-spot?' for a group key not found, or '' when none is close."""
    close = closest(key, keys)
    return f"did you mean {' or '.join(close)}?" if close else ""


def _named_groups(policy: FleetPolicy, by_ref: dict[GroupRef, GroupObservation]) -> Iterator[Finding]:
    keys = [r.key for r in by_ref]
    for ref in policy.explicit_groups():
        if ref not in by_ref:
            hint = did_you_mean(ref.key, keys) or "a typo, or another region?"
            yield Finding(
                level=Level.ERROR,
                subject=ref.key,
                text=f"a rule names {ref.key}, which this account and region do not have: {hint}",
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
                hint = did_you_mean(ref.key, [r.key for r in by_ref])
                text = f"the {role} does not exist in this account" + (f": {hint}" if hint else "")
                yield Finding(level=Level.ERROR, subject=ref.key, text=text)
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


class _Acting(Frozen):
    """An alarm the scaler would act on: prefixed, resolved, on a managed group."""

    alarm: AlarmView
    group: GroupRef
    direction: Direction


def _alarms(
    policy: FleetPolicy, view: AccountView, managed: set[GroupRef], tracked: set[GroupRef]
) -> Iterator[Finding]:
    existing = {g.ref for g in view.groups}
    keys = [g.ref.key for g in view.groups if not is_backing_asg(g)]
    acting: list[_Acting] = []
    for alarm in view.alarms:
        target = resolve_alarm_target(_alarm_event(alarm), alarm.tags, policy)
        if not alarm.name.startswith(policy.alarm_prefix):
            yield from _unprefixed(alarm, target, managed, policy)
        elif target.group is None or target.direction is None:
            yield Finding(level=Level.ERROR, subject=alarm.name, text=f"cannot act on it: {target.found_by}")
        elif target.group not in managed:
            yield _not_managed(alarm.name, target.group, target.group in existing, keys, policy)
        else:
            acting.append(_Acting(alarm=alarm, group=target.group, direction=target.direction))
            yield Finding(level=Level.OK, subject=alarm.name, text=f"acts on {target.found_by}")
    yield from _pairs(acting, policy.alarm_prefix)
    yield from _unpointed(policy.alarm_prefix, tracked, acting)


def _unprefixed(
    alarm: AlarmView, target: AlarmTarget, managed: set[GroupRef], policy: FleetPolicy
) -> Iterator[Finding]:
    if target.group in managed and reads_gpufleet_metrics(alarm.metrics):
        yield Finding(
            level=Level.WARNING,
            subject=alarm.name,
            text=f"reads {target.group.key if target.group else '?'}'s GPU metrics but its name lacks "
            f"the prefix '{policy.alarm_prefix}': the stack's EventBridge rule never delivers it",
        )


def _not_managed(name: str, group: GroupRef, exists: bool, keys: list[str], policy: FleetPolicy) -> Finding:
    delete = f"aws cloudwatch delete-alarms --alarm-names {name}"
    if exists:
        tag = f"{policy.discovery.tag_key}={policy.discovery.tag_value}"
        text = (
            f"points at {group.key}, which no rule selects and discovery does not find: tag the group {tag} "
            f"or name it in a rule, or delete the alarm ({delete})"
        )
        return Finding(level=Level.WARNING, subject=name, text=text)
    close = closest(group.key, keys)
    meant = f"; did you mean {close[0]}? (`gpufleet alarms {close[0]} --apply` makes its pair)" if close else ""
    text = (
        f"points at {group.key}, which this account and region do not have, so it never scales anything: "
        f"delete it ({delete}){meant}"
    )
    return Finding(level=Level.WARNING, subject=name, text=text)


def _unpointed(prefix: str, tracked: set[GroupRef], acting: list[_Acting]) -> Iterator[Finding]:
    """Tracked groups no scale-out alarm points at (a fallback, target off, needs none)."""
    out = {a.group for a in acting if a.direction is Direction.OUT}
    for ref in sorted(tracked - out, key=lambda r: r.key):
        ins = [a.alarm.name for a in acting if a.group == ref]
        which = f"only scale-in alarms ({', '.join(ins)}) point" if ins else f"no alarm named '{prefix}*' points"
        yield Finding(
            level=Level.WARNING,
            subject=ref.key,
            text=f"{which} at it: only the reconcile tick's band scales it out, and nothing lifts it from 0 nodes "
            f"(`gpufleet alarms {ref.key}` makes the pair)",
        )


_ABOVE = {
    "GreaterThanThreshold": True,
    "GreaterThanOrEqualToThreshold": True,
    "LessThanThreshold": False,
    "LessThanOrEqualToThreshold": False,
}


def _pairs(acting: list[_Acting], prefix: str) -> Iterator[Finding]:
    """Per group and metric, the plain alarms' pairs: doubled (several on one side), inverted (a scale-out
    threshold at or below a scale-in one)."""
    sides: dict[tuple[GroupRef, str], list[_Acting]] = {}
    for a in acting:
        if a.alarm.threshold is not None and len(a.alarm.metrics) == 1 and a.alarm.metrics[0].name:
            sides.setdefault((a.group, a.alarm.metrics[0].name), []).append(a)
    for (group, metric), alarms in sorted(sides.items(), key=lambda kv: (kv[0][0].key, kv[0][1])):
        outs = sorted((a for a in alarms if a.direction is Direction.OUT), key=lambda a: a.alarm.name)
        ins = sorted((a for a in alarms if a.direction is Direction.IN), key=lambda a: a.alarm.name)
        canonical = {s.name for s in scaling_alarms(group, prefix)}  # `gpufleet alarms`' own pair
        if len(outs) > 1 or len(ins) > 1:
            yield _doubled(group, metric, outs, ins, canonical)
        yield from _inverted(group, metric, outs, ins, canonical)


def _band(a: _Acting) -> str:
    above = _ABOVE.get(a.alarm.comparison or "")
    sign = "?" if above is None else ">" if above else "<"
    return f"{a.alarm.name} {sign} {a.alarm.threshold:g}"


def _doubled(group: GroupRef, metric: str, outs: list[_Acting], ins: list[_Acting], canonical: set[str]) -> Finding:
    """Each alarm's state change scales the group: several on one side step it more than once, and the
    loosest threshold decides. Keep `gpufleet alarms`' own pair (`canonical`) where it is there, else the first."""
    extra: list[str] = []
    for side in (outs, ins):
        others = [a.alarm.name for a in side if a.alarm.name not in canonical]
        extra += others[1:] if len(others) == len(side) else others
    listed = "; ".join(
        f"scale {d}: {', '.join(_band(a) for a in side)}" for d, side in (("out", outs), ("in", ins)) if side
    )
    return Finding(
        level=Level.WARNING,
        subject=group.key,
        text=f"several alarm pairs read its {metric} ({listed}): each one scales it, so it steps more than once "
        f"and the loosest threshold decides; keep one pair: "
        f"aws cloudwatch delete-alarms --alarm-names {' '.join(extra)}",
    )


def _inverted(
    group: GroupRef, metric: str, outs: list[_Acting], ins: list[_Acting], canonical: set[str]
) -> Iterator[Finding]:
    for o, i in ((o, i) for o in outs for i in ins):
        if _ABOVE.get(o.alarm.comparison or "") is not True or _ABOVE.get(i.alarm.comparison or "") is not False:
            continue  # not an above/below pair: nothing to compare
        high, low = o.alarm.threshold or 0.0, i.alarm.threshold or 0.0
        if high > low:
            continue
        why = (
            f"from {high:g} to {low:g} both fire, scaling out and in at once"
            if high < low
            else "with no band between them it scales out and in by turns"
        )
        remake = f"`gpufleet alarms {group.key} --apply` re-makes the pair at {DEFAULT_HIGH:g}/{DEFAULT_LOW:g}"
        fix = remake if {o.alarm.name, i.alarm.name} <= canonical else f"put {o.alarm.name}'s threshold above {low:g}"
        yield Finding(
            level=Level.ERROR,
            subject=group.key,
            text=f"inverted alarm pair on its {metric}: {o.alarm.name} scales out above {high:g} but "
            f"{i.alarm.name} scales in below {low:g}: {why}; {fix}",
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
