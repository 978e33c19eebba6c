"""`gpufleet doctor`'s rules, one table row per mistake the first-hour review met (issue 16), on an
account view built by hand: a p4d spot training ASG (0-12) with an on-demand fallback and a g6 EKS
inference node group (2-20)."""

from __future__ import annotations

import pytest

from gpufleet.domain import defaults
from gpufleet.domain.models import GroupKind, GroupObservation, GroupRef, MetricRef
from gpufleet.domain.policy import parse_policy
from gpufleet_node import schema
from gpufleet_tools.doctor.core import AccountView, AlarmView, Finding, Level, Presence, diagnose, worst

MANAGED = {defaults.TAG_MANAGED: defaults.TAG_MANAGED_VALUE}
TRAIN = GroupRef(kind=GroupKind.ASG, name="train-p4d")
FALLBACK = GroupRef(kind=GroupKind.ASG, name="train-od")
INFER = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="infer-g6")

POLICY = """
alarm_prefix: gpufleet-
groups:
  - {name: train-od, kind: asg, target: {enabled: false}}
  - {name: train-p4d, kind: asg, max: 12}
  - {name: infer-g6, cluster: ml, kind: eks-nodegroup, min: 2, max: 20}
spot: {groups: [{group: asg:train-p4d, fallback: {group: asg:train-od}}]}
"""


def group(ref: GroupRef, lo: int, hi: int, tags: dict[str, str] | None = None, **kw: object) -> GroupObservation:
    tags = MANAGED if tags is None else tags
    asg_tags = kw.pop("asg_tags", tags)
    return GroupObservation(ref=ref, min_size=lo, max_size=hi, desired=lo, tags=tags, asg_tags=asg_tags, **kw)  # type: ignore[arg-type]


def alarm(name: str, ref: GroupRef, direction: str | None = "out") -> AlarmView:
    dims = (
        {schema.DIM_ASG_NAME: ref.name}
        if ref.kind is GroupKind.ASG
        else {schema.DIM_CLUSTER_NAME: ref.cluster or "", schema.DIM_NODEGROUP_NAME: ref.name}
    )
    tags = {defaults.TAG_ALARM_DIRECTION: direction} if direction else {}
    metric = MetricRef(namespace=schema.NAMESPACE, name=schema.GPU_UTILIZATION.name, dimensions=dims)
    return AlarmView(name=name, tags=tags, metrics=(metric,))


def healthy_view(**changes: object) -> AccountView:
    view = AccountView(
        groups=(group(TRAIN, 0, 12), group(FALLBACK, 0, 4), group(INFER, 2, 20)),
        alarms=(
            alarm("gpufleet-train-high", TRAIN),
            alarm("gpufleet-od-high", FALLBACK),
            alarm("gpufleet-infer-high", INFER),
        ),
        slack_secret=Presence.PRESENT,
        topic=Presence.PRESENT,
    )
    return view.model_copy(update=changes)


def problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level is not Level.OK]


def test_the_healthy_fleet_passes_and_says_how_each_alarm_resolved() -> None:
    findings = diagnose(parse_policy(POLICY), healthy_view())
    assert problems(findings) == [] and worst(findings) is Level.OK
    ok = {f.subject: f.text for f in findings}
    assert (
        ok["gpufleet-infer-high"]
        == "acts on group eks:ml/infer-g6 from metric dimensions; direction out from alarm tag"
    )


def _with_group(ref: GroupRef, replacement: GroupObservation) -> dict[str, object]:
    groups = tuple(replacement if g.ref == ref else g for g in healthy_view().groups)
    return {"groups": groups}


