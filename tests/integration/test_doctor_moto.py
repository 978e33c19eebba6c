"""`gpufleet doctor` on moto server: the demo's fleet passes; a fleet with the first-hour mistakes (an
untagged group a rule selects, an alarm named without the prefix, one with no direction, a native scaling
policy beside gpufleet, a Slack-only route without a secret) is named mistake by mistake, exit code 2; so
are issue 23's alarms that cannot work (inverted, doubled, orphaned) and a misspelt group, and `gpufleet
alarms --apply` puts nothing for a group the account does not have."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest

from gpufleet.domain.models import GroupRef
from gpufleet_tools.alarm_specs import put_metric_alarm_args, scaling_alarms
from gpufleet_tools.cli import main
from rehearsal import fleet
from rehearsal.scenario import Rehearsal
from rehearsal.slack import slack_receiver

pytestmark = pytest.mark.integration


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(["doctor", *args])
    return code, capsys.readouterr().out.splitlines()


def test_the_demos_fleet_passes(aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with slack_receiver() as slack:
        demo = Rehearsal(tmp_path, slack, echo=lambda _: None)
        demo.setup()
    stack = demo.stack
    assert stack.secret_arn is not None
    code, lines = doctor(
        capsys,
        "--policy",
        str(tmp_path / "policy.yaml"),
        "--endpoint",
        aws,
        "--slack-secret",
        stack.secret_arn,
        "--topic",
        stack.topic_arn,
    )
    assert code == 0, lines
    assert lines[-1].startswith("0 error(s), 0 warning(s)")
    assert any(line.startswith("ok      gpufleet-infer-gpu-high: acts on group eks:ml/infer-gpu") for line in lines)


POLICY = """
alarm_prefix: gpufleet-
notifications: {default_route: {sns: false}}
groups:
  - {name: train-spot, kind: asg, max: 6}
  - {name: train-dev, kind: asg, max: 2}
"""


def test_each_mistake_on_a_real_shaped_account_is_named(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "train-spot", min_size=0, max_size=8, desired=1, tags=fleet.MANAGED_TAG)
    fleet.create_asg(clients, "train-dev", min_size=0, max_size=2, desired=0)  # selected, never tagged
    dims = {"AutoScalingGroupName": "train-spot"}
    fleet.put_gpu_alarm(clients.cloudwatch, "train-gpu-high", dims, direction="out", threshold=85, evaluation_periods=2)
    clients.cloudwatch.put_metric_alarm(  # the prefix, but no direction tag or mapping
        AlarmName="gpufleet-train-gpu-low",
        Namespace="GPUFleet",
        MetricName="GPUUtilization",
        Dimensions=[{"Name": k, "Value": v} for k, v in dims.items()],
        Statistic="Average",
        Period=60,
        EvaluationPeriods=4,
        Threshold=20,
        ComparisonOperator="LessThanThreshold",
    )
    clients.autoscaling.put_scaling_policy(
        AutoScalingGroupName="train-spot",
        PolicyName="cpu-target",
        PolicyType="TargetTrackingScaling",
        TargetTrackingConfiguration={
            "PredefinedMetricSpecification": {"PredefinedMetricType": "ASGAverageCPUUtilization"},
            "TargetValue": 50.0,
        },
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    code, lines = doctor(capsys, "--policy", str(policy), "--endpoint", aws)
    assert code == 2, lines
    expected = [
        "error   asg:train-dev: a rule selects it but it is not tagged gpufleet:managed=true",
        "error   gpufleet-train-gpu-low: cannot act on it:",
        "error   notifications.default_route: leads nowhere: Slack secret not configured",
        "warning asg:train-spot: native scaling policies (cpu-target) also size it",
        "warning train-gpu-high: reads asg:train-spot's GPU metrics but its name lacks the prefix 'gpufleet-'",
        "warning asg:train-dev: no alarm named 'gpufleet-*' points at it",
    ]
    for needle in expected:
        assert any(line.startswith(needle) for line in lines), (needle, lines)


TYPO_POLICY = """
alarm_prefix: gpufleet-
notifications: {default_route: {sns: false, slack: false}}
groups:
  - {name: train-spto, kind: asg, max: 6}
"""


def _put_pair(clients: fleet.Clients, group: str, high: float, low: float, stem: str | None = None) -> None:
    """The pair `gpufleet alarms` would put, thresholds unchecked: what an account may already hold."""
    ref = GroupRef.parse_key(group)
    for spec in scaling_alarms(ref, "gpufleet-", high=high, low=low, stem=stem):
        clients.cloudwatch.put_metric_alarm(**put_metric_alarm_args(spec))


def test_issue_23_alarms_that_cannot_work_and_a_misspelt_group_are_named(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before issue 23 doctor called all of these alarms ok: an inverted pair, a second pair on the same
    group, and a pair on a group that does not exist; and it did not say which group a typo meant."""
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "train-spot", min_size=0, max_size=8, desired=2, tags=fleet.MANAGED_TAG)
    _put_pair(clients, "asg:train-spot", 85, 20, stem="train")  # `local up --example`'s pair
    _put_pair(clients, "asg:train-spot", 20, 80)  # inverted: `alarms --high 20 --low 80 --apply` before the fix
    _put_pair(clients, "asg:nope", 85, 20)  # `alarms asg:nope --apply` before the fix
    policy = tmp_path / "policy.yaml"
    policy.write_text(TYPO_POLICY)
    code, lines = doctor(capsys, "--policy", str(policy), "--endpoint", aws)
    assert code == 2, lines
    expected = [
        "error   asg:train-spto: a rule names asg:train-spto, which this account and region do not have: did you "
        "mean asg:train-spot?",
        "error   asg:train-spot: inverted alarm pair on its GPUUtilization: gpufleet-train-spot-gpu-high scales out "
        "above 20 but gpufleet-train-spot-gpu-low scales in below 80: from 20 to 80 both fire",
        "warning asg:train-spot: several alarm pairs read its GPUUtilization",
        "warning gpufleet-nope-gpu-high: points at asg:nope, which this account and region do not have",
        "warning gpufleet-nope-gpu-low: points at asg:nope, which this account and region do not have",
    ]
    for needle in expected:
        assert any(line.startswith(needle) for line in lines), (needle, lines)
    doubled = next(line for line in lines if "several alarm pairs" in line)
    assert doubled.endswith("delete-alarms --alarm-names gpufleet-train-gpu-high gpufleet-train-gpu-low")


