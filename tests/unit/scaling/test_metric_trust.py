"""The bound on what a group's members can publish into a GPU series (issue 29), table tests and a property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.models import Action, Decision, GroupKind, GroupRef, MetricRef, SeriesStats, Trigger, TriggerKind
from gpufleet.scaling.metric_trust import (
    Member,
    check_group,
    combine,
    from_members,
    samples_bound,
    series_acted_on,
    series_problem,
)
from gpufleet_node import schema

LOOKBACK = 300
TWO = [Member(instance_id="i-a", gpus=4), Member(instance_id="i-b", gpus=4)]  # bound 2 x 4 x 360 = 2,880
REF = GroupRef(kind=GroupKind.ASG, name="infer")


def honest(name: str, gpus: int, util: float, seconds: int = LOOKBACK) -> SeriesStats:
    n = gpus * seconds
    return SeriesStats(name=name, samples=n, total=n * util, maximum=util, minimum=util)


def plus(stats: SeriesStats, samples: float, value: float) -> SeriesStats:
    """The series with a forged datum of `samples` samples at `value` added."""
    maximum = max(stats.maximum or value, value)
    minimum = min(stats.minimum if stats.minimum is not None else value, value)
    total = (stats.total or 0.0) + samples * value
    update = {"samples": stats.samples + samples, "total": total, "maximum": maximum, "minimum": minimum}
    return stats.model_copy(update=update)


@pytest.mark.parametrize(
    ("stats", "bound", "problem"),
    [
        (SeriesStats(name="g", samples=2880, maximum=100, minimum=0), 2880, None),
        (SeriesStats(name="g", samples=2881), 2880, "g: 2,881 samples, more than the 2,880 its publishers can write"),
        (SeriesStats(name="g", samples=10, maximum=1e9), 2880, "g: maximum 1e+09, above 100"),
        (SeriesStats(name="g", samples=10, minimum=-5), 2880, "g: minimum -5, below 0"),
        (SeriesStats(name="g"), 0, None),  # no data is no forgery
    ],
)
def test_series_problem(stats: SeriesStats, bound: float, problem: str | None) -> None:
    assert series_problem(stats, bound) == problem


def test_bound_is_a_sample_per_gpu_second_plus_one_window() -> None:
    assert samples_bound(4, LOOKBACK) == 4 * (300 + 60)
    assert samples_bound(8, 600, window_s=60, per_gpu_s=1.0) == 8 * 660


def test_the_probe_a_forged_sample_count_falls_back_to_the_members() -> None:
    group = plus(honest("group", 8, 5.0), 1e6, 100.0)
    assert check_group(group, TWO, LOOKBACK) is None
    own = {"i-a": honest("i-a", 4, 5.0), "i-b": honest("i-b", 4, 5.0)}
    verdict = from_members(group, TWO, own, LOOKBACK)
    assert verdict.trusted and verdict.utilization == pytest.approx(5.0)
    assert verdict.source.startswith("2 of 2 InService members' own series")
    assert "1,002,400 samples, more than the 2,880" in verdict.dropped[0]


@pytest.mark.parametrize(
    ("forged_members", "trusted"),
    [
        (0, True),
        (1, False),  # 1 clean of 2 is no majority
        (2, False),
    ],
)
def test_members_need_a_clean_majority(forged_members: int, trusted: bool) -> None:
    group = plus(honest("group", 8, 5.0), 1e6, 100.0)
    own = {m.instance_id: honest(m.instance_id, 4, 5.0) for m in TWO}
    for m in TWO[:forged_members]:
        own[m.instance_id] = plus(own[m.instance_id], 1e5, 100.0)
    verdict = from_members(group, TWO, own, LOOKBACK)
    assert verdict.trusted is trusted
    if not trusted:
        assert verdict.held is not None and "cannot be believed" in verdict.held and "2,880" in verdict.held


def test_three_members_one_forged_uses_the_other_two() -> None:
    members = [*TWO, Member(instance_id="i-c", gpus=4)]
    own = {m.instance_id: honest(m.instance_id, 4, 10.0) for m in members}
    own["i-c"] = plus(own["i-c"], 5000, 100.0)
    verdict = from_members(SeriesStats(name="g", samples=1e6), members, own, LOOKBACK)
    assert verdict.utilization == pytest.approx(10.0) and verdict.source.startswith("2 of 3")


def test_unknown_gpus_hold() -> None:
    members = [Member(instance_id="i-a", gpus=None)]
    assert check_group(honest("g", 4, 5.0), members, LOOKBACK) is None
    verdict = from_members(honest("g", 4, 5.0), members, {}, LOOKBACK)
    assert verdict.held is not None and "GPUs of i-a unknown" in verdict.held


def test_an_empty_group_believes_no_data() -> None:
    assert check_group(SeriesStats(name="g", samples=1, total=100, maximum=100, minimum=100), [], LOOKBACK) is None
    assert from_members(SeriesStats(name="g", samples=1), [], {}, LOOKBACK).held is not None


def test_combine_sums_periods() -> None:
    got = combine("g", {"SampleCount": [10, 20], "Sum": [50, 100], "Maximum": [9, 7], "Minimum": [1, 3]})
    assert (got.samples, got.total, got.maximum, got.minimum, got.mean) == (30, 150, 9, 1, 5.0)
    assert combine("g", {}).mean is None


def _decision(action: Action, kind: TriggerKind, name: str = "") -> Decision:
    return Decision(
        group=REF.key, action=action, current=2, desired=3, reason="r", trigger=Trigger(kind=kind, name=name),
        event_id="e", at="2026-11-26T00:00:00Z",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("decision", "metrics", "series"),
    [
        (_decision(Action.SCALE_OUT, TriggerKind.UTILIZATION_BAND), (), schema.GPU_UTILIZATION),
        (_decision(Action.HOLD, TriggerKind.UTILIZATION_BAND), (), None),  # a hold reads nothing more
        (
            _decision(Action.SCALE_OUT, TriggerKind.ALARM, "a"),
            (MetricRef(namespace="GPUFleet", name="GPUUtilization", dimensions={"AutoScalingGroupName": "infer"}),),
            schema.GPU_UTILIZATION,
        ),
        (
            _decision(Action.SCALE_IN, TriggerKind.ALARM, "a"),
            (
                MetricRef(
                    namespace="GPUFleet", name="GPUMemoryUsedPercent", dimensions={"AutoScalingGroupName": "infer"}
                ),
            ),
            schema.GPU_MEMORY_USED_PERCENT,
        ),
        (_decision(Action.SCALE_OUT, TriggerKind.ALARM, "a"), (MetricRef(namespace="AWS/SQS", name="Depth"),), None),
        (
            _decision(Action.SCALE_OUT, TriggerKind.ALARM, "a"),
            (MetricRef(namespace="GPUFleet", name="GPUUtilization", dimensions={"AutoScalingGroupName": "other"}),),
            None,
        ),
    ],
)
def test_which_decisions_are_checked(
    decision: Decision, metrics: tuple[MetricRef, ...], series: schema.Metric | None
) -> None:
    assert series_acted_on(decision, REF, {"a": metrics}) is series


@settings(max_examples=60, deadline=None)
@given(
    members=st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=6),
    util=st.floats(min_value=0, max_value=100),
    forged_value=st.floats(min_value=0, max_value=100),
    forged_share=st.floats(min_value=0, max_value=3),
)
def test_a_forger_moves_the_mean_by_its_share_of_the_slack_or_is_never_used(
    members: list[int], util: float, forged_value: float, forged_share: float
) -> None:
    """Every member publishes the whole lookback at `util`; a forger adds samples at `forged_value` to
    the group series, up to three times the slack. Under the bound the mean moves by at most the slack's
    share of the distance; over it the group series is not used and the members' mean is exact."""
    group = [Member(instance_id=f"i-{n}", gpus=g) for n, g in enumerate(members)]
    gpus = sum(members)
    slack = gpus * 60.0
    series = plus(honest("group", gpus, util), forged_share * slack, forged_value)
    verdict = check_group(series, group, LOOKBACK)
    if series.samples <= samples_bound(gpus, LOOKBACK):
        assert verdict is not None and verdict.utilization is not None
        share = slack / (gpus * (LOOKBACK + 60))  # 1/6
        assert abs(verdict.utilization - util) <= share * abs(forged_value - util) + 1e-6
    else:
        assert verdict is None
        own = {m.instance_id: honest(m.instance_id, m.gpus or 0, util) for m in group}
        used = from_members(series, group, own, LOOKBACK)
        assert used.utilization == pytest.approx(util, abs=1e-6)


def test_a_high_resolution_fleet_gets_twice_the_bound_when_the_policy_says_so() -> None:
    """`high_resolution: true` publishes each sample twice (60 s and 10 s datums): with the policy's
    `node_samples_per_gpu_s: 2` its honest series passes; at the default rate it reads as over the bound."""
    from gpufleet.scaling.metric_trust import Member, group_bound

    plain = [Member(instance_id="i-1", gpus=8), Member(instance_id="i-2", gpus=8)]
    doubled = [m.model_copy(update={"samples_per_gpu_s": 2.0}) for m in plain]
    assert group_bound(plain, 300) == 2 * 8 * 1.0 * 360
    assert group_bound(doubled, 300) == 2 * group_bound(plain, 300)
