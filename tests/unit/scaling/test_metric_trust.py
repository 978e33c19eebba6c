"""The bound on what a group's members can publish into a GPU series (issue 29), table tests and a property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    AlarmCondition,
    Decision,
    GroupRef,
    MetricRef,
    SeriesStats,
    Trigger,
    TriggerKind,
)
from gpufleet.domain.series import combine
from gpufleet.scaling.metric_trust import (
    MEMBER_LEFT,
    Member,
    Verdict,
    alarm_checked,
    check_group,
    from_members,
    minute_bound,
    samples_bound,
    series_acted_on,
    series_problem,
    statistic_problem,
)
from gpufleet_node import schema
from tests.profiles import examples

LOOKBACK = 300
TWO = [Member(instance_id="i-a", gpus=4), Member(instance_id="i-b", gpus=4)]  # bound 2 x 4 x 360 = 2,880
REF = GroupRef(kind=GroupKind.ASG, name="infer")


def honest(name: str, gpus: int, util: float, seconds: int = LOOKBACK) -> SeriesStats:
    """What `gpus` GPUs publish at `util` for `seconds`: full minutes of gpus x 60 samples."""
    n = gpus * seconds
    return SeriesStats(name=name, samples=n, total=n * util, maximum=util, minimum=util, busiest_minute=gpus * 60)


def plus(stats: SeriesStats, samples: float, value: float) -> SeriesStats:
    """The series with a forged datum of `samples` samples at `value` added."""
    maximum = max(stats.maximum or value, value)
    minimum = min(stats.minimum if stats.minimum is not None else value, value)
    total = (stats.total or 0.0) + samples * value
    update = {"samples": stats.samples + samples, "total": total, "maximum": maximum, "minimum": minimum}
    return stats.model_copy(update={**update, "busiest_minute": stats.busiest_minute + samples})  # all in one minute


@pytest.mark.parametrize(
    ("stats", "bound", "problem"),
    [
        (SeriesStats(name="g", samples=2880, maximum=100, minimum=0), 2880, None),
        (SeriesStats(name="g", samples=2881), 2880, "g: 2,881 samples, more than the 2,880 its publishers can write"),
        (SeriesStats(name="g", samples=10, maximum=1e9), 2880, "g: maximum 1e+09, above 100"),
        (SeriesStats(name="g", samples=10, minimum=-5), 2880, "g: minimum -5, below 0"),
        (SeriesStats(name="g"), 0, None),  # no data is no forgery
        (
            SeriesStats(name="g", samples=600, busiest_minute=491),
            2880,
            "g: 491 samples in one minute, more than the 490 its publishers can write in a minute",
        ),
    ],
)
def test_series_problem(stats: SeriesStats, bound: float, problem: str | None) -> None:
    assert series_problem(stats, bound, minute_bound(8)) == problem


def test_the_minute_bound_is_a_window_of_samples_plus_two_percent() -> None:
    """Windows start on the epoch's minute, so one member's 60 s window lands whole in one period."""
    assert minute_bound(4) == pytest.approx(4 * 60 * 1.02)
    assert minute_bound(8, per_gpu_s=2.0) == pytest.approx(8 * 2 * 60 * 1.02)  # high_resolution: true
    assert minute_bound(4, window_s=300) == pytest.approx(4 * 300 * 1.02)  # a 300 s window is one datum


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
        (1, False),  # one member's own series failing holds the group: no member is left out
        (2, False),
    ],
)
def test_every_member_must_be_clean(forged_members: int, trusted: bool) -> None:
    group = plus(honest("group", 8, 5.0), 1e6, 100.0)
    own = {m.instance_id: honest(m.instance_id, 4, 5.0) for m in TWO}
    for m in TWO[:forged_members]:
        own[m.instance_id] = plus(own[m.instance_id], 1e5, 100.0)
    verdict = from_members(group, TWO, own, LOOKBACK)
    assert verdict.trusted is trusted
    assert (verdict.tell, verdict.forged) == (not trusted, not trusted)  # a member's own series: evidence, told
    if not trusted:
        assert verdict.held is not None and "cannot be believed" in verdict.held and "1,440" in verdict.held


def test_a_forger_cannot_pick_which_members_count() -> None:
    """Probe: 95/95/5 % (65 %, in band). Spoiling the idle member's own series used to drop it and let
    the two busy ones (a majority) read 95 %. Now the group holds, naming that series."""
    members = [*TWO, Member(instance_id="i-c", gpus=4)]
    own = {"i-a": honest("i-a", 4, 95.0), "i-b": honest("i-b", 4, 95.0), "i-c": honest("i-c", 4, 5.0)}
    own["i-c"] = plus(own["i-c"], 3000, 50.0)
    verdict = from_members(SeriesStats(name="g", samples=1e6), members, own, LOOKBACK)
    assert verdict.utilization is None and verdict.held is not None and "1 of 3" in verdict.held
    assert "i-c: 4,200 samples, more than the 1,440" in verdict.held and verdict.tell


@pytest.mark.parametrize(
    ("group", "tell", "note"),
    [
        # A member left (or a node wrote on the group series only): the members decide, nobody is paged.
        (honest("g", 12, 50.0), False, MEMBER_LEFT),
        # The same, in one minute only: the minute bound fails, the members decide.
        (honest("g", 8, 50.0).model_copy(update={"busiest_minute": 8 * 60 * 1.5}), False, MEMBER_LEFT),
        # A value no percent series holds is evidence: the members decide and on-call is told.
        (honest("g", 8, 50.0).model_copy(update={"maximum": 1e9}), True, "maximum 1e+09, above 100"),
        # More than twice the max size of 8-GPU members could publish (2 x 4 x 8 x 360 s = 23,040): no
        # member that left explains it (one that left may have been larger, the max size lowered since).
        (honest("g", 200, 50.0), True, "decided on the members' own series"),  # 60,000 samples
        (honest("g", 60, 50.0), False, MEMBER_LEFT),  # 18,000 samples: under that ceiling, not paged
        (honest("g", 16, 50.0), False, MEMBER_LEFT),  # two members that just left (4,800 samples): not paged
    ],
)
def test_a_failing_group_series_with_clean_members_decides_on_them(group: SeriesStats, tell: bool, note: str) -> None:
    own = {m.instance_id: honest(m.instance_id, 4, 20.0) for m in TWO}
    assert check_group(group, TWO, LOOKBACK) is None
    verdict = from_members(group, TWO, own, LOOKBACK, max_size=4)
    assert verdict.utilization == pytest.approx(20.0) and not verdict.from_group
    assert (verdict.tell, verdict.forged) == (tell, tell)
    assert note in verdict.note


def test_a_member_still_booting_counts_with_what_it_wrote() -> None:
    own = {"i-a": honest("i-a", 4, 30.0), "i-b": SeriesStats(name="i-b")}  # i-b has published nothing yet
    verdict = from_members(honest("g", 12, 50.0), TWO, own, LOOKBACK)
    assert verdict.utilization == pytest.approx(30.0) and not verdict.tell


def test_unknown_gpus_hold() -> None:
    members = [Member(instance_id="i-a", gpus=None)]
    assert check_group(honest("g", 4, 5.0), members, LOOKBACK) is None
    verdict = from_members(honest("g", 4, 5.0), members, {}, LOOKBACK)
    assert verdict.held is not None and "GPUs of i-a unknown" in verdict.held
    assert verdict.tell and not verdict.forged  # told: the series cannot be checked at all


def test_an_empty_group_believes_no_data() -> None:
    assert check_group(SeriesStats(name="g", samples=1, total=100, maximum=100, minimum=100), [], LOOKBACK) is None
    verdict = from_members(SeriesStats(name="g", samples=1), [], {}, LOOKBACK)
    assert verdict.held is not None and "no InService member" in verdict.held and not verdict.tell


def test_combine_sums_periods_and_keeps_the_busiest_minute() -> None:
    got = combine("g", {"SampleCount": [10, 20], "Sum": [50, 100], "Maximum": [9, 7], "Minimum": [1, 3]})
    assert (got.samples, got.total, got.maximum, got.minimum, got.mean) == (30, 150, 9, 1, 5.0)
    assert got.busiest_minute == 20
    assert combine("g", {}).mean is None and combine("g", {}).busiest_minute == 0


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


@settings(max_examples=examples(60), deadline=None)
@given(
    members=st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=6),
    util=st.floats(min_value=0, max_value=100),
    forged_value=st.floats(min_value=0, max_value=100),
    forged_share=st.floats(min_value=0, max_value=3),
    spread=st.integers(min_value=1, max_value=LOOKBACK // 60),
)
def test_a_forger_moves_a_minute_by_the_jitter_or_is_never_used(
    members: list[int], util: float, forged_value: float, forged_share: float, spread: int
) -> None:
    """Every member publishes every minute of the lookback at `util`; a forger adds up to three times
    the lookback's slack at `forged_value` to the group series, spread evenly over `spread` of those
    minutes. Believed, the series moves by at most the minute jitter's share of the distance (2 %: a
    minute the members published holds no room but that); not believed, the members' own mean is exact
    and nobody is paged (their series are clean)."""
    group = [Member(instance_id=f"i-{n}", gpus=g) for n, g in enumerate(members)]
    gpus = sum(members)
    minutes = LOOKBACK // 60
    forged = forged_share * gpus * 60.0
    counts = [gpus * 60.0 + (forged / spread if m < spread else 0.0) for m in range(minutes)]
    sums = [gpus * 60.0 * util + (forged / spread * forged_value if m < spread else 0.0) for m in range(minutes)]
    values = [util, forged_value] if forged > 0 else [util]
    series = combine("group", {"SampleCount": counts, "Sum": sums, "Maximum": [max(values)], "Minimum": [min(values)]})
    verdict = check_group(series, group, LOOKBACK)
    if verdict is not None:
        assert verdict.utilization is not None
        jitter = minute_bound(gpus) / (gpus * 60) - 1  # the room in a published minute, as a share
        assert abs(verdict.utilization - util) <= jitter / (1 + jitter) * abs(forged_value - util) + 1e-6
    else:
        own = {m.instance_id: honest(m.instance_id, m.gpus or 0, util) for m in group}
        used = from_members(series, group, own, LOOKBACK)
        assert used.utilization == pytest.approx(util, abs=1e-6) and not used.tell


@settings(max_examples=examples(40), deadline=None)
@given(
    utils=st.lists(st.floats(min_value=0, max_value=100), min_size=2, max_size=6),
    spoiled=st.data(),
    forged=st.floats(min_value=1.03, max_value=50),
)
def test_no_member_can_be_left_out_by_a_forger(utils: list[float], spoiled: st.DataObject, forged: float) -> None:
    """Whichever members' own series a forger pushes over their bounds (in one minute), the group holds
    and is told: the members' mean is never taken from a subset the forger chose."""
    group = [Member(instance_id=f"i-{n}", gpus=4) for n in range(len(utils))]
    own = {m.instance_id: honest(m.instance_id, 4, u) for m, u in zip(group, utils, strict=True)}
    which = spoiled.draw(st.sets(st.sampled_from(sorted(own)), min_size=1))
    for iid in which:
        own[iid] = plus(own[iid], (forged - 1) * 4 * 60, 50.0)  # the minute holds `forged` times a window
    verdict = from_members(SeriesStats(name="g", samples=1e9), group, own, LOOKBACK)
    assert verdict.held is not None and verdict.utilization is None and verdict.tell and verdict.forged


