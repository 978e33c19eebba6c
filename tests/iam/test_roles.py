"""What the deployed roles allow on groups gpufleet must not touch, evaluated on the expanded template:
an untagged ASG stays untouchable; only ASGs EKS tagged as a node group's can be adopted, only with
gpufleet:managed=true and no other tag; a backing ASG is changed only once adopted."""

from __future__ import annotations

from typing import Any

import pytest

from rehearsal.fleet import eks_backing_asg_tags
from tests.iam.evaluator import evaluate
from tests.iam.template_roles import function_statements

ASG = "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:u-1:autoScalingGroupName/{}"
ACTORS = ("scaler", "oom_guard", "spot_watch")


@pytest.fixture(scope="module")
def roles() -> dict[str, list[dict[str, Any]]]:
    return function_statements()


def tags(values: dict[str, str]) -> dict[str, str]:
    return {f"{p}:ResourceTag/{k}": v for p in ("aws", "autoscaling") for k, v in values.items()}


def adopt(values: dict[str, str], request: dict[str, str]) -> dict[str, Any]:
    return {**tags(values), "aws:TagKeys": list(request), **{f"aws:RequestTag/{k}": v for k, v in request.items()}}


EKS = eks_backing_asg_tags("ml", "infer-gpu")


@pytest.mark.parametrize("function", ACTORS)
@pytest.mark.parametrize(
    ("action", "group_tags", "allowed"),
    [
        ("autoscaling:TerminateInstanceInAutoScalingGroup", {}, False),  # an untagged ASG in the account
        ("autoscaling:SetDesiredCapacity", {"team": "ml"}, False),
        ("autoscaling:TerminateInstanceInAutoScalingGroup", EKS, False),  # a node group's ASG, not adopted
        ("autoscaling:TerminateInstanceInAutoScalingGroup", {**EKS, "gpufleet:managed": "true"}, True),
        ("autoscaling:SetDesiredCapacity", {"gpufleet:managed": "true"}, True),
    ],
)
def test_changes_need_the_managed_tag(
    roles: dict[str, list[dict[str, Any]]], function: str, action: str, group_tags: dict[str, str], allowed: bool
) -> None:
    verdict = evaluate(roles[function], action, ASG.format("g"), tags(group_tags))
    assert verdict.allowed is allowed, verdict.why


@pytest.mark.parametrize("function", ACTORS)
@pytest.mark.parametrize(
    ("group_tags", "request_tags", "allowed"),
    [
        (EKS, {"gpufleet:managed": "true"}, True),  # adopting a node group's backing ASG
        ({}, {"gpufleet:managed": "true"}, False),  # a plain untagged ASG cannot be tagged into scope
        ({"team": "ml"}, {"gpufleet:managed": "true"}, False),
        (EKS, {"gpufleet:managed": "true", "owner": "x"}, False),  # no other tag
        (EKS, {"gpufleet:managed": "false"}, False),
        (EKS, {"eks:nodegroup-name": "other"}, False),  # EKS's own tags cannot be rewritten
    ],
)
def test_adoption_is_limited_to_eks_backing_asgs_and_our_tag(
    roles: dict[str, list[dict[str, Any]]],
    function: str,
    group_tags: dict[str, str],
    request_tags: dict[str, str],
    allowed: bool,
) -> None:
    verdict = evaluate(
        roles[function], "autoscaling:CreateOrUpdateTags", ASG.format("g"), adopt(group_tags, request_tags)
    )
    assert verdict.allowed is allowed, verdict.why


@pytest.mark.parametrize("function", ["scaler", "oom_guard", "spot_watch", "notifier"])
def test_state_table_access_is_limited_to_each_functions_own_keys(
    roles: dict[str, list[dict[str, Any]]], function: str
) -> None:
    table = "arn:aws:dynamodb:us-east-1:123456789012:table/gpufleet-state"
    own = ["INCIDENT"] if function == "notifier" else ["GROUP#asg:train"]
    other = ["GROUP#asg:train"] if function == "notifier" else ["INCIDENT"]
    assert evaluate(roles[function], "dynamodb:GetItem", table, {"dynamodb:LeadingKeys": own}).allowed
    assert not evaluate(roles[function], "dynamodb:GetItem", table, {"dynamodb:LeadingKeys": other}).allowed
    assert not evaluate(roles[function], "dynamodb:Scan", table, {}).allowed


def test_the_notifier_consumes_only_its_own_queue(roles: dict[str, list[dict[str, Any]]]) -> None:
    queue = "arn:aws:sqs:us-east-1:123456789012:{}"
    assert evaluate(roles["notifier"], "sqs:ReceiveMessage", queue.format("gpufleet-notify"), {}).allowed
    assert not evaluate(roles["notifier"], "sqs:ReceiveMessage", queue.format("someone-elses-queue"), {}).allowed
    assert not evaluate(roles["notifier"], "sqs:DeleteMessage", queue.format("someone-elses-queue"), {}).allowed
