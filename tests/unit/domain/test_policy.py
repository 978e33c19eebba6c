from __future__ import annotations

import pytest

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet.policy.fleet import PolicyError, Step, parse_policy

TRAIN = GroupRef(kind=GroupKind.ASG, name="train-a")
INFER = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="infer")
MANAGED = {"gpufleet:managed": "true"}


def test_empty_document_is_the_safe_default() -> None:
    policy = parse_policy("")
    assert policy.discovery.tag_key == "gpufleet:managed"
    assert policy.settings_for(TRAIN, MANAGED) == policy.defaults
    assert policy.settings_for(TRAIN, {}) is None  # neither tagged nor selected by a rule


def test_first_matching_rule_overrides_only_what_it_sets() -> None:
    policy = parse_policy(
        """
defaults: {scale_in_step: 2, scale_out_cooldown_s: 100}
groups:
  - {name: "train-*", kind: asg, scale_out_step: "50%", max: 8}
  - {tags: {team: vision}, dry_run: true}
"""
    )
    train = policy.settings_for(TRAIN, MANAGED)
    assert train is not None
    assert train.scale_out_step == Step(value=50, percent=True)
    assert (train.max, train.scale_in_step.size(10), train.scale_out_cooldown_s) == (8, 2, 100)
    vision = policy.settings_for(INFER, {"team": "vision"})
    assert vision is not None and vision.dry_run
    assert policy.explicit_groups() == []


def test_explicit_groups_are_named_and_typed() -> None:
    policy = parse_policy("groups: [{name: infer, cluster: ml, kind: eks-nodegroup}, {name: 'x-*', kind: asg}]")
    assert policy.explicit_groups() == [INFER]


@pytest.mark.parametrize(
    ("step", "current", "size"),
    [(1, 0, 1), (3, 10, 3), ("25%", 10, 3), ("25%", 1, 1), ("100%", 4, 4), ("10%", 0, 1)],
)
def test_step_sizes(step: int | str, current: int, size: int) -> None:
    policy = parse_policy(f"defaults: {{scale_out_step: '{step}'}}")
    assert policy.defaults.scale_out_step.size(current) == size


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            "defaults: {scale_out_step: abc}",
            "defaults.scale_out_step: expected an integer >= 1 or a percentage like '25%' (got 'abc')",
        ),
        ("defaults: {scale_out_step: 0}", "defaults.scale_out_step: an absolute step must be >= 1 (got 0)"),
        ("defaults: {min: 5, max: 2}", "defaults: min (5) is above max (2)"),
        ("defaults: {target: {low: 90, high: 10}}", "defaults.target: low (90) must be below high (10)"),
        ("groups: [{kind: asg}]", "groups[0]: a group rule selects by name or by tags (or both)"),
        (
            "groups: [{name: ng, kind: eks-nodegroup}]",
            "groups[0] (ng): an eks-nodegroup rule with a name also needs its cluster",
        ),
        (
            "groups: [{name: a, kind: gke}]",
            "groups[0] (a).kind: Input should be 'asg', 'eks-nodegroup' or 'hyperpod' (got 'gke')",
        ),
        ("groups: [{name: a, bogus: 1}]", "groups[0] (a).bogus: Extra inputs are not permitted (got 1)"),
        (
            "defaults: {schedules: [{name: s, cron: '0 8 * *', duration_minutes: 60, desired: 2}]}",
            "defaults.schedules[0]: cron '0 8 * *' has 4 field(s); a schedule needs 5",
        ),
        (
            "defaults: {schedules: [{name: s, cron: '0 8 * * *', timezone: Mars/Olympus, "
            "duration_minutes: 60, desired: 2}]}",
            "defaults.schedules[0]: timezone 'Mars/Olympus' is not an IANA time zone",
        ),
        (
            "defaults: {schedules: [{name: s, cron: '0 8 * * *', duration_minutes: 60, min: 3, desired: 2}]}",
            "defaults.schedules[0]: desired (2) is below min (3)",
        ),
        ("alarms: [{alarm: 'gpu-*', group: 'gke:x'}]", "alarms[0]: not a group key: 'gke:x'"),
        ("version: 2", "version: Input should be less than or equal to 1 (got 2)"),
        ("[1, 2]", "(document): expected a mapping at the top level"),
        ("groups: [", "policy: not valid YAML"),
    ],
)
def test_errors_name_the_path_and_the_bad_value(document: str, expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(document)
    assert any(p.startswith(expected) for p in err.value.problems), err.value.problems


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy("defaults: {scale_out_step: x, scale_in_step: y, min: -1}")
    assert len(err.value.problems) == 3


def test_a_demand_source_per_group() -> None:
    policy = parse_policy(
        """
groups:
  - {name: train-gpu, cluster: ml, kind: eks-nodegroup, min: 0,
     demand: {kubernetes: {gpu_resources: {nvidia.com/gpu: 1, k8s.amazonaws.com/vgpu: 10}}}}
  - {name: slurm-*, kind: asg,
     demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}, gpus_per_node: 8}}
  - {name: jobs, kind: asg,
     demand: {sqs: {queue_url: "https://sqs.us-east-1.amazonaws.com/123456789012/jobs", gpus_per_message: 4}}}
""",
        "policy.yaml",
    )
    eks = policy.settings_for(GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="train-gpu"), {})
    assert eks is not None and eks.demand is not None and eks.demand.kubernetes is not None
    assert eks.demand.kubernetes.gpu_resources == {"nvidia.com/gpu": 1, "k8s.amazonaws.com/vgpu": 10}
    slurm = policy.settings_for(GroupRef(kind=GroupKind.ASG, name="slurm-a"), {})
    assert slurm is not None and slurm.demand is not None and slurm.demand.gpus_per_node == 8
    default = policy.settings_for(GroupRef(kind=GroupKind.ASG, name="other"), {"gpufleet:managed": "true"})
    assert default is not None and default.demand is None  # no source: utilization rules only


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        ("{}", "demand needs exactly one of kubernetes, sqs, metric (got none)"),
        ("{kubernetes: {}, metric: {namespace: A, metric_name: B}}", "(got kubernetes, metric)"),
        ("{sqs: {queue_url: not-a-url}}", "queue_url"),
        ("{kubernetes: {gpu_resources: {nvidia.com/gpu: 0}}}", "units per GPU must be in (0, 1000]"),
        ("{sqs: {queue_url: 'https://q', gpus_per_message: -1}}", "gpus_per_message"),
    ],
)
def test_a_bad_demand_source_is_one_clear_error(demand: str, expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(f"groups:\n  - {{name: g, kind: asg, demand: {demand}}}\n", "p.yaml")
    assert any(expected in problem for problem in err.value.problems), err.value.problems
