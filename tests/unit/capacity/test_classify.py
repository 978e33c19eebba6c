"""Launch-failure classification: every text AWS publishes, both markets, with a fix hint."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.capacity.classify import FailureClass, FailureSource, classify, describe_failure
from gpufleet.domain.models import CapacityType

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SPOT = "asg:train-spot"

MESSAGES = {
    FailureClass.SPOT_CAPACITY: [
        "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to your request "
        "configuration. Please adjust your request and try again. Launching EC2 instance failed.",
        "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available that "
        "matches your request. g5.12xlarge in us-east-1a. Launching EC2 instance failed.",
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


GENERIC_ICE = "Launching a new EC2 instance. Status Reason: Insufficient capacity. Launching EC2 instance failed."
OD_ICE = (
    "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you requested "
    "(us-east-1d). Our system will be working on provisioning additional capacity. You can currently get "
    "p4d.24xlarge capacity by not specifying an Availability Zone in your request or choosing us-east-1a, us-east-1b."
)
TEXTS = json.loads((Path(__file__).with_name("launch_failure_texts.json")).read_text())


def _expected(row: dict[str, str], market: CapacityType) -> FailureClass:
    if row["class"] != "capacity":
        return FailureClass(row["class"])
    said = {"spot": CapacityType.SPOT, "on-demand": CapacityType.ON_DEMAND}.get(row["market_in_text"])
    return FailureClass.SPOT_CAPACITY if (said or market) is CapacityType.SPOT else FailureClass.ON_DEMAND_CAPACITY


@pytest.mark.parametrize("market", [CapacityType.SPOT, CapacityType.ON_DEMAND])
@pytest.mark.parametrize("row", TEXTS, ids=lambda r: r["text"][:50])
def test_every_published_launch_failure_text_in_both_markets(row: dict[str, str], market: CapacityType) -> None:
    """One row per text AWS documents or users reported (sources in launch_failure_texts.json)."""
    cls, detail, hint = classify(row["text"], market)
    assert cls is _expected(row, market)
    assert detail == row["detail"] and hint
    assert cls.falls_back is (cls in (FailureClass.SPOT_CAPACITY, FailureClass.SPOT_PRICE))


@pytest.mark.parametrize(
    ("message", "market", "expected"),
    [
        (GENERIC_ICE, CapacityType.ON_DEMAND, FailureClass.ON_DEMAND_CAPACITY),
        (GENERIC_ICE, CapacityType.SPOT, FailureClass.SPOT_CAPACITY),
        (GENERIC_ICE, CapacityType.CAPACITY_BLOCK, FailureClass.ON_DEMAND_CAPACITY),
        (GENERIC_ICE, CapacityType.UNKNOWN, FailureClass.CAPACITY_UNKNOWN_MARKET),
        (OD_ICE, CapacityType.SPOT, FailureClass.ON_DEMAND_CAPACITY),  # EC2's on-demand wording
        (
            MESSAGES[FailureClass.SPOT_CAPACITY][0],
            CapacityType.ON_DEMAND,
            FailureClass.SPOT_CAPACITY,
        ),  # the text says spot
    ],
)
def test_an_insufficient_capacity_failure_is_spot_only_in_a_spot_market(
    message: str, market: CapacityType, expected: FailureClass
) -> None:
    """Reproduced defect: an on-demand ICE was called spot-capacity and started the on-demand fallback."""
    cls, _, _ = classify(message, market)
    assert cls is expected and cls.falls_back is (expected is FailureClass.SPOT_CAPACITY)


def test_on_demand_capacity_says_which_azs_ec2_suggests_and_how_to_reserve() -> None:
    f = describe_failure("a", SPOT, "train", NOW, OD_ICE, None, FailureSource.SWEEP, CapacityType.SPOT)
    assert f.failure_class is FailureClass.ON_DEMAND_CAPACITY
    assert f.availability_zone == "us-east-1d"  # the failed AZ, never a suggested one
    assert "EC2 suggests us-east-1a, us-east-1b" in f.hint and "Capacity Blocks" in f.hint


def test_the_failed_az_comes_from_details_first() -> None:
    text = "There is no Spot capacity available that matches your request or choosing us-east-1c."
    f = describe_failure("a", SPOT, "train", NOW, text, "us-east-1b", FailureSource.EVENT)
    assert f.availability_zone == "us-east-1b" and f.capacity_type is CapacityType.SPOT


@pytest.mark.parametrize(
    ("expected", "message"), [(cls, m) for cls, ms in MESSAGES.items() for m in ms], ids=lambda v: str(v)[:30]
)
def test_every_failure_class_and_its_fix_hint(expected: FailureClass, message: str) -> None:
    cls, _, hint = classify(message, CapacityType.SPOT)
    assert cls is expected
    assert hint
    assert cls.falls_back is (expected in (FailureClass.SPOT_CAPACITY, FailureClass.SPOT_PRICE))


def test_type_az_and_capacity_type_come_out_of_the_message() -> None:
    f = describe_failure("a1", SPOT, "train-spot", NOW, OD_ICE, None, FailureSource.SWEEP)
    assert (f.instance_type, f.availability_zone, f.capacity_type) == (
        "p4d.24xlarge",
        "us-east-1d",
        CapacityType.ON_DEMAND,
    )
    g = describe_failure(
        "a2", SPOT, "train-spot", NOW, MESSAGES[FailureClass.SPOT_CAPACITY][0], "us-east-1b", FailureSource.EVENT
    )
    assert (g.availability_zone, g.capacity_type) == ("us-east-1b", CapacityType.SPOT)
