"""IAM for HyperPod's UpdateCluster: the call sends each instance group's ExecutionRole back, and passing a
role to a service is iam:PassRole (the SageMaker HyperPod IAM guide's cluster-admin policy grants it beside
UpdateCluster). moto checks no IAM, so the call recorder adds the implied PassRole to every UpdateCluster it
records (rehearsal.calls.implied_calls) and the conformance suite checks it like any call; here, the
recorder's hook on a real (moto) call, and the template's grant: scoped to roles of the account passed to
SageMaker, and without it each function that may size a HyperPod group is denied."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from gpufleet.aws.hyperpod import update_spec
from rehearsal import fleet, moto_hyperpod
from rehearsal.calls import CallRecord, Resource, implied_calls
from tests.conftest import RECORDER, ROOT
from tests.iam.test_conformance import denials

SIZERS = ("scaler", "oom_guard", "spot_watch")  # the roles with SizeOnlyManagedHyperPodClusters
ROLE = moto_hyperpod.EXECUTION_ROLE
GROUP = {"InstanceGroupName": "gpu-workers", "ExecutionRole": ROLE, "InstanceType": "ml.p5.48xlarge"}


def _pass_role_calls() -> list[CallRecord]:
    [(action, resources)] = implied_calls("sagemaker:UpdateCluster", {"InstanceGroups": [update_spec(GROUP, 3)]})
    return [CallRecord(f, action, resources) for f in SIZERS]


def test_update_cluster_implies_passing_each_groups_role_to_sagemaker() -> None:
    [call, *_] = _pass_role_calls()
    assert call.action == "iam:PassRole"
    assert [(r.arn, r.context) for r in call.resources] == [(ROLE, {"iam:PassedToService": "sagemaker.amazonaws.com"})]
    assert implied_calls("sagemaker:BatchDeleteClusterNodes", {"NodeIds": ["i-1"]}) == []


def test_the_template_grants_it_only_to_sagemaker_and_without_it_each_sizer_is_denied() -> None:
    assert denials(_pass_role_calls()) == []
    other = [CallRecord("scaler", "iam:PassRole", [Resource(ROLE, {"iam:PassedToService": "ec2.amazonaws.com"})])]
    assert denials(other), "a role passed to another service must be denied"
    template = (ROOT / "template.yaml").read_text()
    assert template.count("- Sid: PassHyperPodExecutionRoles") == len(SIZERS)
    found = denials(_pass_role_calls(), template.replace("Action: iam:PassRole", "Action: iam:GetRole"))
    assert sorted(line.split(":")[0] for line in found) == sorted(SIZERS), found


@pytest.mark.integration
def test_the_recorder_adds_the_implied_pass_role_to_a_real_update_cluster(aws: str) -> None:
    sm = boto3.client("sagemaker")
    moto_hyperpod.create_cluster(sm, "slurm-a", "gpu-workers", tags=fleet.MANAGED_TAG)
    before = len(RECORDER.records)
    scope: dict[str, Any] = {"__name__": "gpufleet.scaling.service", "sm": sm, "spec": update_spec(GROUP, 1)}
    exec("sm.update_cluster(ClusterName='slurm-a', InstanceGroups=[spec])", scope)  # as if the scaler's module
    made = [(r.function, r.action, [x.arn for x in r.resources]) for r in RECORDER.records[before:]]
    assert ("scaler", "iam:PassRole", [ROLE]) in made, made
    assert denials(RECORDER.records[before:]) == []  # the whole call, as the conformance suite checks it


def test_the_controller_nodes_role_allows_what_the_publisher_calls_and_no_more() -> None:
    """ami/slurm_pending_gpus.py on the controller node: PutMetricData into its own Slurm/${aws:userid}
    only (never plain Slurm: issue 41), and (for node ids the resource file lacks) ListClusterNodes and
    DescribeClusterNode on its own account's clusters."""
    import json

    from rehearsal.calls import ACCOUNT, REGION
    from tests.iam.evaluator import evaluate

    doc = json.loads((ROOT / "ami/hyperpod/execution-role-controller.json").read_text())
    statements = doc["Statement"]
    cluster = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:cluster/abc123"
    own = {"aws:ResourceAccount": ACCOUNT, "aws:PrincipalAccount": ACCOUNT}
    for action in ("sagemaker:ListClusterNodes", "sagemaker:DescribeClusterNode"):
        assert evaluate(statements, action, cluster, own).allowed, action
        other = {**own, "aws:ResourceAccount": "999999999999"}
        assert not evaluate(statements, action, cluster.replace(ACCOUNT, "999999999999"), other).allowed
    me = {"aws:userid": "AROACONTROLLER:i-0c0c0c0c0c0c0c0c0"}
    own = {**me, "cloudwatch:namespace": "Slurm/AROACONTROLLER:i-0c0c0c0c0c0c0c0c0"}
    assert evaluate(statements, "cloudwatch:PutMetricData", "*", own).allowed
    assert not evaluate(statements, "cloudwatch:PutMetricData", "*", {**me, "cloudwatch:namespace": "Slurm"}).allowed
    assert not evaluate(statements, "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "GPUFleet"}).allowed
    for action in ("sagemaker:UpdateCluster", "sagemaker:BatchDeleteClusterNodes"):
        assert not evaluate(statements, action, cluster, own).allowed, action
