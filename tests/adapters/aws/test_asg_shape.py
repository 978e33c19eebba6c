"""A self-managed ASG's cluster and Cluster Autoscaler's node-template tags, read as kubernetes/autoscaler
reads them (cluster-autoscaler/cloudprovider/aws/aws_manager.go), and its node shape from them (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.aws.asg_shape import cluster_of, launch_types, node_template, template_shape
from gpufleet.aws.eks_nodes import ShapeUnknown
from gpufleet.aws.eks_shape import InstanceType

CA = "k8s.io/cluster-autoscaler/node-template/"
G5 = InstanceType(name="g5.12xlarge", gpus=4, arch="amd64", vcpus=48, memory_mib=196608, max_pods=234,
                  gpu_maker="NVIDIA", gpu_name="A10G", gpu_memory_mib=24576)  # fmt: skip
G5X = InstanceType(name="g5.xlarge", gpus=1, arch="amd64", vcpus=4, memory_mib=16384, max_pods=58,
                   gpu_maker="NVIDIA", gpu_name="A10G", gpu_memory_mib=24576)  # fmt: skip
M5 = InstanceType(name="m5.large", arch="amd64", vcpus=2, memory_mib=8192)


@pytest.mark.parametrize(
    ("tags", "cluster", "why"),
    [
        ({"kubernetes.io/cluster/ml": "owned"}, "ml", ""),
        ({"kubernetes.io/cluster/ml": "shared", "Name": "x"}, "ml", ""),
        ({"eks:cluster-name": "ml"}, "ml", ""),
        ({"alpha.eksctl.io/cluster-name": "ml", "kubernetes.io/cluster/ml": "owned"}, "ml", ""),  # eksctl's, agree
        ({"kubernetes.io/cluster/ml": "something-else"}, None, "no cluster"),
        ({"kubernetes.io/cluster/": "owned"}, None, "no cluster"),
        ({}, None, "set demand.kubernetes.cluster"),
        ({"kubernetes.io/cluster/ml": "owned", "kubernetes.io/cluster/prod": "shared"}, None, "2 clusters"),
        ({"kubernetes.io/cluster/ml": "owned", "eks:cluster-name": "prod"}, None, "ml (kubernetes.io/cluster/ml)"),
    ],
)
def test_the_cluster_of_an_asg_from_its_tags(tags: dict[str, str], cluster: str | None, why: str) -> None:
    found, said = cluster_of(tags)
    assert found == cluster and why in said


@pytest.mark.parametrize(
    ("tags", "labels", "taints", "resources", "ignored"),
    [
        ({CA + "label/workload": "train"}, {"workload": "train"}, (), {}, 0),
        ({CA + "label/": "x"}, {}, (), {}, 0),  # no key: no label (extractLabelsFromAsg skips "")
        ({CA + "taint/nvidia.com/gpu": "true:NoSchedule"}, {}, (("nvidia.com/gpu", "true", "NoSchedule"),), {}, 0),
        ({CA + "taint/dedicated": ":NoExecute"}, {}, (("dedicated", "", "NoExecute"),), {}, 0),
        ({CA + "taint/spot": "true:PreferNoSchedule"}, {}, (("spot", "true", "PreferNoSchedule"),), {}, 0),
        ({CA + "taint/dedicated": "gpu"}, {}, (), {}, 1),  # eksctl's propagated value has no effect: no taint
        ({CA + "taint/dedicated": "gpu:Sometimes"}, {}, (), {}, 1),
        ({CA + "resources/nvidia.com/gpu": "8"}, {}, (), {"nvidia.com/gpu": 8.0}, 0),
        ({CA + "resources/ephemeral-storage": "100Gi"}, {}, (), {"ephemeral-storage": 100 * 2**30}, 0),
        ({CA + "resources/cpu": "3500m"}, {}, (), {"cpu": 3.5}, 0),
        ({CA + "resources/memory": "lots"}, {}, (), {}, 1),
        ({CA + "autoscaling-options/scaledownunneededtime": "1m0s"}, {}, (), {}, 1),
        ({"k8s.io/cluster-autoscaler/enabled": "true", "Name": "n"}, {}, (), {}, 0),
    ],
)
def test_cluster_autoscalers_node_template_tags(
    tags: dict[str, str], labels: dict[str, str], taints: tuple[Any, ...], resources: dict[str, float], ignored: int
) -> None:
    t = node_template(tags)
    assert (t.labels, t.taints, t.resources, len(t.ignored)) == (labels, taints, resources, ignored)


@pytest.mark.parametrize(
    ("group", "types", "template", "why"),
    [
        (
            {"LaunchTemplate": {"LaunchTemplateId": "lt-1", "Version": "3"}},
            [],
            {"LaunchTemplateId": "lt-1", "Version": "3"},
            "",
        ),
        (
            {"LaunchTemplate": {"LaunchTemplateName": "gpu"}},
            [],
            {"LaunchTemplateName": "gpu", "Version": "$Default"},
            "",
        ),
        (
            {
                "MixedInstancesPolicy": {
                    "LaunchTemplate": {
                        "LaunchTemplateSpecification": {"LaunchTemplateName": "gpu", "Version": "$Latest"},
                        "Overrides": [{"InstanceType": "g5.12xlarge"}, {"InstanceType": "g6.12xlarge"}],
                    }
                }
            },
            ["g5.12xlarge", "g6.12xlarge"],
            None,
            "",
        ),
        (
            {
                "MixedInstancesPolicy": {
                    "LaunchTemplate": {
                        "LaunchTemplateSpecification": {"LaunchTemplateName": "gpu", "Version": "$Latest"}
                    }
                }
            },
            [],
            {"LaunchTemplateName": "gpu", "Version": "$Latest"},
            "",
        ),
        (
            {"MixedInstancesPolicy": {"LaunchTemplate": {"Overrides": [{"InstanceRequirements": {"VCpuCount": {}}}]}}},
            [],
            None,
            "instance requirements",
        ),
        ({"LaunchConfigurationName": "old"}, [], None, "launch configuration"),
    ],
)
def test_where_an_asgs_instance_types_come_from(
    group: dict[str, Any], types: list[str], template: dict[str, str] | None, why: str
) -> None:
    found, spec, said = launch_types(group)
    assert (found, spec) == (types, template) and why in said


def test_the_shape_is_the_least_type_then_the_tags_then_the_policy() -> None:
    template = node_template({
        CA + "label/workload": "train",
        CA + "label/node.kubernetes.io/instance-type": "tagged",
        CA + "taint/nvidia.com/gpu": "true:NoSchedule",
        CA + "resources/ephemeral-storage": "100Gi",
    })  # fmt: skip
    shape = template_shape("gpu-spot", ["g5.12xlarge", "g5.xlarge"], {"g5.12xlarge": G5, "g5.xlarge": G5X},
                           template, ["us-east-1a"], "us-east-1", overrides={"memory": "13Gi"})  # fmt: skip
    labels = dict(shape.labels)
    assert shape.gpus == 1 and "shaped by the least, g5.xlarge" in shape.name
    assert labels["workload"] == "train" and labels["node.kubernetes.io/instance-type"] == "tagged"
    assert labels["topology.kubernetes.io/zone"] == "us-east-1a" and labels["nvidia.com/gpu.product"] == "NVIDIA-A10G"
    assert shape.taints == (("nvidia.com/gpu", "true", "NoSchedule"),)
    assert shape.allocatable["ephemeral-storage"] == 100 * 2**30 and shape.allocatable["memory"] == 13 * 2**30
    assert shape.allocatable["cpu"] == pytest.approx(3.92)  # g5.xlarge's, the least


def test_a_gpu_count_from_the_resources_tag_sets_the_gpus_ec2_does_not_know() -> None:
    tagged = node_template({CA + "resources/nvidia.com/gpu": "2"})
    assert template_shape("odd", ["m5.large"], {"m5.large": M5}, tagged).gpus == 2
    with pytest.raises(ShapeUnknown, match=r"^ASG odd: instance types m5.large: not all have GPUs"):
        template_shape("odd", ["m5.large"], {"m5.large": M5}, node_template({}))
    with pytest.raises(ShapeUnknown, match="does not describe instance type"):
        template_shape("odd", ["x9.huge"], {}, node_template({}))
