"""The GPU nodes' policy (NodePublisherPolicy) as deployed, evaluated on the calls the node side makes.

`gpufleet-node busy` no longer calls autoscaling:SetInstanceProtection (issue 41): the Service
Authorization Reference lists that action on the autoScalingGroup resource with the group's tag keys
(autoscaling:ResourceTag/*, aws:ResourceTag/*) as its conditions; the instance ids and the value are
request parameters no condition key exposes, so IAM could limit it to managed groups but not to the
caller's own instance, and any node could unprotect another group's busy worker. The node writes a busy
mark instead (tests/iam/test_busy_marks_iam.py). These checks pin that the policy allows nothing in Auto
Scaling.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet_node import schema
from rehearsal.calls import ACCOUNT, REGION
from tests.iam.evaluator import evaluate
from tests.iam.template_roles import node_policy_statements

ASG = f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:u-1:autoScalingGroupName/{{}}"
MANAGED = {"autoscaling:ResourceTag/gpufleet:managed": "true", "aws:ResourceTag/gpufleet:managed": "true"}


@pytest.fixture(scope="module")
def node_policy() -> list[dict[str, Any]]:
    return node_policy_statements()


@pytest.mark.parametrize(
    ("action", "tags", "allowed"),
    [
        ("autoscaling:SetInstanceProtection", MANAGED, False),  # not even its own group's (issue 41)
        ("autoscaling:SetInstanceProtection", {}, False),  # a group gpufleet does not manage
        ("autoscaling:SetInstanceProtection", {"autoscaling:ResourceTag/gpufleet:managed": "false"}, False),
        ("autoscaling:TerminateInstanceInAutoScalingGroup", MANAGED, False),  # nodes never size their group
        ("autoscaling:SetDesiredCapacity", MANAGED, False),
        ("autoscaling:UpdateAutoScalingGroup", MANAGED, False),
    ],
)
def test_nodes_may_not_change_auto_scaling_at_all(
    node_policy: list[dict[str, Any]], action: str, tags: dict[str, str], allowed: bool
) -> None:
    verdict = evaluate(node_policy, action, ASG.format("train-jobs"), tags)
    assert verdict.allowed is allowed, verdict.why


# ---- PutMetricData: the shared namespace, and the node's own (GPU fault corroboration) ----
FORGER = {
    "aws:userid": "AROAX:i-0f0f0f0f0f0f0f0f0",
    "ec2:SourceInstanceARN": f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0f0f0f0f0f0f0f0f0",
}
VICTIM_NAMESPACE = schema.node_namespace("AROAX:i-0123456789abcdef0")


@pytest.mark.parametrize(
    ("namespace", "caller", "allowed"),
    [
        (schema.NAMESPACE, FORGER, True),  # every node writes the shared namespace (any dimension)
        (schema.node_namespace(FORGER["aws:userid"]), FORGER, True),  # and its own
        (VICTIM_NAMESPACE, FORGER, False),  # never another instance's, same role or not
        (schema.node_namespace("AROAY:i-0123456789abcdef0"), FORGER, False),  # nor a made-up role id's
        (schema.node_namespace("*"), FORGER, False),  # a literal '*' is no wildcard in StringEquals
        (schema.NODE_NAMESPACE_PREFIX + FORGER["aws:userid"] + "/x", FORGER, False),
        (VICTIM_NAMESPACE, {}, False),  # no aws:userid in the request: the variable matches nothing
        ("GPUFleet/Controller", FORGER, False),  # the controller's own metrics
    ],
)
def test_a_node_writes_only_the_shared_namespace_and_its_own(
    node_policy: list[dict[str, Any]], namespace: str, caller: dict[str, str], allowed: bool
) -> None:
    verdict = evaluate(node_policy, "cloudwatch:PutMetricData", "*", {**caller, "cloudwatch:namespace": namespace})
    assert verdict.allowed is allowed, verdict.why


def test_a_forged_namespace_never_passes_the_guards_shape_check() -> None:
    """What the policy lets a forger write never reads as the victim's own namespace to the guard."""
    assert schema.namespace_instance(schema.node_namespace(FORGER["aws:userid"])) == "i-0f0f0f0f0f0f0f0f0"
    assert schema.namespace_instance(VICTIM_NAMESPACE) == "i-0123456789abcdef0"
    assert schema.namespace_instance(schema.NAMESPACE) is None