@pytest.mark.parametrize(
    ("stat", "problem"),
    [
        ("Average", None),
        ("AVERAGE", None),  # SNS spells it in capitals
        (None, None),  # not said: not judged
        ("Maximum", "its statistic Maximum (on GPUMemoryUsedPercent) can be set by one datum any node may write"),
        ("Minimum", "its statistic Minimum"),
        ("p99", "its statistic p99"),
        ("TM(0:100)", "its statistic TM(0:100)"),
        ("SampleCount", "its statistic SampleCount"),
    ],
)
def test_an_alarm_acts_on_a_gpufleet_series_by_its_average_only(stat: str | None, problem: str | None) -> None:
    read = MetricRef(namespace="GPUFleet", name="GPUMemoryUsedPercent", dimensions=REF.metric_dimensions, stat=stat)
    got = statistic_problem([read])
    assert (got is None) if problem is None else (got is not None and problem in got and "use Average" in got)
    # Another namespace is not node-writable: its statistic is the alarm owner's business.
    assert statistic_problem([read.model_copy(update={"namespace": "AWS/SQS"})]) is None


@pytest.mark.parametrize(
    ("comparison", "value", "breached"),
    [
        ("GreaterThanThreshold", 50.0, False),
        ("GreaterThanThreshold", 50.1, True),
        ("GreaterThanOrEqualToThreshold", 50.0, True),
        ("LessThanThreshold", 49.9, True),
        ("LessThanOrEqualToThreshold", 50.1, False),
        ("LessThanLowerOrGreaterThanUpperThreshold", 99.0, None),  # an anomaly band: cannot be weighed
    ],
)
def test_alarm_condition(comparison: str, value: float, breached: bool | None) -> None:
    assert AlarmCondition(threshold=50, comparison=comparison).breached(value) is breached


