"""A self-managed node group's node shape on moto (issue 30, item 0): its instance type from its launch
template (DescribeLaunchTemplateVersions) or its mixed-instances overrides, and Cluster Autoscaler's
node-template tags on the ASG: no gpufleet shape configuration."""

from __future__ import annotations

import pytest

from gpufleet.aws.asg_shape import asg_node_shape
from gpufleet.aws.eks_nodes import ShapeUnknown
from gpufleet.aws.fleet import FleetReader
from gpufleet.domain.models import GroupRef
from gpufleet.kubernetes.pods import waiting_pod
from gpufleet.policy.fleet import Discovery, FleetPolicy
from gpufleet.scaling.fit import fits
from rehearsal import fleet
from rehearsal.kube_api import pod
from tests.integration.conftest import count_calls

CA = "k8s.io/cluster-autoscaler/node-template/"
TAGS = {
    "kubernetes.io/cluster/ml": "owned",
    "k8s.io/cluster-autoscaler/enabled": "true",
    CA + "label/workload": "train",
    CA + "taint/nvidia.com/gpu": "true:NoSchedule",
    CA + "resources/ephemeral-storage": "200Gi",
}
TOLERATES = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_a_self_managed_asgs_shape_from_its_launch_template_and_tags(aws: str) -> None:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "gpu-spot", min_size=0, max_size=4, desired=0, tags=TAGS)
    calls = count_calls(clients.autoscaling, clients.ec2)
    shape = asg_node_shape(clients.autoscaling, clients.ec2, "gpu-spot")
    assert calls["ec2:DescribeLaunchTemplateVersions"] == 1
    assert (shape.gpus, shape.name, shape.zones) == (4, "g5.12xlarge", ("us-east-1a",))
    labels = dict(shape.labels)
    assert labels["workload"] == "train" and labels["node.kubernetes.io/instance-type"] == "g5.12xlarge"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A10G" and labels["topology.kubernetes.io/zone"] == "us-east-1a"
    assert shape.taints == (("nvidia.com/gpu", "true", "NoSchedule"),)
    assert shape.allocatable["ephemeral-storage"] == 200 * 2**30 and shape.allocatable["cpu"] == 47.81
    wants = pod("train-0", gpus=4, node_selector={"workload": "train"}, tolerations=TOLERATES)
    untolerated = pod("train-1", gpus=4, node_selector={"workload": "train"})
    assert [fits(w, shape) for w in map(waiting_pod, (wants, untolerated)) if w] == [True, False]


def test_mixed_instances_overrides_the_least_type_shapes_it_and_what_cannot_be_read_is_told(aws: str) -> None:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "lt-only", min_size=0, max_size=1, desired=0)  # makes the launch template
    clients.autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="mixed",
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateName": "gpufleet-gpu-node", "Version": "$Latest"},
                "Overrides": [{"InstanceType": "g5.12xlarge"}, {"InstanceType": "g5.2xlarge"}],
            },
            "InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 0},
        },
        MinSize=0,
        MaxSize=2,
        AvailabilityZones=["us-east-1a", "us-east-1b"],
    )
    shape = asg_node_shape(clients.autoscaling, clients.ec2, "mixed", overrides={"cpu": "7"})
    assert shape.gpus == 1 and shape.name == "g5.12xlarge/g5.2xlarge (shaped by the least, g5.2xlarge)"
    assert shape.allocatable["cpu"] == 7.0 and "topology.kubernetes.io/zone" not in dict(shape.labels)
    with pytest.raises(ShapeUnknown, match=r"^ASG gone: not found"):
        asg_node_shape(clients.autoscaling, clients.ec2, "gone")


class Told:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, message: str, **_: object) -> None:
        self.lines.append(message)


def test_a_rule_naming_a_managed_node_groups_own_asg_is_not_a_second_group(aws: str) -> None:
    """EKS's backing ASG named by a kind: asg rule: the node group alone is sized (else twice), and the
    rule's author is told once what to write instead."""
    clients = fleet.Clients.create()
    backing = fleet.create_nodegroup(clients, "ml", "gpu", min_size=0, max_size=4, desired=1, tags={})
    policy = FleetPolicy.model_validate({"groups": [
        {"kind": "asg", "name": backing, "max": 4, "demand": {"kubernetes": {}}},
        {"kind": "eks-nodegroup", "cluster": "ml", "name": "gpu", "max": 4, "demand": {"kubernetes": {}}},
    ]})  # fmt: skip
    told = Told()
    reader = FleetReader.of(clients.autoscaling, clients.eks, logger=told)
    for _ in range(2):
        seen = reader.observe(policy.discovery, policy.explicit_groups())
        assert [(o.ref.key, o.asg_name) for o in seen] == [("eks:ml/gpu", backing)]
    assert told.lines == [
        f"ASG {backing} backs EKS managed node group ml/gpu: not sized as an ASG (it would be sized twice); "
        "write `kind: eks-nodegroup, cluster: ml, name: gpu` instead"
    ]


def test_a_weighted_mixed_group_is_not_shaped_and_keeps_its_nodes(aws: str) -> None:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "lt-only", min_size=0, max_size=1, desired=0)  # makes the launch template
    clients.autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="weighted",
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateName": "gpufleet-gpu-node", "Version": "$Latest"},
                "Overrides": [
                    {"InstanceType": "g5.2xlarge", "WeightedCapacity": "1"},
                    {"InstanceType": "g5.12xlarge", "WeightedCapacity": "4"},
                ],
            },
        },
        MinSize=0,
        MaxSize=8,
        AvailabilityZones=["us-east-1a"],
        Tags=[{"Key": "kubernetes.io/cluster/ml", "Value": "owned", "PropagateAtLaunch": False}],
    )
    with pytest.raises(ShapeUnknown, match=r"^ASG weighted: weighted capacity: .*WeightedCapacity 1, 4"):
        asg_node_shape(clients.autoscaling, clients.ec2, "weighted")
    [obs] = FleetReader.of(clients.autoscaling, clients.eks).observe(
        Discovery(enabled=False), [GroupRef.parse_key("asg:weighted")]
    )
    assert str(obs.scale_in_closed).startswith("weighted capacity")
