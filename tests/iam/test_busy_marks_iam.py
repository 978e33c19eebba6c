"""Busy marks (issue 41) under IAM as deployed: a node writes and deletes only the busy item keyed by
its own aws:userid, whatever else its role carries; it cannot touch scale-in protection at all; the
scaler may protect only instances of managed groups. Evaluated with the project's evaluator on the
template's NodePublisherPolicy, alone and beside AWS's CloudWatchAgentServerPolicy."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet_node import schema
from rehearsal.calls import ACCOUNT, REGION
from tests.iam.evaluator import evaluate
from tests.iam.template_roles import MANAGED as AWS_MANAGED
from tests.iam.template_roles import function_statements, node_policy_statements
from tests.iam.test_node_policy import MANAGED

TABLE = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{schema.BUSY_TABLE}"
STATE = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpufleet-state"
ASG = f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:u-1:autoScalingGroupName/jobs"
WORKER = "AROAWORKERROLE:i-0123456789abcdef0"
OTHER_GROUPS_NODE = {  # a node of another group, on the same node role or another carrying the policy
    "aws:userid": "AROAWORKERROLE:i-0f0f0f0f0f0f0f0f0",
    "ec2:SourceInstanceARN": f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0f0f0f0f0f0f0f0f0",
}
# CloudWatchAgentServerPolicy as AWS publishes it (v1.x): metrics, logs, tags, its SSM parameters and
# X-Ray's write actions (as AWSXrayWriteOnlyAccess); no DynamoDB, no Auto Scaling.
CLOUDWATCH_AGENT_FULL = [
    {
        "Effect": "Allow",
        "Action": [
            "cloudwatch:PutMetricData",
            "ec2:DescribeVolumes",
            "ec2:DescribeTags",
            "logs:PutLogEvents",
            "logs:PutRetentionPolicy",
            "logs:DescribeLogStreams",
            "logs:DescribeLogGroups",
            "logs:CreateLogStream",
            "logs:CreateLogGroup",
            *AWS_MANAGED["AWSXrayWriteOnlyAccess"][0]["Action"],
        ],
        "Resource": "*",
    },
    {"Effect": "Allow", "Action": ["ssm:GetParameter"], "Resource": "arn:aws:ssm:*:*:parameter/AmazonCloudWatch-*"},
]


@pytest.fixture(scope="module")
def node_policy() -> list[dict[str, Any]]:
    return node_policy_statements()


def _on(key: str, caller: dict[str, str]) -> dict[str, Any]:
    return {**caller, "dynamodb:LeadingKeys": [key]}


@pytest.mark.parametrize("extra", [[], CLOUDWATCH_AGENT_FULL], ids=["alone", "with-cloudwatch-agent"])
@pytest.mark.parametrize(
    ("action", "key", "allowed"),
    [
        ("dynamodb:PutItem", OTHER_GROUPS_NODE["aws:userid"], True),  # its own mark
        ("dynamodb:DeleteItem", OTHER_GROUPS_NODE["aws:userid"], True),  # and its own unmark
        ("dynamodb:PutItem", WORKER, False),  # never another node's, same role or not
        ("dynamodb:DeleteItem", WORKER, False),  # so it cannot drop a busy worker's mark
        ("dynamodb:PutItem", "gpufleet#protected#i-0123456789abcdef0", False),  # nor the scaler's records
        ("dynamodb:PutItem", "*", False),  # a literal '*' is no wildcard in StringEquals
        ("dynamodb:Scan", "", False),  # nor read the table
    ],
)
def test_a_node_marks_only_itself(
    node_policy: list[dict[str, Any]], extra: list[dict[str, Any]], action: str, key: str, allowed: bool
) -> None:
    context = _on(key, OTHER_GROUPS_NODE) if key else dict(OTHER_GROUPS_NODE)
    verdict = evaluate([*node_policy, *extra], action, TABLE, context)
    assert verdict.allowed is allowed, verdict.why


@pytest.mark.parametrize("extra", [[], CLOUDWATCH_AGENT_FULL], ids=["alone", "with-cloudwatch-agent"])
@pytest.mark.parametrize("value", [True, False])
def test_a_node_cannot_change_any_protection(
    node_policy: list[dict[str, Any]], extra: list[dict[str, Any]], value: bool
) -> None:
    """The two calls of the finding (unprotect the busy worker, protect a spare) are both refused."""
    verdict = evaluate(
        [*node_policy, *extra], "autoscaling:SetInstanceProtection", ASG, {**OTHER_GROUPS_NODE, **MANAGED}
    )
    assert not verdict.allowed, verdict.why


def test_credentials_other_than_an_instance_profile_mark_nothing(node_policy: list[dict[str, Any]]) -> None:
    """A pod's IRSA role or static keys carrying the policy: no ec2:SourceInstanceARN, no mark."""
    caller = {"aws:userid": "AROAPODROLE:botocore-session-1"}
    assert not evaluate(node_policy, "dynamodb:PutItem", TABLE, _on(caller["aws:userid"], caller)).allowed


def test_a_request_without_a_key_is_refused(node_policy: list[dict[str, Any]]) -> None:
    """ForAllValues over an empty set holds vacuously: the Null condition refuses a keyless request."""
    assert not evaluate(node_policy, "dynamodb:PutItem", TABLE, dict(OTHER_GROUPS_NODE)).allowed


def test_the_node_role_cannot_reach_the_state_table(node_policy: list[dict[str, Any]]) -> None:
    context = _on(OTHER_GROUPS_NODE["aws:userid"], OTHER_GROUPS_NODE)
    assert not evaluate(node_policy, "dynamodb:PutItem", STATE, context).allowed


def test_the_scaler_protects_only_managed_groups() -> None:
    scaler = function_statements()["scaler"]
    assert evaluate(scaler, "autoscaling:SetInstanceProtection", ASG, MANAGED).allowed
    assert not evaluate(scaler, "autoscaling:SetInstanceProtection", ASG, {}).allowed
    assert evaluate(scaler, "dynamodb:Scan", TABLE, {}).allowed
