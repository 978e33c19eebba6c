"""What a node of an instance type offers pods on the EKS AMI (amazon-eks-ami nodeadm's reservations),
and the GPU feature discovery labels it gets: pure arithmetic on DescribeInstanceTypes items."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.aws.eks_shape import (
    GIB,
    InstanceType,
    allocatable,
    gfd_product,
    instance_type,
    max_pods,
    reserved_millicores,
    shape_labels,
)


def _item(
    name: str, vcpus: int, mib: int, gpus: int, gpu: str, gpu_mib: int, enis: int, ips: int, efa: int = 0
) -> dict[str, Any]:
    network: dict[str, Any] = {
        "DefaultNetworkCardIndex": 0,
        "Ipv4AddressesPerInterface": ips,
        "MaximumNetworkInterfaces": enis * 4,  # all cards: not what max pods reads
        "NetworkCards": [
            {"NetworkCardIndex": 0, "MaximumNetworkInterfaces": enis},
            {"NetworkCardIndex": 1, "MaximumNetworkInterfaces": enis},
        ],
    }
    if efa:
        network["EfaInfo"] = {"MaximumEfaInterfaces": efa}
    return {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": vcpus},
        "MemoryInfo": {"SizeInMiB": mib},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "GpuInfo": {
            "Gpus": [{"Count": gpus, "Manufacturer": "NVIDIA", "Name": gpu, "MemoryInfo": {"SizeInMiB": gpu_mib}}]
        },
        "NetworkInfo": network,
    }


def test_a_g5_xlarge_offers_what_the_eks_ami_leaves() -> None:
    """4 vCPUs, 16 GiB, 4 ENIs x 15 IPv4: 58 pods, 3.92 CPU, ~14.5 GiB; a 20 GiB root volume keeps 17 GiB."""
    g5 = instance_type(_item("g5.xlarge", 4, 16384, 1, "A10G", 22888, 4, 15))
    offered = allocatable(g5, disk_gib=20)
    assert g5.max_pods == 58
    assert offered["cpu"] == 3.92
    assert 14.4 * GIB < offered["memory"] < 14.6 * GIB
    assert offered["ephemeral-storage"] == 17 * GIB
    assert offered["pods"] == 58 and offered["nvidia.com/gpu"] == 1
    assert "vpc.amazonaws.com/efa" not in offered
    assert "ephemeral-storage" not in allocatable(g5)  # the root volume unknown (a launch template): unchecked


@pytest.mark.parametrize(
    ("vcpus", "millicores"), [(1, 60), (2, 70), (4, 80), (8, 90), (48, 190), (96, 310), (192, 550)]
)
def test_kube_reserved_cpu_is_nodeadms_table(vcpus: int, millicores: int) -> None:
    """6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of the rest."""
    assert reserved_millicores(vcpus) == millicores


def test_max_pods_reads_the_default_network_card() -> None:
    assert (
        max_pods(
            {
                "DefaultNetworkCardIndex": 0,
                "Ipv4AddressesPerInterface": 50,
                "NetworkCards": [{"NetworkCardIndex": 0, "MaximumNetworkInterfaces": 15}],
            }
        )
        == 737
    )
    assert max_pods({}) == 110  # the kubelet's default when EC2 does not say


def test_efa_and_gpu_labels() -> None:
    p4d = instance_type(_item("p4d.24xlarge", 96, 1179648, 8, "A100", 40960, 15, 50, efa=4))
    assert allocatable(p4d)["vpc.amazonaws.com/efa"] == 4
    assert shape_labels(p4d) == {
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    }
    unknown = InstanceType(name="x", gpus=1, gpu_maker="NVIDIA", gpu_name="Z9", gpu_memory_mib=1000)
    assert "nvidia.com/gpu.product" not in shape_labels(unknown)  # told, not guessed
    fractional = InstanceType(
        name="g6f.large", gpus=1, gpu_maker="NVIDIA", gpu_name="L4", gpu_memory_mib=2861, whole_gpus=False
    )
    assert set(shape_labels(fractional)) == {"nvidia.com/gpu.count", "nvidia.com/gpu.present"}


@pytest.mark.parametrize(
    ("nvml", "label"),
    [
        ("NVIDIA A10G", "NVIDIA-A10G"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla  T4 (rev)", "Tesla-T4-rev"),
    ],
)
def test_gfd_product_names(nvml: str, label: str) -> None:
    assert gfd_product(nvml) == label


def test_a_malformed_item_is_a_type_without_numbers_not_a_crash() -> None:
    t = instance_type(
        {"InstanceType": "odd", "GpuInfo": {"Gpus": [{"Count": "many"}]}, "VCpuInfo": {"DefaultVCpus": -1}}
    )
    assert (t.gpus, t.vcpus, t.max_pods) == (0, 0, 110)
    assert allocatable(t) == {"pods": 110.0}
