"""Failed launches, classified: what kind of failure, where (instance type, AZ) and in which market, with a
fix hint for on-call. Pure.

The market decides what a capacity failure means: spot capacity is covered by the on-demand fallback,
on-demand capacity is not (the fallback would fail the same way). It comes from the message's own words
when it has them ("Could not launch Spot Instances." / "Could not launch On-Demand Instances.", which
mixed-instances groups and EKS node groups always prefix), else from the group's configuration (its
mixed-instances distribution, launch template market options, node group capacity type). The failed AZ
comes from the activity's Details, or the AZ the message says was requested - never from the AZs the
message suggests instead ("... or choosing us-east-1b").
"""

from __future__ import annotations

import hashlib
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
    ON_DEMAND_CAPACITY = "on-demand-capacity"
    CAPACITY_UNKNOWN_MARKET = "insufficient-capacity"  # the market could not be told: no fallback
    RESERVATION = "capacity-reservation"  # an ODCR or Capacity Block without room (or not active yet)
    QUOTA = "quota"
    SUBNET_IPS = "subnet-ip-exhaustion"
    CONFIGURATION = "configuration"
    TRANSIENT = "transient"  # IAM propagation and the like: retried by Auto Scaling, usually gone in a minute
    UNKNOWN = "unknown"

    @property
    def falls_back(self) -> bool:
        """Only a spot market problem is fixed by on-demand capacity; everything else would fail the same
        way there (or make things worse)."""
        return self in (FailureClass.SPOT_CAPACITY, FailureClass.SPOT_PRICE)

    @property
    def needs_a_fix(self) -> bool:
        """Someone has to change something (a quota, a subnet, the configuration): CRITICAL, not WARNING."""
        return self in (FailureClass.QUOTA, FailureClass.SUBNET_IPS, FailureClass.CONFIGURATION)


