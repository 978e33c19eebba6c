"""The static mistakes `gpufleet validate-policy` reports beyond the schema: each one the first-hour
review found accepted (issue 16), and the shipped policies pass clean (the demo's, which needs the rehearsal
and so the runtime, in tests/adapters/domain/test_rehearsal_policy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.policy.checks import covers, policy_problems
from gpufleet.policy.fleet import PolicyError, parse_policy
from gpufleet_tools.replay.policy import Workload, recommended_policy_yaml

ROOT = Path(__file__).resolve().parents[3]

P4D = "  - {name: train-p4d, kind: asg, max: 12, target: {low: 30, high: 85}}\n"
G6 = "  - {name: infer-g6, cluster: ml, kind: eks-nodegroup, min: 2, max: 20}\n"


def problems(yaml: str) -> list[str]:
    return policy_problems(parse_policy(yaml))


def schema_problems(yaml: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        parse_policy(yaml)
    return list(err.value.problems)


@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        (  # a window's min above the rule's max
            "groups:\n  - name: infer-g6\n    cluster: ml\n    kind: eks-nodegroup\n    max: 20\n"
            "    schedules: [{name: peak, cron: '0 9 * * 1-5', duration_minutes: 60, min: 30}]\n",
            "groups[0] (ml/infer-g6): schedule 'peak' min 30 is above the rule's max 20",
        ),
        (  # the defaults' max bounds a rule that sets none
            "defaults: {max: 4}\ngroups:\n  - name: a\n    kind: asg\n"
            "    schedules: [{name: w, cron: '0 9 * * *', duration_minutes: 5, desired: 6}]\n",
            "groups[0] (a): schedule 'w' desired 6 is above the rule's max 4",
        ),
        (  # a glob placed before the fallback's own rule hides it
            "groups:\n  - {name: 'train-*', kind: asg}\n"
            "  - {name: train-a100-od, kind: asg, target: {enabled: false}}\n",
            "groups[1] (train-a100-od) never applies: groups[0] (train-*) comes first",
        ),
        (  # a fallback written without its kind
            "groups:\n" + P4D + "  - {name: train-od, kind: asg, target: {enabled: false}}\n"
            "spot: {groups: [{group: asg:train-p4d, fallback: {group: train-od}}]}\n",
            "spot.groups[0].fallback.group: 'train-od' has no kind: write 'asg:train-od'",
        ),
        (  # a fallback no rule selects (it would be target-tracked against spot_watch)
            "groups:\n" + P4D + "spot: {groups: [{group: asg:train-p4d, fallback: {group: asg:train-od}}]}\n",
            "spot.groups[0].fallback.group: no rule selects asg:train-od",
        ),
    ],
)
def test_each_mistake_that_parses_is_reported_by_rule(yaml: str, expected: str) -> None:
    found = problems(yaml)
    assert len(found) == 1 and found[0].startswith(expected), found


@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        (  # the hour out of range is named, and the time-zone error next to it is not hidden
            "groups:\n  - name: a\n    kind: asg\n    schedules: [{name: w, cron: '0 25 * * 1-5', "
            "timezone: Europe/Berln, duration_minutes: 5, min: 1}]\n",
            ["hour 25 is out of range 0-23", "timezone 'Europe/Berln' is not an IANA time zone"],
        ),
        (
            "groups:\n  - {name: a, kind: asg, scale_out_stpe: 2}\n",
            ["groups[0] (a).scale_out_stpe", "did you mean 'scale_out_step'?"],
        ),
        (
            "groups:\n  - name: a\n    kind: asg\n"
            "    schedules: [{name: w, cron: '0 9 * *', duration_minutes: 5, min: 1}]\n",
            ["has 4 field(s); a schedule needs 5"],
        ),
    ],
)
def test_schema_errors_say_precisely_what_and_where(yaml: str, expected: list[str]) -> None:
    [problem] = schema_problems(yaml)
    assert all(e in problem for e in expected), problem


def test_a_specific_rule_before_a_glob_and_distinct_selectors_pass() -> None:
    yaml = (
        "groups:\n  - {name: train-od, kind: asg, target: {enabled: false}}\n  - {name: 'train-*', kind: asg}\n"
        + G6
        + "  - {tags: {team: ml}}\n"
        "spot: {groups: [{group: 'asg:train-p4d', fallback: {group: 'asg:train-od'}}]}\n"
    )
    assert problems(yaml) == []


@pytest.mark.parametrize(
    ("earlier", "later", "hidden"),
    [
        ({"name": "train-*"}, {"name": "train-a", "kind": "asg"}, True),
        ({"name": "train-*", "kind": "asg"}, {"name": "train-a"}, False),  # later also takes node groups
        (
            {"name": "*", "cluster": "ml", "kind": "eks-nodegroup"},
            {"name": "g", "cluster": "ml", "kind": "eks-nodegroup"},
            True,
        ),
        (
            {"name": "*", "cluster": "ml", "kind": "eks-nodegroup"},
            {"name": "g", "cluster": "prod", "kind": "eks-nodegroup"},
            False,
        ),
        ({"tags": {"team": "ml"}}, {"name": "a", "tags": {"team": "ml", "tier": "gpu"}}, True),
        ({"name": "a", "tags": {"team": "ml"}}, {"name": "a"}, False),  # later takes untagged ones too
        ({"name": "train-?"}, {"name": "train-*"}, False),  # a glob only hides the same glob
    ],
)
def test_covers(earlier: dict, later: dict, hidden: bool) -> None:  # type: ignore[type-arg]
    from gpufleet.policy.fleet import GroupRule

    assert covers(GroupRule.model_validate(earlier), GroupRule.model_validate(later)) is hidden


def test_the_shipped_policies_are_clean() -> None:
    for workload in Workload:
        assert problems(recommended_policy_yaml(workload)) == []
    for path in sorted((ROOT / "events").rglob("*.yaml")):
        if not path.name.startswith("bad-"):
            assert problems(path.read_text()) == [], path


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        (
            "{name: g, cluster: hp, kind: hyperpod, max: 2, demand: {kubernetes: {}}}",
            "groups[0] (hp/g): demand.kubernetes reads an EKS cluster's pods",
        ),
        ("{name: 'g*', demand: {kubernetes: {}}}", "groups[0] (g*): demand.kubernetes reads an EKS cluster's pods"),
        (
            "{name: g, cluster: ml, kind: eks-nodegroup, demand: {kubernetes: {cluster: prod}}}",
            "groups[0] (ml/g): demand.kubernetes.cluster is for self-managed ASGs",
        ),
        (
            "{name: g, kind: asg, demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}}}",
            "groups[0] (g): demand.metric needs demand.gpus_per_node",
        ),
        ("{name: g, kind: asg, demand: {sqs: {queue_url: 'https://q/1/j'}}}", "demand.sqs needs demand.gpus_per_node"),
        (
            "{name: g, kind: asg, demand: {metric: {namespace: GPUFleet, metric_name: Pending}, gpus_per_node: 8}}",
            "groups[0] (g): demand.metric.namespace 'GPUFleet' is one every GPU node may write",
        ),
        (
            "{name: g, kind: asg, demand: {metric: {namespace: GPUFleet/slurm, metric_name: P}, gpus_per_node: 8}}",
            "any node could steer this group's size",
        ),
    ],
)
def test_a_demand_source_the_group_cannot_use(rule: str, problem: str) -> None:
    found = policy_problems(parse_policy(f"groups:\n  - {rule}\n", "p.yaml"))
    assert any(p.startswith(problem) or problem in p for p in found), found


@pytest.mark.parametrize(
    "rule",
    [
        "{name: gpu-spot, kind: asg, demand: {kubernetes: {}}}",  # its cluster from its tags
        "{name: gpu-spot, kind: asg, demand: {kubernetes: {cluster: ml}}}",
        "{name: g, cluster: ml, kind: eks-nodegroup, demand: {kubernetes: {}}}",
    ],
)
def test_pods_drive_a_self_managed_asg_as_a_managed_node_group(rule: str) -> None:
    """Issue 30: demand.kubernetes on kind asg (an ASG whose nodes join an EKS cluster) was refused."""
    assert policy_problems(parse_policy(f"groups:\n  - {rule}\n", "p.yaml")) == []


def test_demand_sources_that_fit_their_groups_are_fine() -> None:
    text = """