def test_describe_tags_needs_instance_profile_credentials(node_policy: list[dict[str, Any]]) -> None:
    """DescribeTags takes no resource ARN (Resource "*" is required): the one limit IAM offers is who asks."""
    assert evaluate(node_policy, "ec2:DescribeTags", "*", FORGER).allowed
    assert not evaluate(node_policy, "ec2:DescribeTags", "*", {"aws:userid": "AIDAUSER"}).allowed
    assert not evaluate(node_policy, "ec2:DescribeInstances", "*", FORGER).allowed


# AWS's CloudWatchAgentServerPolicy, often on GPU and EKS node roles beside ours: PutMetricData anywhere.
CLOUDWATCH_AGENT = {"Effect": "Allow", "Action": ["cloudwatch:PutMetricData"], "Resource": "*"}


@pytest.mark.parametrize(
    ("namespace", "allowed"),
    [
        (VICTIM_NAMESPACE, False),  # the Deny wins over the agent's Allow
        (schema.node_namespace("AROACWAGENTROLE:i-0123456789abcdef0"), False),  # under any role id
        (schema.node_namespace(FORGER["aws:userid"]), True),
        ("CWAgent", True),  # the agent's own metrics are untouched
    ],
)
def test_another_policy_on_the_node_role_cannot_open_another_nodes_namespace(
    node_policy: list[dict[str, Any]], namespace: str, allowed: bool
) -> None:
    """IAM permissions add up: a node role that also carries the CloudWatch agent's policy may write every
    namespace, so the node policy denies every GPUFleet/Node/ namespace but the caller's own."""
    both = [*node_policy, CLOUDWATCH_AGENT]
    verdict = evaluate(both, "cloudwatch:PutMetricData", "*", {**FORGER, "cloudwatch:namespace": namespace})
    assert verdict.allowed is allowed, verdict.why


def test_usage_records_need_instance_profile_credentials(node_policy: list[dict[str, Any]]) -> None:
    """Any stream of the usage group (IAM cannot tie a stream to its writer), but only from an instance."""
    stream = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/gpufleet/usage:log-stream:i-0f0f0f0f0f0f0f0f0"
    assert evaluate(node_policy, "logs:PutLogEvents", stream, FORGER).allowed
    assert not evaluate(node_policy, "logs:PutLogEvents", stream, {"aws:userid": "AIDAUSER"}).allowed


# ---- Slurm's report (issue 41): a GPU node never writes any Slurm namespace ----
SLURM_NAMESPACES = [
    schema.SLURM_NAMESPACE,  # plain Slurm: what the scaler read before issue 41
    schema.slurm_namespace(FORGER["aws:userid"]),  # even its own userid's (the scaler never reads a GPU node's)
    schema.slurm_namespace("AROAHYPERPOD:i-0123456789abcdef0"),  # a HyperPod controller's
    schema.SLURM_NAMESPACE_PREFIX + "x",
]


@pytest.mark.parametrize("namespace", SLURM_NAMESPACES)
@pytest.mark.parametrize("agent", [False, True], ids=["node-policy", "with-cloudwatch-agent"])
def test_a_gpu_node_writes_no_slurm_namespace_with_or_without_the_cloudwatch_agent(
    node_policy: list[dict[str, Any]], namespace: str, agent: bool
) -> None:
    """DenySlurmReportNamespaces: an EKS or ASG GPU node with NodePublisherPolicy, and with the CloudWatch
    agent's policy too (PutMetricData anywhere), writes no Slurm report anywhere."""
    statements = [*node_policy, CLOUDWATCH_AGENT] if agent else node_policy
    verdict = evaluate(statements, "cloudwatch:PutMetricData", "*", {**FORGER, "cloudwatch:namespace": namespace})
    assert not verdict.allowed, verdict.why
