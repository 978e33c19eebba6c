"""EC2's EventBridge events about capacity going away (source aws.ec2): spot interruption warnings,
rebalance recommendations and Capacity Block reservations (delivered, expiring).

Shapes as AWS documents them (tests/fixtures/real_events): the interruption and rebalance details carry
only the instance id (and the interruption's action); the Capacity Block events carry the reservation id
and its end date, which AWS's own page documents with placeholders, so the end date is optional here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gpufleet.events.common import Lenient, Name, Timestamp, validate
from gpufleet.events.model import CapacityBlockEvent, EventKind, InstanceWarning

SPOT_INTERRUPTION = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
CAPACITY_BLOCK_EXPIRING = "Capacity Block Reservation Expiration Warning"
CAPACITY_BLOCK_DELIVERED = "Capacity Block Reservation Delivered"
# Another version of AWS's page names them without "Reservation"; both are matched.
CAPACITY_BLOCK_PHASES: dict[str, Literal["delivered", "expiring"]] = {
    CAPACITY_BLOCK_EXPIRING: "expiring",
    "Capacity Block Expiration Warning": "expiring",
    CAPACITY_BLOCK_DELIVERED: "delivered",
    "Capacity Block Delivered": "delivered",
}


class _InstanceDetail(Lenient):
    instance_id: Name = Field(alias="instance-id", min_length=1, max_length=64)
    instance_action: Name | None = Field(default=None, alias="instance-action", max_length=32)


class _ReservationDetail(Lenient):
    reservation_id: Name = Field(alias="capacity-reservation-id", min_length=1, max_length=64)
    end_date: Timestamp | None = Field(default=None, alias="end-date")


def instance_warning(kind: EventKind, detail_type: str, event_id: str, detail: Any, at: Any) -> InstanceWarning:
    d = validate(_InstanceDetail, detail, detail_type)
    return InstanceWarning(kind=kind, event_id=event_id, instance_id=d.instance_id, action=d.instance_action, at=at)


def capacity_block(detail_type: str, event_id: str, detail: Any, at: Any) -> CapacityBlockEvent:
    d = validate(_ReservationDetail, detail, detail_type)
    return CapacityBlockEvent(
        event_id=event_id,
        reservation_id=d.reservation_id,
        phase=CAPACITY_BLOCK_PHASES[detail_type],
        end=d.end_date,
        at=at,
    )
