"""`gpufleet doctor` on a HyperPod cluster's execution roles (issue 41), on moto server: one role shared by
the controller and worker groups (AWS's samples) is an error (HyperPod gives every node of a role one
aws:userid, so the workers could write the controller's report and gpufleet trusts none); a controller role of its
own, carrying the Deny on other Slurm namespaces, passes; a cluster whose controller group cannot be told is
an error (gpufleet trusts none of its Slurm report). The pure rules: tools/gpufleet_tools/doctor/hyperpod_roles.py."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from gpufleet_tools.cli import main
from rehearsal import fleet, moto_hyperpod
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
POLICY = """
notifications: {default_route: {sns: false}}
groups:
  - {kind: hyperpod, cluster: slurm-a, name: gpu-workers, max: 4}
"""
CONTROLLER_ROLE = "arn:aws:iam::123456789012:role/gpufleet-hyperpod-controller"
AGENT = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*"}],
}


def _doctor(capsys: pytest.CaptureFixture[str], tmp_path: Path, aws: str) -> list[str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    main(["doctor", "--policy", str(policy), "--endpoint", aws])
    return [line for line in capsys.readouterr().out.splitlines() if "hyperpod:slurm-a:" in line]


def _attach(role_arn: str, name: str, doc: dict) -> None:
    boto3.client("iam").put_role_policy(
        RoleName=role_arn.rsplit("/", 1)[-1], PolicyName=name, PolicyDocument=json.dumps(doc)
    )


def test_a_shared_execution_role_is_an_error_with_what_it_allows(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moto_hyperpod.create_cluster(
        boto3.client("sagemaker"),
        "slurm-a",
        "gpu-workers",
        tags=fleet.MANAGED_TAG,
        controller_role=moto_hyperpod.EXECUTION_ROLE,  # the workers' own: shared
    )
    _attach(moto_hyperpod.EXECUTION_ROLE, "cloudwatch-agent", AGENT)
    lines = _doctor(capsys, tmp_path, aws)
    shared = [line for line in lines if "shares its execution role" in line]
    assert len(shared) == 1 and shared[0].startswith("error"), lines
    assert "<role id>:SageMaker" in shared[0] and "drain-marks GetItem" in shared[0]
    assert any("lacks DenyOtherSlurmReportNamespaces" in line for line in lines), lines


def test_a_controller_role_of_its_own_with_the_deny_passes(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sm = boto3.client("sagemaker")
    moto_hyperpod.create_cluster(sm, "slurm-a", "gpu-workers", tags=fleet.MANAGED_TAG, controller_role=CONTROLLER_ROLE)
    for role, doc in ((CONTROLLER_ROLE, "controller"), (moto_hyperpod.EXECUTION_ROLE, "worker")):
        _attach(role, "gpufleet", json.loads((ROOT / f"ami/hyperpod/execution-role-{doc}.json").read_text()))
        _attach(role, "cloudwatch-agent", AGENT)
    lines = _doctor(capsys, tmp_path, aws)
    assert [line.split()[0] for line in lines] == ["ok"], lines


def test_a_cluster_whose_controller_cannot_be_told_is_an_error(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moto_hyperpod.create_cluster(
        boto3.client("sagemaker"), "slurm-a", "gpu-workers", tags=fleet.MANAGED_TAG, slurm_config=False
    )
    lines = _doctor(capsys, tmp_path, aws)
    assert any(line.startswith("error") and "gpufleet:slurm-controller-group" in line for line in lines), lines
