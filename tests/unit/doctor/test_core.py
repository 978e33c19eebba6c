"""`gpufleet doctor`'s rules, one table row per mistake the first-hour review met (issue 16), on an
account view built by hand: a p4d spot training ASG (0-12) with an on-demand fallback and a g6 EKS
inference node group (2-20)."""

from __future__ import annotations

import pytest

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, MetricRef
from gpufleet.policy.fleet import parse_policy
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


def alarm(name: str, ref: GroupRef, direction: str | None = "out", threshold: float | None = None) -> AlarmView:
    """A GPU utilization alarm on `ref`; with a threshold, a plain one (above it for out, below for in)."""
    dims = (
        {schema.DIM_ASG_NAME: ref.name}
        if ref.kind is GroupKind.ASG
        else {schema.DIM_CLUSTER_NAME: ref.cluster or "", schema.DIM_NODEGROUP_NAME: ref.name}
    )
    tags = {defaults.TAG_ALARM_DIRECTION: direction} if direction else {}
    metric = MetricRef(namespace=schema.NAMESPACE, name=schema.GPU_UTILIZATION.name, dimensions=dims)
    if threshold is None:
        return AlarmView(name=name, tags=tags, metrics=(metric,))
    comparison = "GreaterThanThreshold" if direction == "out" else "LessThanThreshold"
    return AlarmView(name=name, tags=tags, metrics=(metric,), threshold=threshold, comparison=comparison)


WEB = GroupRef(kind=GroupKind.ASG, name="web")
WEB_ASG = group(WEB, 0, 4, tags={})


def pair(high: float, low: float) -> tuple[AlarmView, AlarmView]:
    """train-p4d's pair as `gpufleet alarms` names it."""
    return (
        alarm("gpufleet-train-p4d-gpu-high", TRAIN, "out", high),
        alarm("gpufleet-train-p4d-gpu-low", TRAIN, "in", low),
    )


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


PAIR = (*pair(85, 20), *healthy_view().alarms[1:])


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
            "which this account and region do not have: did you mean asg:train-p4d?",
        ),
        (  # a spot group misspelt
            ("spot: {groups: [{group: asg:train-p4d,", "spot: {groups: [{group: asg:train-p4,"),
            {},
            Level.ERROR,
            "asg:train-p4",
            "the spot group does not exist in this account: did you mean asg:train-p4d?",
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
            {
                "alarms": (*healthy_view().alarms, alarm("gpufleet-web", WEB)),
                "groups": (*healthy_view().groups, WEB_ASG),
            },
            Level.WARNING,
            "gpufleet-web",
            "no rule selects and discovery does not find: tag the group gpufleet:managed=true or name it in a rule",
        ),
        (  # an orphan: an alarm on a group the account does not have
            None,
            {"alarms": (*healthy_view().alarms, alarm("gpufleet-web", WEB))},
            Level.WARNING,
            "gpufleet-web",
            "points at asg:web, which this account and region do not have, so it never scales anything: delete it "
            "(aws cloudwatch delete-alarms --alarm-names gpufleet-web)",
        ),
        (  # ... whose name is a typo of one it has (issue 23)
            None,
            {
                "alarms": (
                    *healthy_view().alarms,
                    alarm("gpufleet-typo", GroupRef(kind=GroupKind.ASG, name="trian-p4d")),
                )
            },
            Level.WARNING,
            "gpufleet-typo",
            "did you mean asg:train-p4d? (`gpufleet alarms asg:train-p4d --apply` makes its pair)",
        ),
        (  # scale-out below scale-in: both fire at once
            None,
            {"alarms": (*PAIR[1:], *pair(20, 80))},
            Level.ERROR,
            "asg:train-p4d",
            "inverted alarm pair on its GPUUtilization: gpufleet-train-p4d-gpu-high scales out above 20 but "
            "gpufleet-train-p4d-gpu-low scales in below 80: from 20 to 80 both fire",
        ),
        (  # equal: no band between them
            None,
            {"alarms": (*PAIR[1:], *pair(50, 50))},
            Level.ERROR,
            "asg:train-p4d",
            "with no band between them it scales out and in by turns; `gpufleet alarms asg:train-p4d --apply` re-makes",
        ),
        (  # inverted across differently named alarms: the fix is the threshold, not a re-make
            None,
            {"alarms": (*PAIR[1:], alarm("gpufleet-old-high", TRAIN, "out", 20), pair(85, 30)[1])},
            Level.ERROR,
            "asg:train-p4d",
            "put gpufleet-old-high's threshold above 30",
        ),
        (  # two pairs on one group: the one `gpufleet alarms` names is kept
            None,
            {
                "alarms": (
                    *PAIR,
                    alarm("gpufleet-train-high", TRAIN, "out", 90),
                    alarm("gpufleet-train-low", TRAIN, "in", 10),
                )
            },
            Level.WARNING,
            "asg:train-p4d",
            "several alarm pairs read its GPUUtilization (scale out: gpufleet-train-high > 90, gpufleet-train-p4d-gpu-"
            "high > 85; scale in: gpufleet-train-low < 10, gpufleet-train-p4d-gpu-low < 20): each one scales it, so it "
            "steps more than once and the loosest threshold decides; keep one pair: aws cloudwatch delete-alarms "
            "--alarm-names gpufleet-train-high gpufleet-train-low",
        ),
        (  # a tracked group with only the scale-in half of a pair
            None,
            {"alarms": (*healthy_view().alarms[1:], pair(85, 20)[1])},
            Level.WARNING,
            "asg:train-p4d",
            "only scale-in alarms (gpufleet-train-p4d-gpu-low) point at it",
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


def test_a_healthy_pair_and_a_memory_alarm_beside_it_pass() -> None:
    """High above low passes; a scale-out on GPU memory is another metric, not a second pair."""
    memory = MetricRef(
        namespace=schema.NAMESPACE,
        name=schema.GPU_MEMORY_USED_PERCENT.name,
        dimensions={schema.DIM_ASG_NAME: "train-p4d"},
    )
    mem = AlarmView(
        name="gpufleet-train-p4d-gpu-memory-high",
        tags={defaults.TAG_ALARM_DIRECTION: "out"},
        metrics=(memory,),
        threshold=90,
        comparison="GreaterThanThreshold",
    )
    assert problems(diagnose(parse_policy(POLICY), healthy_view(alarms=(*PAIR, mem)))) == []


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
