"""The evaluator against AWS's documented policy evaluation rules, one row per rule it relies on."""

from __future__ import annotations

from typing import Any

import pytest

from tests.iam.evaluator import evaluate

ASG = "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:u-1:autoScalingGroupName/train"
TABLE = "arn:aws:dynamodb:us-east-1:123456789012:table/gpufleet-state"
TAGGED = {
    "Effect": "Allow",
    "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:Terminate*"],
    "Resource": "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/*",
    "Condition": {"StringEquals": {"autoscaling:ResourceTag/gpufleet:managed": "true"}},
}
LEADING = {
    "Effect": "Allow",
    "Action": "dynamodb:*Item",
    "Resource": TABLE,
    "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["GROUP#*", "IDEMPOTENCY#scaler"]}},
}
MANAGED = {"autoscaling:ResourceTag/gpufleet:managed": "true"}


@pytest.mark.parametrize(
    ("statements", "action", "resource", "context", "allowed"),
    [
        ([], "autoscaling:SetDesiredCapacity", ASG, {}, False),  # implicit deny
        ([TAGGED], "autoscaling:SetDesiredCapacity", ASG, MANAGED, True),
        ([TAGGED], "AUTOSCALING:setdesiredcapacity", ASG, MANAGED, True),  # action names are case-insensitive
        ([TAGGED], "autoscaling:TerminateInstanceInAutoScalingGroup", ASG, MANAGED, True),  # action wildcard
        ([TAGGED], "autoscaling:SetDesiredCapacity", ASG, {}, False),  # tag absent: the condition fails
        ([TAGGED], "autoscaling:SetDesiredCapacity", ASG, {"autoscaling:ResourceTag/gpufleet:managed": "TRUE"}, False),
        ([TAGGED], "autoscaling:SetDesiredCapacity", ASG.replace("us-east-1", "eu-west-1"), MANAGED, False),
        (
            [TAGGED, {**TAGGED, "Effect": "Deny", "Condition": {}}],
            "autoscaling:SetDesiredCapacity",
            ASG,
            MANAGED,
            False,
        ),
        ([LEADING], "dynamodb:GetItem", TABLE, {"dynamodb:LeadingKeys": ["GROUP#asg:a"]}, True),
        ([LEADING], "dynamodb:BatchGetItem", TABLE, {"dynamodb:LeadingKeys": ["GROUP#a", "INCIDENT"]}, False),
        ([LEADING], "dynamodb:GetItem", TABLE, {}, True),  # ForAllValues holds when the key is absent (AWS's caveat)
        (
            [{**LEADING, "Condition": {**LEADING["Condition"], "Null": {"dynamodb:LeadingKeys": "false"}}}],
            "dynamodb:GetItem",
            TABLE,
            {},
            False,  # ...which the template closes with Null: false
        ),
        (
            [{**TAGGED, "Condition": {"StringEqualsIfExists": {"autoscaling:ResourceTag/team": "ml"}}}],
            "autoscaling:SetDesiredCapacity",
            ASG,
            {},
            True,  # IfExists: an absent key does not fail the condition
        ),
        (
            [{**TAGGED, "Condition": {"ForAllValues:StringEquals": {"aws:TagKeys": ["gpufleet:managed"]}}}],
            "autoscaling:SetDesiredCapacity",
            ASG,
            {"aws:TagKeys": ["gpufleet:managed", "owner"]},
            False,  # ForAllValues: every requested tag key must be allowed
        ),
        ([{**TAGGED, "Resource": "*", "Condition": {}}], "autoscaling:SetDesiredCapacity", ASG, {}, True),
        ([{"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}], "autoscaling:SetDesiredCapacity", ASG, {}, True),
    ],
)
def test_documented_evaluation_rules(
    statements: list[dict[str, Any]], action: str, resource: str, context: dict[str, Any], allowed: bool
) -> None:
    assert evaluate(statements, action, resource, context).allowed is allowed


def test_a_denial_says_which_grant_fell_short() -> None:
    verdict = evaluate([TAGGED], "autoscaling:SetDesiredCapacity", ASG, {})
    assert "grants it but its condition" in verdict.why and "gpufleet:managed" in verdict.why


OWN = {
    "Effect": "Allow",
    "Action": "cloudwatch:PutMetricData",
    "Resource": "*",
    "Condition": {"StringEquals": {"cloudwatch:namespace": ["GPUFleet", "GPUFleet/Node/${aws:userid}"]}},
}
STREAM = {  # a variable in a Resource (IAM User Guide, "Where you can use policy variables")
    "Effect": "Allow",
    "Action": "logs:PutLogEvents",
    "Resource": "arn:aws:logs:us-east-1:123456789012:log-group:/g:log-stream:${aws:userid}",
}
FORGER = {"aws:userid": "AROAX:i-forger"}


@pytest.mark.parametrize(
    ("statements", "action", "resource", "context", "allowed"),
    [
        (
            [OWN],
            "cloudwatch:PutMetricData",
            "*",
            {**FORGER, "cloudwatch:namespace": "GPUFleet/Node/AROAX:i-forger"},
            True,
        ),
        (
            [OWN],
            "cloudwatch:PutMetricData",
            "*",
            {**FORGER, "cloudwatch:namespace": "GPUFleet/Node/AROAX:i-victim"},
            False,
        ),
        ([OWN], "cloudwatch:PutMetricData", "*", {**FORGER, "cloudwatch:namespace": "GPUFleet"}, True),
        ([OWN], "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "GPUFleet/Node/AROAX:i-victim"}, False),
        (
            [OWN],
            "cloudwatch:PutMetricData",
            "*",
            {"AWS:UserId": "AROAX:i-victim", "cloudwatch:namespace": "GPUFleet/Node/AROAX:i-victim"},
            True,
        ),
        ([STREAM], "logs:PutLogEvents", STREAM["Resource"].replace("${aws:userid}", "AROAX:i-forger"), FORGER, True),
        ([STREAM], "logs:PutLogEvents", STREAM["Resource"].replace("${aws:userid}", "AROAX:i-victim"), FORGER, False),
        ([STREAM], "logs:PutLogEvents", STREAM["Resource"].replace("${aws:userid}", "AROAX:i-forger"), {}, False),
        (  # a substituted value is literal: a '*' in it is no wildcard
            [{**OWN, "Condition": {"StringLike": {"cloudwatch:namespace": "GPUFleet/Node/${aws:userid}"}}}],
            "cloudwatch:PutMetricData",
            "*",
            {"aws:userid": "AROAX:*", "cloudwatch:namespace": "GPUFleet/Node/AROAX:i-victim"},
            False,
        ),
        (  # ${*} is a literal '*'
            [{**OWN, "Condition": {"StringLike": {"cloudwatch:namespace": "GPUFleet/${*}"}}}],
            "cloudwatch:PutMetricData",
            "*",
            {"cloudwatch:namespace": "GPUFleet/x"},
            False,
        ),
    ],
)
def test_policy_variables(
    statements: list[dict[str, Any]], action: str, resource: str, context: dict[str, Any], allowed: bool
) -> None:
    assert evaluate(statements, action, resource, context).allowed is allowed
