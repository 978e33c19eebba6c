"""`gpufleet doctor` on moto server: the demo's fleet passes; a fleet with the first-hour mistakes (an
untagged group a rule selects, an alarm named without the prefix, one with no direction, a native scaling
policy beside gpufleet, a Slack-only route without a secret) is named mistake by mistake, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

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