groups:
  - {name: train-gpu, cluster: ml, kind: eks-nodegroup, demand: {kubernetes: {}}}
  - {name: slurm, kind: asg, demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}, gpus_per_node: 8}}
  - {name: other, kind: asg, demand: {metric: {namespace: GPUFleetSlurm, metric_name: P}, gpus_per_node: 8}}
"""
    assert policy_problems(parse_policy(text, "p.yaml")) == []


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        (
            "  - {kind: asg, cluster: ml, name: gpu-spot, max: 4, demand: {kubernetes: {}}}\n",
            "groups[0] (ml/gpu-spot): an ASG has no cluster, so this rule selects no group: drop cluster "
            "(to read cluster ml's pods for it, set demand.kubernetes.cluster: ml)",
        ),
        (
            "  - {kind: asg, name: eks-gpu-4ec5b2a8-3f6e-1a2b-9c8d-0123456789ab, max: 4}\n",
            "groups[0] (eks-gpu-4ec5b2a8-3f6e-1a2b-9c8d-0123456789ab): eks-gpu-4ec5b2a8-3f6e-1a2b-9c8d-0123456789ab "
            "looks like the ASG EKS made for a managed node group, which is not sized as an ASG: write "
            "kind: eks-nodegroup, cluster: C, name: NODEGROUP instead",
        ),
    ],
)
def test_an_asg_rule_that_selects_nothing_or_a_node_groups_own_asg(rule: str, problem: str) -> None:
    assert problems("groups:\n" + rule) == [problem]


def test_asg_rules_of_names_and_tags_alone_are_fine() -> None:
    assert problems("groups:\n  - {kind: asg, name: eks-gpu-spot, max: 4}\n  - {kind: asg, tags: {a: b}}\n") == []
