"""Launch-failure classification: every text AWS publishes, both markets, with a fix hint."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.capacity.classify import FailureClass, FailureSource, classify, describe_failure
from gpufleet.domain.models import CapacityType

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SPOT = "asg:train-spot"

MESSAGES = {
    FailureClass.SPOT_CAPACITY: [
        "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to your request "
        "configuration. Please adjust your request and try again. Launching EC2 instance failed.",
        "We currently do not have sufficient g5.12xlarge capacity in the Availability Zone you requested "
        "(us-east-1a). Our system will be working on provisioning additional capacity. "
        "InsufficientInstanceCapacity",
        "There is no Spot capacity available that matches your request. Launching EC2 instance failed.",
    ],
    FailureClass.SPOT_PRICE: [
        "Could not launch Spot Instances. SpotMaxPriceTooLow - Your Spot request price of 1.2 is lower than the "
        "minimum required Spot request fulfillment price of 2.1. Launching EC2 instance failed."
    ],
    FailureClass.QUOTA: [
        "You have requested more vCPU capacity than your current vCPU limit of 64 allows for the instance bucket "
        "that the specified instance type belongs to. VcpuLimitExceeded. Launching EC2 instance failed.",
        "Could not launch Spot Instances. MaxSpotInstanceCountExceeded - Max spot instance count exceeded.",
        "InstanceLimitExceeded: Your quota allows for 0 more running instance(s).",
    ],
    FailureClass.SUBNET_IPS: [
        "There are not enough free addresses in subnet 'subnet-0abc' to satisfy the requested number of "
        "instances. InsufficientFreeAddressesInSubnet. Launching EC2 instance failed."
    ],
    FailureClass.CONFIGURATION: [
        "The image id '[ami-0123]' does not exist. Launching EC2 instance failed.",
        "Value (gpu-node-profile) for parameter iamInstanceProfile.name is invalid. Invalid IamInstanceProfile.",
        "You are not authorized to perform this operation. UnauthorizedOperation.",
    ],
    FailureClass.UNKNOWN: ["Something unexpected happened. Launching EC2 instance failed."],
}


@pytest.mark.parametrize(
    ("expected", "message"), [(cls, m) for cls, ms in MESSAGES.items() for m in ms], ids=lambda v: str(v)[:30]
)
def test_every_failure_class_and_its_fix_hint(expected: FailureClass, message: str) -> None:
    cls, hint = classify(message)
    assert cls is expected
    assert hint
    assert cls.falls_back is (expected in (FailureClass.SPOT_CAPACITY, FailureClass.SPOT_PRICE))


def test_type_az_and_capacity_type_come_out_of_the_message() -> None:
    f = describe_failure(
        "a1", SPOT, "train-spot", NOW, MESSAGES[FailureClass.SPOT_CAPACITY][1], None, FailureSource.SWEEP
    )
    assert (f.instance_type, f.availability_zone, f.capacity_type) == (
        "g5.12xlarge",
        "us-east-1a",
        CapacityType.UNKNOWN,
    )
    g = describe_failure(
        "a2", SPOT, "train-spot", NOW, MESSAGES[FailureClass.SPOT_CAPACITY][0], "us-east-1b", FailureSource.EVENT
    )
    assert (g.availability_zone, g.capacity_type) == ("us-east-1b", CapacityType.SPOT)