ABOVE_50 = AlarmCondition(threshold=50, comparison="GreaterThanThreshold")
ON_MEMBERS = Verdict(utilization=95.0, source="2 of 2", dropped=("g: over",), note=MEMBER_LEFT)


@pytest.mark.parametrize(
    ("verdict", "condition", "action", "says"),
    [
        (Verdict(utilization=95.0), None, Action.SCALE_OUT, "r"),  # the group series was believed
        (Verdict(held="nope", source="none"), ABOVE_50, Action.HOLD, "but nope: held"),
        (ON_MEMBERS, ABOVE_50, Action.SCALE_OUT, "their mean 95.0% is GreaterThanThreshold 50"),
        (
            ON_MEMBERS.model_copy(update={"utilization": 5.0}),
            ABOVE_50,
            Action.HOLD,
            "their mean 5.0% is not GreaterThanThreshold 50: held",
        ),
        (ON_MEMBERS, None, Action.HOLD, "the next tick decides"),
    ],
)
def test_an_alarm_on_a_failing_group_series_weighs_the_members_mean(
    verdict: Verdict, condition: AlarmCondition | None, action: Action, says: str
) -> None:
    got = alarm_checked(_decision(Action.SCALE_OUT, TriggerKind.ALARM, "a"), verdict, condition)
    assert got.action is action and says in got.reason
    assert got.desired == (3 if action is Action.SCALE_OUT else 2)