_CAPACITY = (
    r"InsufficientInstanceCapacity|UnfulfillableCapacity|do not have sufficient .* capacity|"
    r"no Spot capacity available|insufficient capacity|capacity-not-available"
)
# (class, detail, pattern, hint): first match wins; capacity is resolved by market afterwards.
_RULES: tuple[tuple[FailureClass, str, str, str], ...] = (
    (
        FailureClass.SPOT_PRICE,
        "",
        r"SpotMaxPriceTooLow|Spot request price of .* is lower than|price-too-low|bid price",
        "The group's Spot max price is below the market price: remove the max price (the default caps "
        "at the on-demand price).",
    ),
    (
        FailureClass.RESERVATION,
        "",
        r"ReservationCapacityExceeded|reservation does not have sufficient|Capacity Block reservation .* "
        r"not active|capacity reservation",
        "The capacity reservation (ODCR / Capacity Block) targeted has no free capacity or is not "
        "active: check its instance count, end date and instance type.",
    ),
    (
        FailureClass.SUBNET_IPS,
        "",
        r"InsufficientFreeAddressesInSubnet|not enough free addresses|free (IP )?addresses|no (free|available) IP",
        "The subnet is out of IP addresses: add subnets (or a larger CIDR) to the group, or use prefix "
        "delegation for EKS pods.",
    ),
    (
        FailureClass.QUOTA,
        "",
        r"VcpuLimitExceeded|vCPU (capacity|limit)|MaxSpotInstanceCountExceeded|max spot instance count|"
        r"InstanceLimitExceeded|instance limit|instance\(s\) are already running|MaxFleetCountExceeded|"
        r"quota for maximum Fleet|not eligible for Free Tier",
        "An account limit stops the launch: request a higher EC2 quota for this instance family "
        "(Service Quotas: 'Running "
        "On-Demand G and VT instances' / 'All G and VT Spot Instance Requests'); on-demand would hit "
        "the same kind of limit.",
    ),
    (
        FailureClass.TRANSIENT,
        "",
        r"Authentication Failure|Access denied when attempting to assume role .*AWSServiceRoleForAutoScaling",
        "IAM propagation: a role or instance profile created moments ago is not visible yet; Auto "
        "Scaling retries and it usually clears within a minute.",
    ),
    (
        FailureClass.CONFIGURATION,
        "ami",
        r"InvalidAMIID|image id .* does not exist|AMI .* (does not exist|is pending|is disabled)|Not "
        r"authorized for images|"
        r"architecture .* does not match|Enhanced networking .* is required|virtualization type",
        "The AMI cannot be launched (missing, disabled, not shared with this account, or the wrong "
        "architecture for the instance type): fix the launch template's image.",
    ),
    (
        FailureClass.CONFIGURATION,
        "key-pair",
        r"InvalidKeyPair|key pair .* does not exist",
        "The key pair in the launch template does not exist in this region: create it or remove it from the template.",
    ),
    (
        FailureClass.CONFIGURATION,
        "security-group",
        r"InvalidGroup|security group .* (does not exist|cannot be found)",
        "A security group of the launch template does not exist (or is in another VPC): fix the "
        "template's security groups.",
    ),
    (
        FailureClass.CONFIGURATION,
        "instance-profile",
        r"IamInstanceProfile|iamInstanceProfile|Invalid IAM Instance Profile|UnauthorizedOperation|not "
        r"authorized to perform",
        "The instance profile is missing or Auto Scaling may not pass it (iam:PassRole): fix the "
        "profile or the service-linked role's permissions.",
    ),
    (
        FailureClass.CONFIGURATION,
        "launch-template",
        r"InvalidLaunchTemplate|launch template .* (does not exist|cannot be found)|valid fully-formed launch template",
        "The group's launch template (or version) is gone or invalid: point the group at an existing version.",
    ),
    (
        FailureClass.CONFIGURATION,
        "kms",
        r"InvalidKMSKey|KMS key|Client\.InternalError|encrypted volume",
        "An encrypted EBS volume's KMS key is unusable by Auto Scaling: grant "
        "AWSServiceRoleForAutoScaling use of the key (key policy/grant) or fix the key's state.",
    ),
    (
        FailureClass.CONFIGURATION,
        "block-device",
        r"Invalid device name|virtualName is invalid|block device mappings not supported",
        "The launch template's block device mappings are invalid for this AMI or instance type: fix the device names.",
    ),
    (
        FailureClass.CONFIGURATION,
        "placement",
        r"Placement group|placement_group|Placement Group",
        "The placement group does not fit (instance type or AZ): use a matching placement group or none.",
    ),
    (
        FailureClass.CONFIGURATION,
        "az-unsupported",
        r"Availability Zone is (no longer supported|currently constrained)",
        "The AZ no longer takes new instances: remove it (or its subnet) from the group.",
    ),
    (
        FailureClass.CONFIGURATION,
        "instance-type-unsupported",
        r"not supported in your requested Availability Zone|requested configuration is currently not "
        r"supported|InvalidFleetConfiguration|Unsupported",
        "The instance type is not offered in that AZ (or not with this configuration): remove the AZ or "
        "add instance types.",
    ),
    (
        FailureClass.CONFIGURATION,
        "subscription",
        r"not subscribed to this service|account is currently blocked|OptInRequired",
        "The account cannot launch this (not subscribed / opted in, or blocked): check the account's "
        "status and Marketplace subscriptions.",
    ),
    (
        FailureClass.CONFIGURATION,
        "load-balancer",
        r"Load Balancer|target groups not found|load balancer configuration",
        "The group's load balancer or target group is gone: fix the group's load balancing settings.",
    ),
    (
        FailureClass.CONFIGURATION,
        "",
        r"InvalidParameter|not found\.|AutoScalingGroup .* not found",
        "The launch configuration is invalid: see the activity's message; retrying or falling back will "
        "fail the same way.",
    ),
)
_COMPILED = tuple((cls, detail, re.compile(p, re.IGNORECASE), hint) for cls, detail, p, hint in _RULES)
_CAPACITY_RE = re.compile(_CAPACITY, re.IGNORECASE)
_UNKNOWN_HINT = "Unrecognised failure: see the scaling activity's status message in the Auto Scaling console."
_CAPACITY_HINTS = {
    FailureClass.SPOT_CAPACITY: (
        "Spot capacity for this type/AZ is exhausted: add instance types and AZs to the group (mixed "
        "instances policy, price-capacity-optimized); gpufleet falls back to on-demand meanwhile if configured."
    ),
    FailureClass.ON_DEMAND_CAPACITY: (
        "EC2 has no on-demand capacity for this type in this AZ right now (an on-demand fallback cannot "
        "help): add AZs{suggested} or instance types to the group, or reserve capacity (On-Demand Capacity "
        "Reservation, Capacity Blocks for ML)."
    ),
    FailureClass.CAPACITY_UNKNOWN_MARKET: (
        "Insufficient capacity, and the group's market could not be told (no fallback): tag the group "
        "gpufleet:capacity-type=spot|on-demand, or add AZs and instance types."
    ),
}
_INSTANCE_TYPE = re.compile(
    r"\b([a-z][a-z0-9-]*\d[a-z0-9-]*\.(?:\d*x?large|metal[a-z0-9-]*|medium|small|micro|nano))\b"
)
_FAILED_AZ = re.compile(
    r"(?:Availability Zone you requested|requested Availability Zone) \(([a-z]{2}(?:-gov)?-[a-z]+-\d[a-z])\)"
)
_SUGGESTED = re.compile(r"choosing ((?:[a-z]{2}(?:-gov)?-[a-z]+-\d[a-z](?:, )?)+)")


