"""Runs under Python 3.9 (Amazon Linux 2023) and the project's own Python."""

import pytest

from gpufleet_node import schema

CLOUDWATCH_UNITS = {"Percent", "Megabytes", "Count", "None", "Seconds", "Bytes"}


def test_metric_names_are_unique_and_units_are_cloudwatch_units():
    names = [m.name for m in schema.ALL_METRICS]
    assert len(names) == len(set(names))
    assert all(m.unit in CLOUDWATCH_UNITS for m in schema.ALL_METRICS)
    assert schema.METRICS_BY_NAME["GPUUtilization"] is schema.GPU_UTILIZATION


def test_group_dimensions_cover_asg_and_eks():
    assert schema.group_dimensions(asg_name="a") == {"AutoScalingGroupName": "a"}
    assert schema.group_dimensions(cluster_name="c", nodegroup_name="n") == {
        "ClusterName": "c",
        "NodegroupName": "n",
    }
    with pytest.raises(ValueError, match="ASG name"):
        schema.group_dimensions()
