"""The GPU nodes' policy (NodePublisherPolicy) as deployed, evaluated on the calls the node side makes.

`gpufleet-node busy` calls autoscaling:SetInstanceProtection on its own instance. The Service
Authorization Reference lists that action on the autoScalingGroup resource with the group's tag keys
(autoscaling:ResourceTag/*, aws:ResourceTag/*) as its conditions; the instance ids are request parameters
no condition key exposes, so IAM can limit it to managed groups but not to the caller's own instance.
These checks pin what the policy allows: managed groups only, nothing else in Auto Scaling.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from samtranslator.yaml_helper import yaml_parse

from rehearsal.calls import ACCOUNT, REGION
from tests.iam.evaluator import evaluate
from tests.iam.template_roles import PARAMETERS, PHYSICAL, ROOT, _Resolver

ASG = f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:u-1:autoScalingGroupName/{{}}"
MANAGED = {"autoscaling:ResourceTag/gpufleet:managed": "true", "aws:ResourceTag/gpufleet:managed": "true"}


@pytest.fixture(scope="module")
def node_policy() -> list[dict[str, Any]]:
    original = yaml_parse((ROOT / "template.yaml").read_text())
    physical = dict(PHYSICAL, UsageLogGroup={"Arn": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/gpufleet/usage"})
    saved = copy.deepcopy(PHYSICAL)
    PHYSICAL.update(physical)
    try:
        doc = _Resolver(original, PARAMETERS)(original["Resources"]["NodePublisherPolicy"]["Properties"])
    finally:
        PHYSICAL.clear()
        PHYSICAL.update(saved)
    statements: list[dict[str, Any]] = doc["PolicyDocument"]["Statement"]
    return statements


@pytest.mark.parametrize(
    ("action", "tags", "allowed"),
    [
        ("autoscaling:SetInstanceProtection", MANAGED, True),  # the worker's own group
        ("autoscaling:SetInstanceProtection", {}, False),  # a group gpufleet does not manage
        ("autoscaling:SetInstanceProtection", {"autoscaling:ResourceTag/gpufleet:managed": "false"}, False),
        ("autoscaling:TerminateInstanceInAutoScalingGroup", MANAGED, False),  # nodes never size their group
        ("autoscaling:SetDesiredCapacity", MANAGED, False),
        ("autoscaling:UpdateAutoScalingGroup", MANAGED, False),
    ],
)
def test_nodes_may_only_protect_instances_of_managed_groups(
    node_policy: list[dict[str, Any]], action: str, tags: dict[str, str], allowed: bool
) -> None:
    verdict = evaluate(node_policy, action, ASG.format("train-jobs"), tags)
    assert verdict.allowed is allowed, verdict.why
