"""Failed launches: classification, backoff, the unavailable-offerings cache, fallback and return."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.models import GroupObservation, GroupRef, InstanceObservation
from gpufleet.spot import (
    FailureClass,
    Fallback,
    LaunchFailure,
    PriceTable,
    SpotPolicy,
    SpotSettings,
    SpotState,
    classify,
    decide_fallback,
    describe_failure,
    fold_failures,
    hourly_cost_difference,
)

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SPOT = "asg:train-spot"
P = SpotPolicy()

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
    f = describe_failure("a1", SPOT, "train-spot", NOW, MESSAGES[FailureClass.SPOT_CAPACITY][1], None, "sweep")
    assert (f.instance_type, f.availability_zone, f.capacity_type) == ("g5.12xlarge", "us-east-1a", "unknown")
    g = describe_failure("a2", SPOT, "train-spot", NOW, MESSAGES[FailureClass.SPOT_CAPACITY][0], "us-east-1b", "event")
    assert (g.availability_zone, g.capacity_type) == ("us-east-1b", "spot")


def failure(i: int, at: datetime, cls: FailureClass = FailureClass.SPOT_CAPACITY) -> LaunchFailure:
    return describe_failure(
        f"act-{i}", SPOT, "train-spot", at, MESSAGES[cls][0] + " g5.12xlarge", "us-east-1a", "sweep"
    )


def test_event_and_sweep_of_the_same_activity_count_once() -> None:
    state, new = fold_failures(SpotState(), [failure(1, NOW)], NOW, P)
    state, again = fold_failures(state, [failure(1, NOW)], NOW + timedelta(minutes=1), P)
    assert len(new) == 1 and again == []


def test_backoff_doubles_from_5_to_30_minutes_and_resets_after_3_quiet_hours() -> None:
    state = SpotState()
    delays = []
    for i in range(6):
        at = NOW + timedelta(minutes=i)
        state, _ = fold_failures(state, [failure(i, at)], at, P)
        delays.append((state.backoff_until - at).total_seconds() / 60)
    assert delays == [5, 10, 20, 30, 30, 30]
    later = NOW + timedelta(hours=3, minutes=6)
    state, _ = fold_failures(state, [failure(99, later)], later, P)
    assert (state.backoff_until - later) == timedelta(minutes=5)


def test_unavailable_offerings_expire_like_karpenters_cache() -> None:
    state, _ = fold_failures(SpotState(), [failure(1, NOW)], NOW, P)
    assert list(state.unavailable) == ["g5.12xlarge/us-east-1a/spot"]
    state, _ = fold_failures(state, [], NOW + timedelta(minutes=4), P)
    assert state.unavailable == {}


def group(key: str, desired: int, in_service: int, lo: int = 0, hi: int = 10) -> GroupObservation:
    ref = GroupRef.parse_key(key)
    instances = tuple(
        InstanceObservation(
            instance_id=f"i-{key[-4:]}-{i}", lifecycle_state="InService" if i < in_service else "Pending"
        )
        for i in range(desired)
    )
    return GroupObservation(ref=ref, min_size=lo, max_size=hi, desired=desired, instances=instances)


SETTINGS = SpotSettings(group=SPOT, fallback=Fallback(group="asg:train-ondemand", wait_minutes=5))


def streak(minutes_ago: int, added: int = 0) -> SpotState:
    return SpotState(streak_started_at=NOW - timedelta(minutes=minutes_ago), fallback_added=added)


@pytest.mark.parametrize(
    ("state", "spot", "recent", "fallback_max", "desired", "added", "why"),
    [
        (streak(2), (6, 2), [FailureClass.SPOT_CAPACITY], 10, 0, 0, "fallback in"),  # still waiting
        (streak(6), (6, 2), [FailureClass.SPOT_CAPACITY], 10, 4, 4, "raise asg:train-ondemand by 4"),
        (streak(6), (6, 2), [FailureClass.SPOT_CAPACITY], 3, 3, 3, "capped by"),  # within the fallback's max
        (SpotState(), (6, 2), [FailureClass.QUOTA], 10, 0, 0, "no fallback"),  # never for quota
        (SpotState(), (6, 2), [FailureClass.SUBNET_IPS], 10, 0, 0, "no fallback"),
        (SpotState(), (6, 2), [FailureClass.CONFIGURATION], 10, 0, 0, "no fallback"),
        (streak(20, added=4), (6, 4), [], 10, 2, 2, "hand back 2 of 4"),  # two spot instances came up
        (streak(30, added=2), (6, 6), [], 10, 0, 0, "hand back 2 of 2"),  # all back on spot
        (streak(10, added=4), (6, 2), [FailureClass.SPOT_CAPACITY], 10, 4, 4, "holds 4"),
    ],
)
def test_fallback_and_gradual_return(
    state: SpotState,
    spot: tuple[int, int],
    recent: list[FailureClass],
    fallback_max: int,
    desired: int,
    added: int,
    why: str,
) -> None:
    fb = group("asg:train-ondemand", desired=state.fallback_added, in_service=state.fallback_added, hi=fallback_max)
    failures = [failure(i, NOW, cls) for i, cls in enumerate(recent)]
    d = decide_fallback(group(SPOT, *spot), fb, SETTINGS, state, failures, NOW)
    assert (d.fallback_desired, d.added_after) == (desired, added), d.reason
    assert why in d.reason


def test_cost_estimate_from_the_policys_price_table() -> None:
    prices = PriceTable(on_demand={"g5.12xlarge": 5.672}, spot={"g5.12xlarge": 2.10})
    assert hourly_cost_difference("g5.12xlarge", 2, prices) == pytest.approx(7.144)
    assert hourly_cost_difference("p5.48xlarge", 2, prices) is None
