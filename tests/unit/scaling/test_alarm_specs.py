"""`gpufleet alarms`: the scaling alarms a group needs, which the scaler and the doctor then resolve to that
group and direction (the same rules decide both)."""

from __future__ import annotations

import pytest

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import Direction, GroupObservation, GroupRef, MetricRef
from gpufleet.policy.fleet import parse_policy
from gpufleet_node import schema
from gpufleet_tools.alarm_specs import cloudformation, put_metric_alarm_args, scaling_alarms
from gpufleet_tools.doctor.core import AccountView, AlarmView, Level, Presence, diagnose

ASG = GroupRef(kind=GroupKind.ASG, name="train-p4d")
EKS = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="infer-g6")


@pytest.mark.parametrize(
    ("ref", "names", "dims"),
    [
        (ASG, ["gpufleet-train-p4d-gpu-high", "gpufleet-train-p4d-gpu-low"], {schema.DIM_ASG_NAME: "train-p4d"}),
        (
            EKS,
            ["gpufleet-ml-infer-g6-gpu-high", "gpufleet-ml-infer-g6-gpu-low"],
            {schema.DIM_CLUSTER_NAME: "ml", schema.DIM_NODEGROUP_NAME: "infer-g6"},
        ),
    ],
)
def test_a_pair_per_group_on_its_own_dimensions(ref: GroupRef, names: list[str], dims: dict[str, str]) -> None:
    high, low = scaling_alarms(ref, "gpufleet-", high=85, low=20)
    assert [high.name, low.name] == names and high.dimensions == low.dimensions == dims
    out, into = put_metric_alarm_args(high), put_metric_alarm_args(low)
    assert (out["ComparisonOperator"], out["Threshold"], out["EvaluationPeriods"]) == ("GreaterThanThreshold", 85, 2)
    assert (into["ComparisonOperator"], into["Threshold"], into["EvaluationPeriods"]) == ("LessThanThreshold", 20, 4)
    assert out["Tags"] == [{"Key": defaults.TAG_ALARM_DIRECTION, "Value": "out"}]
    assert out["Namespace"] == schema.NAMESPACE and out["MetricName"] == schema.GPU_UTILIZATION.name


def test_memory_is_optional_and_scales_out() -> None:
    specs = scaling_alarms(ASG, "gpufleet-", memory_high=90)
    assert [s.metric for s in specs] == [schema.GPU_UTILIZATION.name] * 2 + [schema.GPU_MEMORY_USED_PERCENT.name]
    assert specs[-1].direction is Direction.OUT


def test_cloudformation_has_one_alarm_resource_each() -> None:
    resources = cloudformation(scaling_alarms(EKS, "gpufleet-"))["Resources"]
    assert list(resources) == ["GpufleetMlInferG6GpuHigh", "GpufleetMlInferG6GpuLow"]
    assert all(r["Type"] == "AWS::CloudWatch::Alarm" for r in resources.values())


def test_the_doctor_resolves_them_to_their_group_and_direction() -> None:
    policy = parse_policy("groups: [{name: infer-g6, cluster: ml, kind: eks-nodegroup}]")
    alarms = tuple(
        AlarmView(
            name=s.name,
            tags={defaults.TAG_ALARM_DIRECTION: str(s.direction)},
            metrics=(MetricRef(namespace=schema.NAMESPACE, name=s.metric, dimensions=s.dimensions),),
        )
        for s in scaling_alarms(EKS, policy.alarm_prefix)
    )
    group = GroupObservation(
        ref=EKS, min_size=0, max_size=4, desired=1, tags={defaults.TAG_MANAGED: defaults.TAG_MANAGED_VALUE}
    )
    view = AccountView(groups=(group,), alarms=alarms, slack_secret=Presence.PRESENT, topic=Presence.PRESENT)
    findings = diagnose(policy, view)
    assert [f.level for f in findings] == [Level.OK, Level.OK]
    assert [f.text.split(";")[1].strip() for f in findings] == [
        "direction out from alarm tag",
        "direction in from alarm tag",
    ]
