"""Failed launches: classification, backoff, the unavailable-offerings cache, fallback and return."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest

from gpufleet.capacity.classify import FailureClass, FailureSource, LaunchFailure, describe_failure, eks_issue_id
from gpufleet.capacity.core import (
    SpotState,
    fallback_change,
    fold_failures,
    hourly_cost_difference,
    owed_after,
    plan_fallback,
)
from gpufleet.domain.models import (
    Action,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    Outcome,
)
from gpufleet.policy.capacity import Fallback, PriceTable, SpotPolicy, SpotSettings
from gpufleet.policy.fleet import GroupSettings
from tests.unit.capacity.test_classify import MESSAGES

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SPOT = "asg:train-spot"
P = SpotPolicy()


def failure(i: int, at: datetime, cls: FailureClass = FailureClass.SPOT_CAPACITY) -> LaunchFailure:
    return describe_failure(
        f"act-{i}", SPOT, "train-spot", at, MESSAGES[cls][0] + " g5.12xlarge", "us-east-1a", FailureSource.SWEEP
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


FALLBACK_SETTINGS = GroupSettings(scale_out_cooldown_s=0, scale_in_cooldown_s=0)


def idle_fallback(desired: int, hi: int) -> GroupObservation:
    obs = group("asg:train-ondemand", desired=desired, in_service=desired, hi=hi)
    idle = tuple(i.model_copy(update={"gpu_utilization": 0.0, "gpu_memory_percent": 0.0}) for i in obs.instances)
    return obs.model_copy(update={"instances": idle, "instance_metrics_loaded": True})


@pytest.mark.parametrize(
    ("state", "spot", "recent", "fallback_max", "desired", "owed", "why"),
    [
        (streak(2), (6, 2), [FailureClass.SPOT_CAPACITY], 10, 0, 0, "fallback in"),  # still waiting
        (streak(6), (6, 2), [FailureClass.SPOT_CAPACITY], 10, 4, 4, "raise by 4"),
        (streak(6), (6, 2), [FailureClass.SPOT_CAPACITY], 3, 3, 3, "capped at max"),  # within the fallback's max
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
    owed: int,
    why: str,
) -> None:
    fb = idle_fallback(state.fallback_added, fallback_max)
    failures = [failure(i, NOW, cls) for i, cls in enumerate(recent)]
    plan = plan_fallback(group(SPOT, *spot), fb, SETTINGS, state, failures, NOW)
    d = fallback_change(plan, fb, FALLBACK_SETTINGS, GroupState(), NOW, event_id="e", global_dry_run=False)
    done = d.model_copy(update={"outcome": Outcome.APPLIED}) if d is not None and d.changes_capacity else None
    assert (done.desired if done else fb.desired, owed_after(state.fallback_added, done)) == (desired, owed)
    assert why in (d.reason if d is not None else plan.reason)


def test_a_policy_max_below_the_groups_max_bounds_the_fallback() -> None:
    """Policy max 1, group max 3: the fallback raises to 1 and says so; the scaler never sets it back."""
    fb = idle_fallback(0, hi=3)
    plan = plan_fallback(group(SPOT, 6, 2), fb, SETTINGS, streak(6), [failure(1, NOW)], NOW)
    d = fallback_change(plan, fb, GroupSettings(max=1), GroupState(), NOW, event_id="e", global_dry_run=False)
    assert d is not None and (d.action, d.desired) == (Action.SCALE_OUT, 1)
    assert "capped at max" in d.reason


def test_fallback_raise_waits_for_the_scale_out_cooldown() -> None:
    fb = idle_fallback(1, hi=4)
    recent = GroupState(last_scale_out_at=NOW - timedelta(seconds=60))
    plan = plan_fallback(group(SPOT, 6, 2), fb, SETTINGS, streak(10, added=1), [failure(1, NOW)], NOW)
    d = fallback_change(plan, fb, GroupSettings(), recent, NOW, event_id="e", global_dry_run=False)
    assert d is not None and d.action is Action.HOLD and "cooldown has" in d.reason


def test_hand_back_never_removes_a_busy_fallback_node() -> None:
    fb = group("asg:train-ondemand", 2, 2, hi=4)
    busy = tuple(i.model_copy(update={"gpu_utilization": 90.0, "gpu_memory_percent": 70.0}) for i in fb.instances)
    fb = fb.model_copy(update={"instances": busy, "instance_metrics_loaded": True})
    plan = plan_fallback(group(SPOT, 6, 6), fb, SETTINGS, streak(30, added=2), [], NOW)
    d = fallback_change(plan, fb, FALLBACK_SETTINGS, GroupState(), NOW, event_id="e", global_dry_run=False)
    assert d is not None and d.action is Action.HOLD and owed_after(2, d) == 2


def test_cost_estimate_from_the_policys_price_table() -> None:
    prices = PriceTable(on_demand={"g5.12xlarge": 5.672}, spot={"g5.12xlarge": 2.10})
    assert hourly_cost_difference("g5.12xlarge", 2, prices) == pytest.approx(7.144)
    assert hourly_cost_difference("p5.48xlarge", 2, prices) is None


def test_an_eks_health_issue_id_is_the_same_in_every_process() -> None:
    """Reproduced defect: the id was built with hash(message), which Python salts per process, so the
    same node group health issue counted again after every cold start (and inflated the backoff). The id
    is pinned: one built from anything salted per process could not equal it in every run, and hash()
    is not called at all."""
    message = "Instances failed to join the kubernetes cluster"
    with mock.patch("builtins.hash", side_effect=AssertionError("hash() is salted per process")):
        found = eks_issue_id(message, datetime(2026, 11, 23, 9, tzinfo=UTC))
    assert found == "eks-health:a241da3559999dd7:2026112309"
    assert eks_issue_id(message, datetime(2026, 11, 23, 9, 59, tzinfo=UTC)) == found  # the same hour: one failure
    assert eks_issue_id(message, datetime(2026, 11, 23, 10, tzinfo=UTC)) != found
