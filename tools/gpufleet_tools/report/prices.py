"""What a GPU-hour costs: the instance's on-demand price divided by its GPUs. Pure.

The fleet policy's own prices (`spot.prices.on_demand`, $ per instance-hour) come first: they are what
you pay. Otherwise the table below: us-east-1, Linux, shared tenancy, on-demand list prices as the AWS
Price List API gave them on 2026-01-19 (read from the table Karpenter's AWS provider generates from that
API, `pkg/providers/pricing/zz_generated.pricing_aws.go`, "generated at 2026-01-19T13:23:24Z for
us-east-1"), cross-checked where a second source was found: g5.12xlarge $5.672 (docs/spot-watch.md),
g5.xlarge $1.006 (a June 2026 price guide), p5.48xlarge $55.04 (the June 2025 cut of up to 45 % from
$98.32). Types the API listed no on-demand price for (p5e.48xlarge, p6-b300.48xlarge) carry their GPU
count but no price: their cost is shown as unknown, never guessed. Savings Plans, Reserved Instances and
spot are not in these numbers; put your own prices in the policy to see them.

A node's GPUs come from this table, else from the policy (`demand.gpus_per_node` of the rule that names
the record's group), never from the records: a record's own `gpus` is a claim, and one node claiming
4,000 GPUs must not divide a type's price by 1,000 (issue 29).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from gpufleet.domain.models import GroupRef

if TYPE_CHECKING:
    from gpufleet.policy.fleet import FleetPolicy

PRICES_AS_OF = "2026-01-19"
PRICES_SOURCE = "AWS Price List API, us-east-1 Linux on-demand, read 2026-01-19"


@dataclass(frozen=True, slots=True)
class InstanceType:
    gpus: int
    on_demand: float | None  # $ per instance-hour; None: no verified list price


# (GPUs, $/instance-hour). GPUs per size from the EC2 accelerated-computing instance specifications.
ON_DEMAND_US_EAST_1: Mapping[str, InstanceType] = {
    # g4dn: NVIDIA T4
    "g4dn.xlarge": InstanceType(1, 0.526),
    "g4dn.2xlarge": InstanceType(1, 0.752),
    "g4dn.4xlarge": InstanceType(1, 1.204),
    "g4dn.8xlarge": InstanceType(1, 2.176),
    "g4dn.16xlarge": InstanceType(1, 4.352),
    "g4dn.12xlarge": InstanceType(4, 3.912),
    "g4dn.metal": InstanceType(8, 7.824),
    # g5: NVIDIA A10G
    "g5.xlarge": InstanceType(1, 1.006),
    "g5.2xlarge": InstanceType(1, 1.212),
    "g5.4xlarge": InstanceType(1, 1.624),
    "g5.8xlarge": InstanceType(1, 2.448),
    "g5.16xlarge": InstanceType(1, 4.096),
    "g5.12xlarge": InstanceType(4, 5.672),
    "g5.24xlarge": InstanceType(4, 8.144),
    "g5.48xlarge": InstanceType(8, 16.288),
    # g6: NVIDIA L4
    "g6.xlarge": InstanceType(1, 0.8048),
    "g6.2xlarge": InstanceType(1, 0.9776),
    "g6.4xlarge": InstanceType(1, 1.3232),
    "g6.8xlarge": InstanceType(1, 2.0144),
    "g6.16xlarge": InstanceType(1, 3.3968),
    "g6.12xlarge": InstanceType(4, 4.6016),
    "g6.24xlarge": InstanceType(4, 6.6752),
    "g6.48xlarge": InstanceType(8, 13.3504),
    # g6e: NVIDIA L40S
    "g6e.xlarge": InstanceType(1, 1.861),
    "g6e.2xlarge": InstanceType(1, 2.24208),
    "g6e.4xlarge": InstanceType(1, 3.00424),
    "g6e.8xlarge": InstanceType(1, 4.52856),
    "g6e.16xlarge": InstanceType(1, 7.57719),
    "g6e.12xlarge": InstanceType(4, 10.49264),
    "g6e.24xlarge": InstanceType(4, 15.06559),
    "g6e.48xlarge": InstanceType(8, 30.13118),
    # gr6: NVIDIA L4, more memory per vCPU
    "gr6.4xlarge": InstanceType(1, 1.5392),
    "gr6.8xlarge": InstanceType(1, 2.4464),
    # p3: NVIDIA V100
    "p3.2xlarge": InstanceType(1, 3.06),
    "p3.8xlarge": InstanceType(4, 12.24),
    "p3.16xlarge": InstanceType(8, 24.48),
    "p3dn.24xlarge": InstanceType(8, 31.212),
    # p4d / p4de: NVIDIA A100 40 GB / 80 GB (prices after the June 2025 cut)
    "p4d.24xlarge": InstanceType(8, 21.957642),
    "p4de.24xlarge": InstanceType(8, 27.44705),
    # p5 / p5e / p5en: NVIDIA H100 / H200 / H200
    "p5.4xlarge": InstanceType(1, 6.88),
    "p5.48xlarge": InstanceType(8, 55.04),
    "p5e.48xlarge": InstanceType(8, None),  # not in the on-demand price list on 2026-01-19
    "p5en.48xlarge": InstanceType(8, 63.296),
    # p6: NVIDIA B200 / B300
    "p6-b200.48xlarge": InstanceType(8, 113.9328),
    "p6-b300.48xlarge": InstanceType(8, None),  # not in the on-demand price list on 2026-01-19
}


class PriceSource(StrEnum):
    POLICY = "policy"  # spot.prices.on_demand in the fleet policy
    TABLE = "table"  # ON_DEMAND_US_EAST_1


@dataclass(frozen=True, slots=True)
class GpuHourPrice:
    usd: float
    source: PriceSource


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """How many GPUs a node of a type (in a group) has, and who says so: the table or the policy."""

    count: int
    source: PriceSource


# group key -> the policy's GPUs per node for it (None: the policy does not say)
PolicyGpus = Callable[[str], "int | None"]


def _no_gpus(group: str) -> int | None:
    return None


class PriceBook:
    """$ per GPU-hour by instance type: the policy's price, else the table's; None when neither knows it
    or nobody trusted knows the type's GPUs."""

    def __init__(
        self, policy_on_demand: Mapping[str, float] | None = None, policy_gpus: PolicyGpus | None = None
    ) -> None:
        self.policy = dict(policy_on_demand or {})
        self._policy_gpus = policy_gpus or _no_gpus
        self._gpus: dict[tuple[str, str | None], NodeGpus | None] = {}

    @classmethod
    def from_policy(cls, policy: FleetPolicy) -> PriceBook:
        """The policy's prices, and its `demand.gpus_per_node` for the groups its rules name (tags are not
        in a usage record, so a rule that selects by tags alone gives none)."""

        def gpus(group: str) -> int | None:
            try:
                settings = policy.settings_for(GroupRef.parse_key(group), {})
            except ValueError:  # not a group key: a record's claim, not the policy's
                return None
            per_node = settings.demand.gpus_per_node if settings and settings.demand else None
            if per_node is None or per_node < 1 or not math.isclose(per_node, round(per_node)):
                return None
            return round(per_node)

        return cls(policy.spot.prices.on_demand, gpus)

    def gpus(self, instance_type: str, group: str | None) -> NodeGpus | None:
        """The table's GPU count for the type, else the policy's for the group; None: nobody trusted says."""
        key = (instance_type, group)
        if key not in self._gpus:
            known = ON_DEMAND_US_EAST_1.get(instance_type)
            per_node = None if group is None else self._policy_gpus(group)
            self._gpus[key] = (
                NodeGpus(known.gpus, PriceSource.TABLE)
                if known
                else (NodeGpus(per_node, PriceSource.POLICY) if per_node else None)
            )
        return self._gpus[key]

    def per_gpu_hour(self, instance_type: str, group: str | None = None) -> GpuHourPrice | None:
        """The instance's price over its GPUs (the table's, else the policy's for `group`)."""
        gpus = self.gpus(instance_type, group)
        if gpus is None:
            return None
        if instance_type in self.policy:
            return GpuHourPrice(self.policy[instance_type] / gpus.count, PriceSource.POLICY)
        known = ON_DEMAND_US_EAST_1.get(instance_type)
        if known and known.on_demand is not None:
            return GpuHourPrice(known.on_demand / gpus.count, PriceSource.TABLE)
        return None