def message_market(message: str) -> CapacityType:
    """The market a failure message names itself, if any."""
    if re.search(
        r"Could not launch Spot Instances|Spot request|Spot capacity|spot instance|Spot Instance", message, re.I
    ):
        return CapacityType.SPOT
    # EC2's on-demand capacity wording ("... in the Availability Zone you requested (az) ... or choosing
    # ..."); a spot request that finds no capacity says "no Spot capacity available" instead.
    if re.search(
        r"Could not launch On-Demand Instances|We currently do not have sufficient .* capacity", message, re.I
    ):
        return CapacityType.ON_DEMAND
    return CapacityType.UNKNOWN


def classify(message: str, market: CapacityType = CapacityType.UNKNOWN) -> tuple[FailureClass, str, str]:
    """(class, detail, fix hint) for a failure message in a group of the given market."""
    for cls, detail, pattern, hint in _COMPILED:
        if pattern.search(message):
            return cls, detail, hint
    if _CAPACITY_RE.search(message):
        said = message_market(message)
        market = said if said is not CapacityType.UNKNOWN else market
        if market is CapacityType.SPOT:
            cls = FailureClass.SPOT_CAPACITY
        elif market in (CapacityType.ON_DEMAND, CapacityType.CAPACITY_BLOCK):
            cls = FailureClass.ON_DEMAND_CAPACITY
        else:
            cls = FailureClass.CAPACITY_UNKNOWN_MARKET
        suggested = suggested_azs(message)
        hint = _CAPACITY_HINTS[cls].format(suggested=f" (EC2 suggests {', '.join(suggested)})" if suggested else "")
        return cls, "", hint
    return FailureClass.UNKNOWN, "", _UNKNOWN_HINT


def suggested_azs(message: str) -> tuple[str, ...]:
    m = _SUGGESTED.search(message)
    return tuple(az.strip() for az in m.group(1).split(",") if az.strip()) if m else ()


def failed_az(message: str, details_az: str | None) -> str | None:
    """The activity's own AZ, else the one the message says was requested (never a suggested one)."""
    if details_az:
        return details_az
    m = _FAILED_AZ.search(message)
    return m.group(1) if m else None


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
    failure_class: FailureClass = FailureClass.UNKNOWN
    detail: str = ""  # what part of the configuration, for configuration failures
    hint: str = _UNKNOWN_HINT

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
    """Classify one failure: market from the message's own words, else the group's configuration;
    instance type from the message, else the group's single type; the failed AZ as `failed_az` says."""
    said = message_market(message)
    market = said if said is not CapacityType.UNKNOWN else group_capacity_type
    cls, detail, hint = classify(message, market)
    itype = _INSTANCE_TYPE.search(message)
    return LaunchFailure(
        activity_id=activity_id,
        group=group,
        asg_name=asg_name,
        at=at,
        message=message[:2048],
        availability_zone=failed_az(message, details_az),
        instance_type=itype.group(1) if itype else group_instance_type,
        capacity_type=market,
        source=source,
        failure_class=cls,
        detail=detail,
        hint=hint,
    )


def eks_issue_id(message: str, now: datetime) -> str:
    """A node group health issue has no activity id: the same message within the hour is one failure,
    the same across processes and cold starts (a stable digest, not Python's salted hash())."""
    return f"eks-health:{hashlib.sha256(message.encode()).hexdigest()[:16]}:{now:%Y%m%d%H}"