def test_a_high_resolution_fleet_gets_twice_the_bound_when_the_policy_says_so() -> None:
    """`high_resolution: true` publishes each sample twice (60 s and 10 s datums): with the policy's
    `node_samples_per_gpu_s: 2` its honest series passes; at the default rate it reads as over the bound."""
    from gpufleet.scaling.metric_trust import Member, group_bound

    plain = [Member(instance_id="i-1", gpus=8), Member(instance_id="i-2", gpus=8)]
    doubled = [m.model_copy(update={"samples_per_gpu_s": 2.0}) for m in plain]
    assert group_bound(plain, 300) == 2 * 8 * 1.0 * 360
    assert group_bound(doubled, 300) == 2 * group_bound(plain, 300)


def test_a_fleet_with_five_minute_windows_says_so_and_passes_the_minute_bound() -> None:
    """`window_s: 300` puts a whole window's samples into one minute: the policy's `node_window_s: 300`
    makes the minute bound one window's samples; at the default it reads as over the bound."""
    from gpufleet.scaling.metric_trust import Member, group_minute_bound

    plain = [Member(instance_id="i-1", gpus=8)]
    five = [Member(instance_id="i-1", gpus=8, window_s=300)]
    assert group_minute_bound(five) == 5 * group_minute_bound(plain)
    assert group_minute_bound(plain) < 8 * 300 <= group_minute_bound(five)


def test_a_spot_reclaim_of_the_groups_largest_node_is_no_page() -> None:
    """Second probe: a mixed-instances group (max 3) loses its 8-GPU node and lists two 1-GPU ones; the
    series still holds the 8-GPU node's samples. The ceiling counts members at 8 GPUs: not paged."""
    members = [Member(instance_id="i-a", gpus=1), Member(instance_id="i-b", gpus=1)]
    own = {"i-a": honest("i-a", 1, 50.0), "i-b": honest("i-b", 1, 50.0)}
    group = honest("g", 10, 50.0)  # 8 + 1 + 1 GPUs' samples
    verdict = from_members(group, members, own, LOOKBACK, max_size=3)
    assert verdict.trusted and not verdict.tell


def test_an_in_band_hold_is_audited_every_tenth_minute() -> None:
    """Second probe: a flood that pulls the Average into the band held the group silently; the check
    only ran on ticks that would act. A band hold is now checked every SERIES_AUDIT_EVERY_MIN minutes."""
    from gpufleet.scaling.metric_trust import series_audited

    band_hold = _decision(Action.HOLD, TriggerKind.UTILIZATION_BAND)
    audited = [m for m in range(60) if series_audited(band_hold, m) is not None]
    assert audited == list(range(0, 60, defaults.SERIES_AUDIT_EVERY_MIN))