@pytest.mark.parametrize(
    ("policy_change", "view_change", "level", "subject", "needle"),
    [
        (  # a schedule's min above the group's own max
            ("max: 20}", "max: 20, schedules: [{name: peak, cron: '0 9 * * 1-5', duration_minutes: 60, min: 30}]}"),
            {},
            Level.ERROR,
            "policy",  # above the rule's max too: the static check catches it first
            "schedule 'peak' min 30 is above the rule's max 20",
        ),
        (  # ... and one the rule allows but the group's own max does not
            ("max: 20}", "schedules: [{name: peak, cron: '0 9 * * 1-5', duration_minutes: 60, min: 30}]}"),
            {},
            Level.ERROR,
            "eks:ml/infer-g6",
            "schedule 'peak' min 30 is above the group's own max 20",
        ),
        (  # a fallback without its kind
            ("fallback: {group: asg:train-od}", "fallback: {group: train-od}"),
            {},
            Level.ERROR,
            "policy",
            "'train-od' has no kind",
        ),
        (  # a fallback no rule selects
            ("  - {name: train-od, kind: asg, target: {enabled: false}}\n", ""),
            {},
            Level.ERROR,
            "policy",
            "no rule selects asg:train-od",
        ),
        (  # a glob before the fallback's own rule hides it
            ("  - {name: train-od,", "  - {name: 'train-*', kind: asg}\n  - {name: train-od,"),
            {},
            Level.ERROR,
            "policy",
            "groups[1] (train-od) never applies",
        ),
        (  # a rule that names a group the account does not have
            ("name: train-p4d,", "name: train-p4dd,"),
            {},
            Level.ERROR,
            "asg:train-p4dd",
            "which this account and region do not have",
        ),
        (None, _with_group(TRAIN, group(TRAIN, 0, 12, tags={})), Level.ERROR, "asg:train-p4d", "not tagged"),
        (None, _with_group(FALLBACK, group(FALLBACK, 0, 4, tags={})), Level.ERROR, "asg:train-od", "fallback group"),
        (  # policy max above the group's own
            ("max: 12}", "max: 16}"),
            {},
            Level.WARNING,
            "asg:train-p4d",
            "max 16 is above the group's own max 12",
        ),
        (None, {"scaling_policies": {"train-p4d": ("cpu-tt",)}}, Level.WARNING, "asg:train-p4d", "native scaling"),
        (
            None,
            _with_group(TRAIN, group(TRAIN, 0, 12, tags={**MANAGED, "k8s.io/cluster-autoscaler/enabled": "true"})),
            Level.WARNING,
            "asg:train-p4d",
            "Cluster Autoscaler",
        ),
        (  # an alarm whose name lacks the prefix: EventBridge never delivers it
            None,
            {"alarms": (alarm("train-high", TRAIN), *healthy_view().alarms[1:])},
            Level.WARNING,
            "train-high",
            "lacks the prefix 'gpufleet-'",
        ),
        (  # an alarm without a direction
            None,
            {"alarms": (alarm("gpufleet-train-high", TRAIN, direction=None), *healthy_view().alarms[1:])},
            Level.ERROR,
            "gpufleet-train-high",
            "no direction",
        ),
        (  # an alarm pointing at a group gpufleet does not manage
            None,
            {"alarms": (*healthy_view().alarms, alarm("gpufleet-other", GroupRef(kind=GroupKind.ASG, name="web")))},
            Level.WARNING,
            "gpufleet-other",
            "no rule selects",
        ),
        (None, {"alarms": healthy_view().alarms[1:]}, Level.WARNING, "asg:train-p4d", "no alarm named"),
        (  # a Slack-only route with no Slack secret: notifications go nowhere
            ("alarm_prefix: gpufleet-", "alarm_prefix: gpufleet-\nnotifications: {default_route: {sns: false}}"),
            {"slack_secret": Presence.NOT_CONFIGURED},
            Level.ERROR,
            "notifications.default_route",
            "leads nowhere: Slack secret not configured",
        ),
        (None, {"topic": Presence.MISSING, "slack_secret": Presence.MISSING}, Level.ERROR, "notifications", "missing"),
    ],
)
def test_each_mistake_is_named_with_what_to_do(
    policy_change: tuple[str, str] | None, view_change: dict[str, object], level: Level, subject: str, needle: str
) -> None:
    text = POLICY if policy_change is None else POLICY.replace(*policy_change)
    assert text != POLICY or policy_change is None
    findings = problems(diagnose(parse_policy(text), healthy_view(**view_change)))
    hits = [f for f in findings if f.level is level and f.subject.startswith(subject) and needle in f.text]
    assert hits, findings
    assert worst(findings) is (Level.ERROR if any(f.level is Level.ERROR for f in findings) else Level.WARNING)


def test_owner_external_silences_the_other_autoscaler_warnings() -> None:
    text = POLICY.replace("max: 12}", "max: 12, owner: external}")
    view = healthy_view(scaling_policies={"train-p4d": ("cpu-tt",)})
    assert problems(diagnose(parse_policy(text), view)) == []


def test_an_eks_backing_asg_is_not_a_group_of_its_own() -> None:
    backing = group(
        GroupRef(kind=GroupKind.ASG, name="eks-infer-g6-abc"),
        2,
        20,
        tags={defaults.TAG_EKS_CLUSTER: "ml", defaults.TAG_EKS_NODEGROUP: "infer-g6", **MANAGED},
    )
    view = healthy_view(groups=(*healthy_view().groups, backing))
    assert problems(diagnose(parse_policy(POLICY), view)) == []
