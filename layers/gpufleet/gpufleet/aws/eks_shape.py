"""What a node of an EC2 instance type offers pods on the EKS AMI: its allocatable resources and the GPU
feature discovery labels its GPUs get. Pure arithmetic on a DescribeInstanceTypes item (no calls here).

Allocatable is capacity less what the AMI reserves, as awslabs/amazon-eks-ami's nodeadm writes the kubelet
config (nodeadm/internal/kubelet/config.go, `withDefaultReservedResources`, `getCPUMillicoresToReserve`,
`getMemoryMebibytesToReserve`, the default `evictionHard`; nodeadm/internal/kubelet/eni_max_pods.go
`calculateStandardMaxPods`; the AL2 bootstrap.sh used the same numbers):
- max pods: ENIs on the default network card x (IPv4 addresses per ENI - 1) + 2;
- kube-reserved cpu: 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of the rest;
- kube-reserved memory: 11 MiB x max pods + 255 MiB; eviction-hard memory.available: 100Mi;
- kube-reserved ephemeral-storage: 1Gi; eviction-hard nodefs.available: 10% of the root volume.
Memory capacity is the kernel's MemTotal, a few percent below the instance's size (page tables, firmware):
KERNEL_MEMORY_SHARE takes the low end, so a pod is never called unfit for memory its node would have.
g5.xlarge (4 vCPUs, 16 GiB, 4 ENIs x 15 IPs): 58 pods, 3.92 CPU and ~14.5 GiB allocatable.

GPU feature discovery (NVIDIA k8s-device-plugin, internal/lm/resource.go) labels a node
`nvidia.com/gpu.product` with the NVML product name sanitised (characters outside [A-Za-z0-9-_. ] dropped,
runs of spaces turned into one '-': "NVIDIA A10G" -> NVIDIA-A10G), `nvidia.com/gpu.memory` with the GPU's
memory in MiB and `nvidia.com/gpu.count`. EC2 names GPUs shorter than NVML does ("A10G", "A100"), so the
product is only set for the GPUs below whose NVML name is known; for the others a pod that selects a
product is told, not guessed. The memory is EC2's figure, which can differ from NVML's by a few percent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MIB = 2**20
GIB = 2**30
KERNEL_MEMORY_SHARE = 0.03  # of the instance's memory the kernel keeps (MemTotal is ~3-6% below it)
EVICTION_MEMORY_MIB = 100  # evictionHard memory.available
KUBE_RESERVED_STORAGE = 1 * GIB  # kubeReserved ephemeral-storage
EVICTION_NODEFS_SHARE = 0.10  # evictionHard nodefs.available
DEFAULT_MAX_PODS = 110  # the kubelet's default, what nodeadm falls back to without the instance's network
ARCHITECTURES = {"x86_64": "amd64", "arm64": "arm64"}  # EC2's names -> kubernetes.io/arch
EFA_RESOURCE = "vpc.amazonaws.com/efa"
NVIDIA_GPU = "nvidia.com/gpu"
PRODUCT_LABEL, MEMORY_LABEL, COUNT_LABEL = "nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.count"
PRESENT_LABEL = "nvidia.com/gpu.present"  # the GPU operator's (node feature discovery) label on GPU nodes
GPU_LABELS = (PRODUCT_LABEL, MEMORY_LABEL, COUNT_LABEL, PRESENT_LABEL)
# EC2's GPU name (and memory in MiB, where one name covers several boards) -> NVML's product name.
NVML_NAMES: dict[tuple[str, int | None], str] = {
    ("A10G", None): "NVIDIA A10G",
    ("L4", None): "NVIDIA L4",
    ("L40S", None): "NVIDIA L40S",
    ("T4", None): "Tesla T4",
    ("T4g", None): "NVIDIA T4G",
    ("V100", 16384): "Tesla V100-SXM2-16GB",
    ("V100", 32768): "Tesla V100-SXM2-32GB",
    ("A100", 40960): "NVIDIA A100-SXM4-40GB",
    ("A100", 81920): "NVIDIA A100-SXM4-80GB",
    ("H100", 81920): "NVIDIA H100 80GB HBM3",
    ("H200", None): "NVIDIA H200",
    ("B200", None): "NVIDIA B200",
    ("K80", None): "Tesla K80",
    ("M60", None): "Tesla M60",
}


@dataclass(frozen=True)
class InstanceType:
    """What DescribeInstanceTypes says of a type that a node's shape needs."""

    name: str
    gpus: int = 0  # logical GPUs (a fractional-GPU type shows the node one)
    arch: str = ""  # kubernetes.io/arch
    vcpus: int = 0
    memory_mib: int = 0
    max_pods: int = DEFAULT_MAX_PODS
    efa: int = 0  # EFA interfaces (the EFA device plugin's vpc.amazonaws.com/efa)
    gpu_maker: str = ""
    gpu_name: str = ""  # EC2's ("A10G")
    gpu_memory_mib: int = 0  # per GPU
    whole_gpus: bool = True  # False for a fractional GPU (g6f): its product and memory are not a board's


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def max_pods(network: Mapping[str, Any]) -> int:
    """ENIs on the default network card x (IPv4 per ENI - 1) + 2 (nodeadm `calculateStandardMaxPods`)."""
    default = network.get("DefaultNetworkCardIndex", 0)
    cards = [c for c in network.get("NetworkCards") or [] if c.get("NetworkCardIndex", 0) == default]
    enis = _int(cards[0].get("MaximumNetworkInterfaces")) if cards else _int(network.get("MaximumNetworkInterfaces"))
    ips = _int(network.get("Ipv4AddressesPerInterface"))
    return enis * (ips - 1) + 2 if enis and ips else DEFAULT_MAX_PODS


