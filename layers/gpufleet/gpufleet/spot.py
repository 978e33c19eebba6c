"""Failed launches: classify them, back off like Cluster Autoscaler, remember unavailable offerings like
Karpenter, and decide an on-demand fallback and its gradual return. Pure: no boto3, no clock.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import Field

from gpufleet.models import Frozen, GroupObservation


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
    capacity_type: str = "unknown"  # spot | on-demand | unknown
    source: str = "sweep"

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
    source: str,
    group_capacity_type: str = "unknown",
    group_instance_type: str | None = None,
) -> LaunchFailure:
    """Pull instance type, AZ and capacity type out of what the activity says (UnfulfillableCapacity
    messages name no type: then the group's own instance type, when it has one)."""
    itype = _INSTANCE_TYPE.search(message)
    az = details_az or (m.group(1) if (m := _AZ.search(message)) else None)
    lowered = message.lower()
    if "spot" in lowered:
        capacity = "spot"
    elif "on-demand" in lowered or "ondemand" in lowered:
        capacity = "on-demand"
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


# ---- policy ----


class Fallback(Frozen):
    group: str  # "asg:NAME" or "eks:CLUSTER/NODEGROUP": the on-demand group to raise
    wait_minutes: int = Field(default=5, ge=0, le=120)  # spot failures for this long before falling back


class SpotSettings(Frozen):
    group: str  # the spot group this applies to
    fallback: Fallback | None = None


class PriceTable(Frozen):
    """$ per instance-hour, for the cost estimate in notifications (your prices; not fetched)."""

    on_demand: dict[str, float] = Field(default_factory=dict)
    spot: dict[str, float] = Field(default_factory=dict)


class SpotPolicy(Frozen):
    groups: tuple[SpotSettings, ...] = ()
    prices: PriceTable = PriceTable()
    backoff_initial_s: int = Field(default=300, ge=10)
    backoff_max_s: int = Field(default=1800, ge=10)
    backoff_reset_s: int = Field(default=3 * 3600, ge=60)
    unavailable_ttl_s: int = Field(default=180, ge=10)  # Karpenter keeps insufficient-capacity offerings 3 min

    def settings_for(self, group: str) -> SpotSettings | None:
        return next((g for g in self.groups if g.group == group), None)


# ---- state and decisions ----


class SpotState(Frozen):
    version: int = 0
    seen: tuple[str, ...] = ()  # activity ids already counted (event + sweep dedup), bounded
    streak_started_at: datetime | None = None  # first spot-capacity failure of the current streak
    last_failure_at: datetime | None = None
    backoff_level: int = 0
    backoff_until: datetime | None = None
    unavailable: dict[str, datetime] = Field(default_factory=dict)  # offering -> until
    fallback_added: int = 0  # instances we added to the fallback group and still owe back
    notified_classes: tuple[str, ...] = ()  # failure classes already told in the current streak


MAX_SEEN = 500


def fold_failures(
    state: SpotState, failures: list[LaunchFailure], now: datetime, p: SpotPolicy
) -> tuple[SpotState, list[LaunchFailure]]:
    """New failures only (dedup by activity id) folded into the group's state: backoff (5 min doubling to
    30, reset after 3 h quiet), the unavailable-offerings cache, the streak."""
    new = [f for f in sorted(failures, key=lambda f: f.at) if f.activity_id not in state.seen]
    seen = (*state.seen, *(f.activity_id for f in new))[-MAX_SEEN:]
    level, until, streak, last = (
        state.backoff_level,
        state.backoff_until,
        state.streak_started_at,
        state.last_failure_at,
    )
    if last is not None and now - last >= timedelta(seconds=p.backoff_reset_s):
        level, streak = 0, None
    unavailable = {k: v for k, v in state.unavailable.items() if v > now}
    for f in new:
        level = level + 1
        delay = min(p.backoff_max_s, p.backoff_initial_s * 2 ** (level - 1))
        until = f.at + timedelta(seconds=delay)
        last = max(last, f.at) if last else f.at
        if f.failure_class is FailureClass.SPOT_CAPACITY:
            unavailable[f.offering] = f.at + timedelta(seconds=p.unavailable_ttl_s)
        if f.failure_class.falls_back and streak is None:
            streak = f.at
    return (
        state.model_copy(
            update={
                "seen": seen,
                "backoff_level": level,
                "backoff_until": until,
                "streak_started_at": streak,
                "last_failure_at": last,
                "unavailable": unavailable,
            }
        ),
        new,
    )


class FallbackDecision(Frozen):
    spot_group: str
    fallback_group: str | None
    unfulfilled: int
    added_before: int
    added_after: int
    fallback_desired: int | None
    reason: str
    recovered: bool = False


def in_service(obs: GroupObservation) -> int:
    return sum(1 for i in obs.instances if i.lifecycle_state == "InService")


def decide_fallback(
    spot: GroupObservation,
    fallback: GroupObservation | None,
    settings: SpotSettings,
    state: SpotState,
    recent: list[LaunchFailure],
    now: datetime,
) -> FallbackDecision:
    """Raise the on-demand group by what spot cannot deliver (desired - in service), after a bounded wait
    of spot-capacity failures; hand it back as spot instances come into service. Never for quota, subnet
    or configuration failures."""
    unfulfilled = max(0, spot.desired - in_service(spot))
    base = {"spot_group": spot.ref.key, "unfulfilled": unfulfilled, "added_before": state.fallback_added}
    if settings.fallback is None or fallback is None:
        return FallbackDecision(
            **base, fallback_group=None, added_after=0, fallback_desired=None, reason="no fallback configured"
        )
    fb = settings.fallback
    # Auto Scaling backs off between attempts, so a tick without a new failure is not a recovery: the
    # streak lasts while spot is short of what was asked for.
    ongoing = state.streak_started_at is not None and unfulfilled > 0
    spot_trouble = [f for f in recent if f.failure_class.falls_back] or ongoing
    blocking = [f for f in recent if not f.failure_class.falls_back]
    waited = state.streak_started_at is not None and now - state.streak_started_at >= timedelta(minutes=fb.wait_minutes)
    if state.fallback_added == 0:
        if blocking and not spot_trouble:
            reason = f"{blocking[-1].failure_class} failure: no fallback (on-demand would fail the same way)"
            target = 0
        elif not spot_trouble or unfulfilled == 0:
            reason = "spot is delivering: no fallback needed"
            target = 0
        elif not waited:
            left = (
                (state.streak_started_at + timedelta(minutes=fb.wait_minutes) - now)
                if state.streak_started_at
                else None
            )
            reason = (
                f"spot capacity failing; fallback in {int(left.total_seconds()) if left else fb.wait_minutes * 60}s"
            )
            target = 0
        else:
            target = unfulfilled
            reason = f"spot capacity failing for {fb.wait_minutes}+ min: raise {fb.group} by {unfulfilled}"
    else:
        # Already fallen back: follow the gap; it shrinks only as spot instances come into service.
        target = min(state.fallback_added, unfulfilled) if not spot_trouble else unfulfilled
        if target < state.fallback_added:
            reason = f"spot delivering again: hand back {state.fallback_added - target} of {state.fallback_added}"
        elif target > state.fallback_added:
            reason = f"spot still failing: fallback {state.fallback_added} -> {target}"
        else:
            reason = f"fallback holds {target} while spot is {unfulfilled} short"
    lo, hi = fallback.min_size, fallback.max_size
    desired_base = fallback.desired - state.fallback_added
    desired = min(max(desired_base + target, lo), hi)
    added = max(0, desired - desired_base)
    if added < target:
        reason += f" (capped by {fb.group} max {hi})"
    return FallbackDecision(
        **base,
        fallback_group=fb.group,
        added_after=added,
        fallback_desired=desired,
        reason=reason,
        recovered=state.fallback_added > 0 and added == 0,
    )


def hourly_cost_difference(instance_type: str | None, instances: int, prices: PriceTable) -> float | None:
    if not instance_type or instance_type not in prices.on_demand or instance_type not in prices.spot:
        return None
    return instances * (prices.on_demand[instance_type] - prices.spot[instance_type])
