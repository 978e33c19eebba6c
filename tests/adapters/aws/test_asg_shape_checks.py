"""What a self-managed ASG's tags and configuration must not be trusted for (issue 30, item 0, the probe's
findings): eksctl's node labels read from its ASG tags, a resource no node can offer, a GPU tag of 0,
weighted mixed-instances groups, and the tags that say nothing usable, told (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.aws.asg_shape import node_template, shape_notes, template_shape, weighted_why
from gpufleet.aws.eks_nodes import ShapeUnknown, checked_overrides
from gpufleet.aws.eks_shape import InstanceType
from gpufleet.kubernetes.pods import WaitingPod
from gpufleet.scaling.fit import fits

CA = "k8s.io/cluster-autoscaler/node-template/"
G5 = InstanceType(name="g5.12xlarge", gpus=4, arch="amd64", vcpus=48, memory_mib=196608, max_pods=234,
                  gpu_maker="NVIDIA", gpu_name="A10G", gpu_memory_mib=24576)  # fmt: skip
# What eksctl puts on an unmanaged node group's ASG, propagateASGTags left off (its default).
EKSCTL = {
    "kubernetes.io/cluster/ml": "owned",
    "alpha.eksctl.io/cluster-name": "ml",
    "alpha.eksctl.io/nodegroup-name": "gpu-spot",
    "alpha.eksctl.io/nodegroup-type": "unmanaged",
}


def shape(tags: dict[str, str], overrides: dict[str, str] | None = None) -> Any:
    return template_shape("g", ["g5.12xlarge"], {"g5.12xlarge": G5}, node_template(tags), overrides=overrides)


def test_a_pod_selecting_its_eksctl_node_groups_label_fits() -> None:
    """eksctl labels every node alpha.eksctl.io/nodegroup-name and cluster-name (defaults.go
    setDefaultNodeLabels) and tags the ASG the same: the tags are read as those labels."""
    labels = dict(shape(EKSCTL).labels)
    assert labels["alpha.eksctl.io/nodegroup-name"] == "gpu-spot" and labels["alpha.eksctl.io/cluster-name"] == "ml"
    assert "alpha.eksctl.io/nodegroup-type" not in labels  # a tag of the stack, no node label
    pod = WaitingPod(namespace="ml", name="p", gpus=1, node_selector=(("alpha.eksctl.io/nodegroup-name", "gpu-spot"),))
    assert fits(pod, shape(EKSCTL))
    tagged = node_template(EKSCTL | {CA + "label/alpha.eksctl.io/nodegroup-name": "other"})
    assert tagged.labels["alpha.eksctl.io/nodegroup-name"] == "other"  # a node-template label tag wins


@pytest.mark.parametrize(
    ("tags", "overrides", "why"),
    [
        ({CA + "resources/nvidia.com/gpu": "1e400"}, None, r"^ASG g: tag .*nvidia.com/gpu='1e400': nvidia.com/gpu inf"),
        ({CA + "resources/nvidia.com/gpu": "2048"}, None, r"more than a node offers \(at most 1024\)"),
        ({CA + "resources/memory": "1e400"}, None, r"memory inf is more than a node offers"),
        ({}, {"nvidia.com/gpu": "1e400"}, r"demand.kubernetes.allocatable nvidia.com/gpu='1e400'"),
        ({}, {"cpu": "9e99"}, r"demand.kubernetes.allocatable cpu='9e99'"),
        ({CA + "resources/nvidia.com/gpu": "0"}, None, r"its tag .*nvidia.com/gpu says 0"),
        ({}, {"nvidia.com/gpu": "0"}, r"allocatable says nvidia.com/gpu: 0"),
    ],
)
def test_a_resource_no_node_offers_fails_the_group_in_one_line(
    tags: dict[str, str], overrides: dict[str, str] | None, why: str
) -> None:
    with pytest.raises(ShapeUnknown, match=why):
        shape(tags, overrides)


def test_sane_resources_pass_and_the_managed_node_group_path_checks_the_same() -> None:
    assert shape({CA + "resources/nvidia.com/gpu": "8"}, {"memory": "13Gi"}).gpus == 8
    assert checked_overrides({"memory": "13Gi"}) == ({"memory": 13 * 2**30}, "")
    given, why = checked_overrides({"nvidia.com/gpu": "1e400"})
    assert given == {} and "more than a node offers" in why


def overrides(*weights: str | None) -> dict[str, Any]:
    items = [{"InstanceType": f"g5.{i}xlarge"} | ({"WeightedCapacity": w} if w else {}) for i, w in enumerate(weights)]
    return {"MixedInstancesPolicy": {"LaunchTemplate": {"Overrides": items}}}


@pytest.mark.parametrize(
    ("group", "weighted"),
    [
        ({"LaunchTemplate": {"LaunchTemplateName": "gpu"}}, False),
        (overrides(None, None), False),
        (overrides("1", "1"), False),
        (overrides("1", "4"), True),
        (overrides("2", "2"), True),  # every instance 2 units: desired still is not a count of instances
        (overrides("x"), True),  # not a number: not trusted as 1
    ],
)
def test_weighted_capacity_other_than_one_is_told(group: dict[str, Any], weighted: bool) -> None:
    why = weighted_why(group)
    assert (why is not None) == weighted
    if why:
        assert why.startswith("weighted capacity") and "does not size it by demand" in why


def test_what_the_tags_say_that_is_not_used_is_told() -> None:
    propagated = EKSCTL | {CA + "taint/nvidia.com/gpu": "true"}  # how eksctl's propagateASGTags writes a taint
    notes = shape_notes(propagated, node_template(propagated))
    assert len(notes) == 2
    assert "no taint" in notes[0] and "propagateASGTags writes the value alone" in notes[0]
    assert "made by eksctl without node-template label tags" in notes[1]
    labelled = EKSCTL | {CA + "label/workload": "train"}
    assert shape_notes(labelled, node_template(labelled)) == []
    assert shape_notes({"kubernetes.io/cluster/ml": "owned"}, node_template({})) == []  # not eksctl's