def instance_type(item: Mapping[str, Any]) -> InstanceType:
    """One DescribeInstanceTypes item, read leniently (a missing field is 0 or unknown)."""
    devices = (item.get("GpuInfo") or {}).get("Gpus") or []
    gpus = sum(_int(g.get("LogicalGpuCount", g.get("Count", 0))) for g in devices)
    archs = (item.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
    network = item.get("NetworkInfo") or {}
    first = devices[0] if len(devices) == 1 else {}
    return InstanceType(
        name=str(item.get("InstanceType", "")),
        gpus=gpus,
        arch=next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), ""),
        vcpus=_int((item.get("VCpuInfo") or {}).get("DefaultVCpus")),
        memory_mib=_int((item.get("MemoryInfo") or {}).get("SizeInMiB")),
        max_pods=max_pods(network),
        efa=_int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces")),
        gpu_maker=str(first.get("Manufacturer") or ""),
        gpu_name=str(first.get("Name") or ""),
        gpu_memory_mib=_int((first.get("MemoryInfo") or {}).get("SizeInMiB")),
        whole_gpus=float(first.get("GpuPartitionSize", 1.0) or 1.0) >= 1.0 if first else True,
    )


def reserved_millicores(vcpus: int) -> int:
    """kube-reserved cpu in millicores (nodeadm `getCPUMillicoresToReserve`, integer arithmetic as there)."""
    total = vcpus * 1000
    bounds, per_10000 = (0, 1000, 2000, 4000, total), (600, 100, 50, 25)
    reserved = 0
    for i, share in enumerate(per_10000):
        if total > bounds[i]:
            reserved += (min(total, bounds[i + 1]) - bounds[i]) * share // 10000
    return reserved


def allocatable(t: InstanceType, disk_gib: float | None = None) -> dict[str, float]:
    """Resource -> what pods may request on a fresh node of the type (cpu in cores, bytes, counts).
    ephemeral-storage only when the root volume's size is known (the node group's diskSize)."""
    offered: dict[str, float] = {}
    if t.vcpus:
        offered["cpu"] = (t.vcpus * 1000 - reserved_millicores(t.vcpus)) / 1000
    if t.memory_mib:
        kept = (11 * t.max_pods + 255 + EVICTION_MEMORY_MIB) * MIB
        offered["memory"] = max(0.0, t.memory_mib * MIB * (1 - KERNEL_MEMORY_SHARE) - kept)
    offered["pods"] = float(t.max_pods)
    if isinstance(disk_gib, (int, float)) and disk_gib > 0:
        offered["ephemeral-storage"] = max(0.0, disk_gib * GIB * (1 - EVICTION_NODEFS_SHARE) - KUBE_RESERVED_STORAGE)
    if t.gpus and t.gpu_maker.upper() == "NVIDIA":
        offered[NVIDIA_GPU] = float(t.gpus)
    if t.efa:
        offered[EFA_RESOURCE] = float(t.efa)
    return offered


def gfd_product(name: str) -> str:
    """GPU feature discovery's `sanitise`: characters outside [A-Za-z0-9-_. ] dropped, spaces to '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def shape_labels(t: InstanceType) -> dict[str, str]:
    """The GPU labels a node of the type gets (only those that can be told from EC2's description)."""
    if not t.gpus or t.gpu_maker.upper() != "NVIDIA":
        return {}
    labels = {COUNT_LABEL: str(t.gpus), PRESENT_LABEL: "true"}
    if t.whole_gpus and t.gpu_memory_mib:
        labels[MEMORY_LABEL] = str(t.gpu_memory_mib)
    nvml = NVML_NAMES.get((t.gpu_name, None)) or NVML_NAMES.get((t.gpu_name, t.gpu_memory_mib))
    if t.whole_gpus and nvml:
        labels[PRODUCT_LABEL] = gfd_product(nvml)
    return labels
