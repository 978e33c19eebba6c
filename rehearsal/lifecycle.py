"""Capacity going away, in the rehearsal: what EC2 and EC2 Auto Scaling would send, shaped as they send it.

[emulated EC2] moto produces no spot interruptions and no Capacity Block events, and never calls a
custom termination policy; the harness builds those inputs (shapes from events/spot_watch and
events/termination_policy) and delivers them to the real functions on the simulated clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from rehearsal.alarms import ACCOUNT, REGION, eventbridge_event

BLOCK_RESERVATION = "cr-0b10c4e5d6f7a8b90"  # the demo's Capacity Block (a capacity reservation id)
# EC2 warns 40 minutes before a Capacity Block ends; its instances start terminating 30 minutes before.
BLOCK_WARNING_BEFORE_END = timedelta(minutes=40)


def _ec2_event(detail_type: str, at: datetime, resource: str, detail: dict[str, Any], tag: str) -> dict[str, Any]:
    return eventbridge_event("aws.ec2", detail_type, at, detail, [resource], f"{tag}-{at:%H%M}")


def spot_interruption_warning(instance_id: str, at: datetime) -> dict[str, Any]:
    return _ec2_event(
        "EC2 Spot Instance Interruption Warning",
        at,
        f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{instance_id}",
        {"instance-id": instance_id, "instance-action": "terminate"},
        "interruption",
    )


def capacity_block_expiration_warning(at: datetime) -> dict[str, Any]:
    end = at + BLOCK_WARNING_BEFORE_END
    return _ec2_event(
        "Capacity Block Reservation Expiration Warning",
        at,
        f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{BLOCK_RESERVATION}",
        {"capacity-reservation-id": BLOCK_RESERVATION, "end-date": end.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "block-expiring",
    )


def termination_request(
    group: str, instances: list[str], instance_type: str, capacity: int, cause: str
) -> dict[str, Any]:
    """What EC2 Auto Scaling sends a custom termination policy (one AZ, on-demand here)."""
    return {
        "AutoScalingGroupARN": (
            f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:00000000-0000-4000-8000-000000000000:"
            f"autoScalingGroupName/{group}"
        ),
        "AutoScalingGroupName": group,
        "CapacityToTerminate": [
            {"AvailabilityZone": f"{REGION}a", "Capacity": capacity, "InstanceMarketOption": "on-demand"}
        ],
        "Instances": [
            {
                "AvailabilityZone": f"{REGION}a",
                "InstanceId": iid,
                "InstanceType": instance_type,
                "InstanceMarketOption": "on-demand",
            }
            for iid in instances
        ],
        "Cause": cause,
    }
