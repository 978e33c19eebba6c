"""EC2 Auto Scaling's EventBridge events (source aws.autoscaling)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field

from gpufleet.events.common import Lenient, Name, Text, Timestamp, validate
from gpufleet.events.model import CapacityToTerminate, LaunchUnsuccessful, TerminationCandidate, TerminationRequest

LAUNCH_UNSUCCESSFUL = "EC2 Instance Launch Unsuccessful"
TERMINATION_KEY = "CapacityToTerminate"  # only a custom termination policy request has it
TERMINATION_CAUSES = ("SCALE_IN", "INSTANCE_REFRESH", "MAX_INSTANCE_LIFETIME", "REBALANCE")


class _LaunchDetail(Lenient):
    AutoScalingGroupName: Name = Field(min_length=1, max_length=255)
    ActivityId: Name = Field(min_length=1, max_length=255)
    StatusCode: Text = ""
    StatusMessage: Text = ""
    Description: Text = ""
    StartTime: Timestamp
    Details: dict[str, Any] = Field(default_factory=dict)


def _text(details: dict[str, Any], key: str) -> str | None:
    value = details.get(key)
    return str(value)[:64] if isinstance(value, str) and value else None


def from_launch_unsuccessful(event_id: str, detail: Any) -> LaunchUnsuccessful:
    d = validate(_LaunchDetail, detail, LAUNCH_UNSUCCESSFUL)
    return LaunchUnsuccessful(
        event_id=event_id,
        asg_name=d.AutoScalingGroupName,
        activity_id=d.ActivityId,
        status_code=d.StatusCode,
        message=d.StatusMessage or d.Description,
        at=d.StartTime,
        availability_zone=_text(d.Details, "Availability Zone"),
        subnet_id=_text(d.Details, "Subnet ID"),
    )


class _Capacity(Lenient):
    AvailabilityZone: Name | None = None
    Capacity: int = Field(ge=0, le=30_000)
    InstanceMarketOption: Name | None = None


class _Candidate(Lenient):
    InstanceId: Name = Field(min_length=1, max_length=64)
    AvailabilityZone: Name | None = None
    InstanceType: Name | None = None
    InstanceMarketOption: Name | None = None


class _TerminationRequest(Lenient):
    AutoScalingGroupName: Name = Field(min_length=1, max_length=255)
    CapacityToTerminate: list[_Capacity] = Field(min_length=1, max_length=100)
    Instances: list[_Candidate] = Field(default_factory=list, max_length=30_000)
    Cause: Name = Field(default="SCALE_IN", max_length=64)
    HasMoreInstances: bool = False


def from_termination_request(event: dict[str, Any]) -> TerminationRequest:
    """The request has no id or time of its own: its id is a digest of what it asks (EC2 Auto Scaling
    asks again, the same way, until it gets an answer); the service answers it at its own `now`."""
    r = validate(_TerminationRequest, event, "termination request")
    digest = hashlib.sha256(json.dumps(event, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return TerminationRequest(
        event_id=f"termination:{digest}",
        asg_name=r.AutoScalingGroupName,
        capacity=tuple(
            CapacityToTerminate(
                availability_zone=c.AvailabilityZone, capacity=c.Capacity, market=c.InstanceMarketOption
            )
            for c in r.CapacityToTerminate
        ),
        instances=tuple(
            TerminationCandidate(
                instance_id=i.InstanceId,
                availability_zone=i.AvailabilityZone,
                instance_type=i.InstanceType,
                market=i.InstanceMarketOption,
            )
            for i in r.Instances
        ),
        cause=r.Cause,
        has_more=r.HasMoreInstances,
    )
