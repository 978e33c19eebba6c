"""A `kind: hyperpod` rule: one line when it cannot name a group, and the problems validate-policy tells."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet.policy.checks import policy_problems
from gpufleet.policy.fleet import FleetPolicy, GroupRule


def test_a_named_hyperpod_rule_needs_its_cluster() -> None:
    with pytest.raises(ValidationError, match="a hyperpod rule with a name also needs its cluster"):
        GroupRule(kind=GroupKind.HYPERPOD, name="gpu-a")
    rule = GroupRule(kind=GroupKind.HYPERPOD, cluster="ml", name="gpu-a", max=4)
    assert rule.explicit_ref() == GroupRef(kind=GroupKind.HYPERPOD, cluster="ml", name="gpu-a")


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ({"kind": "hyperpod", "cluster": "ml", "name": "gpu-a", "max": 4}, []),
        ({"kind": "hyperpod", "cluster": "ml", "name": "gpu-a"}, ["has no max of its own"]),
        ({"kind": "hyperpod", "cluster": "ml", "name": "gpu-*", "max": 4}, ["finds only the instance group it names"]),
    ],
)
def test_validate_policy_tells_a_hyperpod_rule_that_cannot_work(rule: dict[str, object], said: list[str]) -> None:
    problems = [p for p in policy_problems(FleetPolicy.model_validate({"groups": [rule]})) if "hyperpod" in p.lower()]
    assert len(problems) == len(said) and all(s in p for s, p in zip(said, problems, strict=True))


def test_a_hyperpod_backlog_needs_no_gpus_per_node() -> None:
    """Its instance group has one instance type (ml.p5.48xlarge): the scaler asks EC2 for its GPUs, so
    validate-policy does not ask for demand.gpus_per_node as it does for a plain ASG."""
    metric = {"metric": {"namespace": "Slurm", "metric_name": "PendingGPUs"}}
    hyperpod = {"kind": "hyperpod", "cluster": "ml", "name": "gpu-a", "max": 4, "demand": metric}
    plain = {"kind": "asg", "name": "slurm-gpu", "demand": metric}
    problems = policy_problems(FleetPolicy.model_validate({"groups": [hyperpod, plain]}))
    assert [p for p in problems if "gpus_per_node" in p] == [
        "groups[1] (slurm-gpu): demand.metric needs demand.gpus_per_node (GPUs per instance of the ASG)"
    ]
