"""EC2 Auto Scaling's EventBridge events (source aws.autoscaling)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gpufleet.events.common import Lenient, Name, Text, Timestamp, validate
from gpufleet.events.model import LaunchUnsuccessful

LAUNCH_UNSUCCESSFUL = "EC2 Instance Launch Unsuccessful"


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