@pytest.mark.parametrize(
    ("groups", "line"),
    [
        (
            ["asg:train-spto"],
            "error: asg:train-spto does not exist in this account and region: no alarm was put; "
            "did you mean asg:train-spot?",
        ),
        (
            ["asg:nope"],
            "error: asg:nope does not exist in this account and region: no alarm was put; the managed "
            "groups here: asg:train-spot",
        ),
        (["asg:train-spot", "asg:nope"], "error: asg:nope does not exist"),  # all or nothing
        (["asg:train-dev"], ""),  # exists, untagged: its alarms are put (doctor says it is not managed)
        (["asg:train-spot"], ""),
    ],
)
def test_alarms_apply_puts_alarms_only_for_groups_that_exist(
    aws: str, groups: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "train-spot", min_size=0, max_size=8, desired=2, tags=fleet.MANAGED_TAG)
    fleet.create_asg(clients, "train-dev", min_size=0, max_size=2, desired=0)
    code = main(["alarms", *groups, "--apply", "--endpoint", aws])
    err = capsys.readouterr().err.splitlines()
    names = [a["AlarmName"] for a in clients.cloudwatch.describe_alarms()["MetricAlarms"]]
    if line:
        assert code == 2 and len(err) == 1 and err[0].startswith(line), err
        assert names == []
    else:
        assert code == 0 and sorted(names) == sorted(
            f"gpufleet-{g[4:]}-gpu-{s}" for g in groups for s in ("high", "low")
        )


def test_alarms_put_by_the_cli_pass_doctor(aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "train-spot", min_size=0, max_size=8, desired=2, tags=fleet.MANAGED_TAG)
    assert main(["alarms", "asg:train-spot", "--high", "80", "--low", "25", "--apply", "--endpoint", aws]) == 0
    policy = tmp_path / "policy.yaml"
    policy.write_text(TYPO_POLICY.replace("train-spto", "train-spot").replace("sns: false", "sns: true"))
    topic = boto3.client("sns").create_topic(Name="gpufleet-notify")["TopicArn"]
    code, lines = doctor(capsys, "--policy", str(policy), "--endpoint", aws, "--topic", topic)
    assert code == 0, lines


LOCAL_POLICY = """
alarm_prefix: gpufleet-
notifications: {default_route: {sns: false, slack: false}}
groups:
  - {name: infer-gpu, kind: eks-nodegroup, cluster: ml, max: 4, demand: {kubernetes: {}}}
"""


def test_the_pod_check_passes_on_the_local_stack(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a node group made on the local stack had only moto's DescribeCluster, whose endpoint nobody
    serves and whose certificate authority is random text ("the certificate authority data is not
    base64"); with an endpoint and token in GPUFLEET_KUBE_ENDPOINTS, doctor still wanted EKS access entries,
    which moto cannot list, so it never passed. `local nodegroup` now serves the cluster's API on loopback
    and doctor, like the scaler, reads a cluster given a token with that token."""
    from gpufleet_tools import local_kube, local_servers, local_stack

    local_stack.create_nodegroup(aws, "ml", "infer-gpu", (0, 4, 1), "g5.12xlarge", fleet.MANAGED_TAG)
    policy = tmp_path / "policy.yaml"
    policy.write_text(LOCAL_POLICY)
    _, lines = doctor(capsys, "--policy", str(policy), "--endpoint", aws)
    [line] = [x for x in lines if "demand source cluster ml" in x]
    assert line.startswith("error") and "the certificate authority data is not base64" in line  # moto's own
    try:
        local_kube.start(tmp_path, "ml", local_servers.free_port())
        local_kube.add_pod(tmp_path, "ml", local_kube.waiting_pod("team-a", "train-0", 4, {}, datetime.now(UTC)))
        monkeypatch.setenv("GPUFLEET_KUBE_ENDPOINTS", json.dumps(local_kube.endpoints(tmp_path)))
        _, lines = doctor(capsys, "--policy", str(policy), "--endpoint", aws)
    finally:
        local_kube.stop_all(tmp_path)
    [line] = [x for x in lines if "demand source cluster ml" in x]
    assert line.startswith("ok      eks:ml/infer-gpu: demand source cluster ml: the API answers: 1 pod(s) waiting"), (
        line
    )
