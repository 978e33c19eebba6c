"""The instance types tests/unit/scaling/test_fit.py fits pods to are what the EKS shape adapter
(gpufleet.aws.eks_shape) makes of EC2's DescribeInstanceTypes items: the same labels, the same
allocatable (a 20 GiB disk), so the fit's numbers there are the deployed shapes' numbers."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.aws.eks_shape import allocatable, instance_type, shape_labels
from tests.unit.scaling.test_fit import G5_12XLARGE, G5_XLARGE, Machine


def _item(name: str, vcpus: int, mib: int, gpus: int, gpu: str, gpu_mib: int, enis: int, ips: int) -> dict[str, Any]:
    """A DescribeInstanceTypes item as EC2 writes it (the fields a shape reads)."""
    return {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": vcpus},
        "MemoryInfo": {"SizeInMiB": mib},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "GpuInfo": {
            "Gpus": [{"Count": gpus, "Manufacturer": "NVIDIA", "Name": gpu, "MemoryInfo": {"SizeInMiB": gpu_mib}}]
        },
        "NetworkInfo": {
            "DefaultNetworkCardIndex": 0,
            "Ipv4AddressesPerInterface": ips,
            "NetworkCards": [{"NetworkCardIndex": 0, "MaximumNetworkInterfaces": enis}],
        },
    }


@pytest.mark.parametrize(
    ("item", "machine"),
    [
        (_item("g5.xlarge", 4, 16384, 1, "A10G", 22888, 4, 15), G5_XLARGE),
        (_item("g5.12xlarge", 48, 196608, 4, "A10G", 22888, 8, 30), G5_12XLARGE),
    ],
)
def test_the_fits_instance_types_are_the_adapters(item: dict[str, Any], machine: Machine) -> None:
    t = instance_type(item)
    assert t.arch == "amd64"  # the shapes' kubernetes.io/arch label
    assert Machine(t.name, t.gpus, shape_labels(t), allocatable(t, disk_gib=20)) == machine
