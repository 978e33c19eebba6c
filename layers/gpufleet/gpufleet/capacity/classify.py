"""Failed launches, classified: what kind of failure (capacity, price, quota, subnet, configuration),
where (instance type, AZ) and in which market, with a fix hint for on-call. Pure.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from gpufleet.domain.models import CapacityType, Frozen


class FailureSource(StrEnum):
    EVENT = "event"  # EventBridge "EC2 Instance Launch Unsuccessful"
    SWEEP = "sweep"  # DescribeScalingActivities at a reconcile tick
    EKS_HEALTH = "eks-health"  # an EKS node group health issue (AsgInstanceLaunchFailures)


class FailureClass(StrEnum):
    SPOT_CAPACITY = "spot-capacity"
    SPOT_PRICE = "spot-price"
    QUOTA = "quota"
    SUBNET_IPS = "subnet-ip-exhaustion"
    CONFIGURATION = "configuration"
    UNKNOWN = "unknown"

    @property
    def falls_back(self) -> bool:
        """Only a spot market problem is fixed by on-demand capacity; quota, subnet and configuration
        errors would fail the same way there (or make things worse)."""
        return self in (FailureClass.SPOT_CAPACITY, FailureClass.SPOT_PRICE)


_RULES: tuple[tuple[FailureClass, re.Pattern[str], str], ...] = tuple(
    (cls, re.compile(pattern, re.IGNORECASE), hint)
    for cls, pattern, hint in (
        (
            FailureClass.QUOTA,
            r"VcpuLimitExceeded|vCPU (capacity|limit)|MaxSpotInstanceCountExceeded|max-spot-instance-count|"
            r"InstanceLimitExceeded|instance limit",
            "Request a higher EC2 vCPU quota for this instance family (Service Quotas: 'Running On-Demand G and "
            "VT instances' / 'All G and VT Spot Instance Requests'); on-demand would hit the same kind of limit.",
        ),
        (
            FailureClass.SUBNET_IPS,
            r"InsufficientFreeAddressesInSubnet|free (IP )?addresses|no (free|available) IP",
            "The subnet is out of IP addresses: add subnets (or a larger CIDR) to the group, or use prefix "
            "delegation for EKS pods.",
        ),
        (
            FailureClass.SPOT_PRICE,
            r"SpotMaxPriceTooLow|price-too-low|spot (max )?price .*(lower|too low)|bid price",
            "The group's Spot max price is below the market: remove the max price (default: on-demand price).",
        ),
        (
            FailureClass.SPOT_CAPACITY,
            r"UnfulfillableCapacity|InsufficientInstanceCapacity|no (Spot )?capacity available|"
            r"capacity-not-available|insufficient capacity|do not have sufficient .* capacity",
            "Spot capacity for this type/AZ is exhausted: add instance types and AZs to the group (mixed instances "
            "policy, price-capacity-optimized); gpufleet falls back to on-demand meanwhile if configured.",
        ),
        (
            FailureClass.CONFIGURATION,
            r"InvalidAMIID|image id .* does not exist|InvalidLaunchTemplate|launch template|InvalidParameter|"
            r"IamInstanceProfile|not authorized|UnauthorizedOperation|AccessDenied|InvalidKeyPair|"
            r"InvalidGroup|InvalidSubnet|security group|OptInRequired|Unsupported|not supported",
            "The launch configuration is broken (AMI, launch template, instance profile, subnet or security "
            "group): fix it; retrying or falling back will fail the same way.",
        ),
    )
)
_UNKNOWN_HINT = "Unrecognised failure: see the scaling activity's status message in the ASG console."
_INSTANCE_TYPE = re.compile(
    r"\b([a-z][a-z0-9-]*\d[a-z0-9-]*\.(?:\d*x?large|metal[a-z0-9-]*|medium|small|micro|nano))\b"
)
_AZ = re.compile(r"\b([a-z]{2}(?:-gov)?-[a-z]+-\d[a-z])\b")


def classify(message: str) -> tuple[FailureClass, str]:
    for cls, pattern, hint in _RULES:
        if pattern.search(message):
            return cls, hint
    return FailureClass.UNKNOWN, _UNKNOWN_HINT


class LaunchFailure(Frozen):
    """One failed launch activity, from the EventBridge event or the describe sweep (same activity id)."""

    activity_id: str
    group: str  # the managed group (an ASG, or the EKS node group behind it)
    asg_name: str
    at: datetime
    message: str
    availability_zone: str | None = None
    instance_type: str | None = None
    capacity_type: CapacityType = CapacityType.UNKNOWN
    source: FailureSource = FailureSource.SWEEP

    @property
    def failure_class(self) -> FailureClass:
        return classify(self.message)[0]

    @property
    def hint(self) -> str:
        return classify(self.message)[1]

    @property
    def offering(self) -> str:
        return f"{self.instance_type or '?'}/{self.availability_zone or '?'}/{self.capacity_type}"


def describe_failure(
    activity_id: str,
    group: str,
    asg_name: str,
    at: datetime,
    message: str,
    details_az: str | None,
    source: FailureSource,
    group_capacity_type: CapacityType = CapacityType.UNKNOWN,
    group_instance_type: str | None = None,
) -> LaunchFailure:
    """Pull instance type, AZ and capacity type out of what the activity says (UnfulfillableCapacity
    messages name no type: then the group's own instance type, when it has one)."""
    itype = _INSTANCE_TYPE.search(message)
    az = details_az or (m.group(1) if (m := _AZ.search(message)) else None)
    lowered = message.lower()
    if "spot" in lowered:
        capacity = CapacityType.SPOT
    elif "on-demand" in lowered or "ondemand" in lowered:
        capacity = CapacityType.ON_DEMAND
    else:
        capacity = group_capacity_type
    return LaunchFailure(
        activity_id=activity_id,
        group=group,
        asg_name=asg_name,
        at=at,
        message=message,
        availability_zone=az,
        instance_type=itype.group(1) if itype else group_instance_type,
        capacity_type=capacity,
        source=source,
    )
