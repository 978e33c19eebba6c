"""OOM forecasts and GPU health rules on synthetic series: tables and hypothesis properties."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.guard.core import (
    GpuRef,
    HealthCounts,
    HealthSettings,
    MemorySeries,
    OomSettings,
    Risk,
    choose_replacements,
    forecast_gpu,
    group_pressure,
    health_findings,
    rising,
)
from tests.profiles import examples

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
GPU = GpuRef(group="asg:train", instance_id="i-1", gpu_index=0)
TOTAL = 81920.0  # 80 GiB
S = OomSettings()


def series(values: list[float | None], total: float = TOTAL) -> MemorySeries:
    """One value per minute ending at NOW; None = a gap (no data that minute)."""
    n = len(values)
    points = tuple((NOW - timedelta(minutes=n - 1 - i), v) for i, v in enumerate(values) if v is not None)
    return MemorySeries(gpu=GPU, points=points, total_mib=total, top_process_mib=values[-1] if values[-1] else None)


def pct(p: float) -> float:
    return TOTAL * p / 100


def test_flat_high_usage_below_the_threshold_is_not_flagged() -> None:
    rng = random.Random(1)
    f = forecast_gpu(series([pct(88 + rng.uniform(-0.7, 0.7)) for _ in range(15)]), NOW, S)
    assert f.risk is Risk.OK, f.reason


@pytest.mark.parametrize(("rate", "start"), [(0.5, 60.0), (1.0, 70.0), (2.0, 50.0), (0.3, 75.0)])
def test_a_steady_leak_is_flagged_before_full_with_an_accurate_forecast(rate: float, start: float) -> None:
    """rate: percent of memory per minute. Walk forward minute by minute until the guard fires."""
    rng = random.Random(int(rate * 10))
    history: list[float | None] = []
    minute = 0
    while True:
        used = start + rate * minute
        history.append(pct(min(100.0, used + rng.uniform(-0.2, 0.2))))
        f = forecast_gpu(series(history[-15:]), NOW, S)
        if f.risk is not Risk.OK:
            break
        minute += 1
    assert used < 100
    truth = (100 - used) / rate
    assert f.minutes_to_full is not None or f.used_percent >= S.warning_percent
    if f.minutes_to_full is not None:
        assert abs(f.minutes_to_full - truth) <= 0.10 * truth + 0.5, (f.minutes_to_full, truth)
    # ... and CRITICAL comes before 100 % too.
    while f.risk is not Risk.CRITICAL:
        minute += 1
        used = start + rate * minute
        history.append(pct(min(100.0, used)))
        f = forecast_gpu(series(history[-15:]), NOW, S)
    assert used < 100


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("noise around 70%", [pct(70 + random.Random(i).uniform(-3, 3)) for i in range(15)]),
        ("gaps", [pct(60), None, None, pct(61), None, pct(60), None, None, pct(60.5), None, None, None, pct(60)]),
        ("insufficient data", []),
        ("too few points", [pct(80), pct(85)]),
        # A process exits (counter reset) and a new one starts: the trend restarts after the drop.
        ("reset", [pct(80 + i) for i in range(8)] + [pct(20), pct(20.2), pct(20.1), pct(20.3), pct(20.2)]),
        # A job loads its model (a step up), then stays flat: a jump, not a trend.
        ("model load", [pct(2)] * 6 + [pct(80), pct(80.1), pct(80), pct(80.2), pct(80.1)]),
        ("model load, just now", [pct(2)] * 10 + [pct(85), pct(85.1)]),
    ],
)
def test_no_false_alarms(name: str, values: list[float | None]) -> None:
    s = series(values) if values else MemorySeries(gpu=GPU, points=(), total_mib=TOTAL)
    assert forecast_gpu(s, NOW, S).risk is Risk.OK, name


@pytest.mark.parametrize(
    ("used", "risk"), [(89.9, Risk.OK), (90.01, Risk.WARNING), (96.9, Risk.WARNING), (97.01, Risk.CRITICAL)]
)
def test_level_thresholds_on_a_flat_series(used: float, risk: Risk) -> None:
    assert forecast_gpu(series([pct(used)] * 10), NOW, S).risk is risk


@settings(max_examples=examples(200), deadline=None)
@given(
    start=st.floats(min_value=1, max_value=89.9),
    drops=st.lists(st.floats(min_value=0, max_value=3), min_size=3, max_size=30),
)
def test_a_non_increasing_series_below_warning_never_fires(start: float, drops: list[float]) -> None:
    values, v = [], start
    for d in drops:
        v = max(0.0, v - d)
        values.append(pct(v))
    assert forecast_gpu(series([pct(start), *values]), NOW, S).risk is Risk.OK


@settings(deadline=None)
@given(
    level=st.floats(min_value=1, max_value=88.4),
    noise=st.floats(min_value=0, max_value=1.5),
    seed=st.integers(0, 10**6),
)
def test_flat_noisy_series_below_warning_never_fires(level: float, noise: float, seed: int) -> None:
    rng = random.Random(seed)
    values = [pct(max(0.0, level + rng.uniform(-noise, noise))) for _ in range(15)]
    assert forecast_gpu(series(values), NOW, S).risk is Risk.OK


def test_health_findings_name_what_is_wrong() -> None:
    counts = [
        HealthCounts(gpu=GPU, xid_errors=1, lost=3),
        HealthCounts(gpu=GpuRef(group="asg:train", instance_id="i-2", gpu_index=1), ecc_double_bit=2),
        HealthCounts(gpu=GpuRef(group="asg:train", instance_id="i-3", gpu_index=0)),
    ]
    findings = health_findings(counts, HealthSettings())
    assert [f.gpu.instance_id for f in findings] == ["i-1", "i-2"]
    assert findings[0].problems == ("GPU lost (fell off the bus)", "1 critical XID error(s)")
    assert findings[1].problems == ("2 uncorrectable ECC error(s)",)


def finding(iid: str, group: str = "asg:train"):  # type: ignore[no-untyped-def]
    return health_findings(
        [HealthCounts(gpu=GpuRef(group=group, instance_id=iid, gpu_index=0), lost=1)], HealthSettings()
    )[0]


@pytest.mark.parametrize(
    ("n_bad", "serving", "group_min", "recent", "per_hour", "acted"),
    [
        (1, 4, 1, 0, 1, 1),  # one replacement allowed
        (2, 4, 1, 0, 1, 1),  # budget: one per hour
        (1, 4, 1, 1, 1, 0),  # budget already used this hour
        (1, 2, 2, 0, 1, 0),  # would go below the group's min
        (1, 4, 0, 0, 3, 1),  # 75 % of 4 = 3 must stay healthy: one may go
        (2, 4, 0, 0, 3, 1),  # ... but not two
    ],
)
def test_replacements_stay_within_the_blast_radius(
    n_bad: int, serving: int, group_min: int, recent: int, per_hour: int, acted: int
) -> None:
    s = HealthSettings(replace_unhealthy=True, max_replacements_per_hour=per_hour, min_healthy_percent=75)
    choices = choose_replacements(
        [finding(f"i-{i}") for i in range(n_bad)],
        {"asg:train": serving},
        {"asg:train": group_min},
        {"asg:train": [NOW - timedelta(minutes=10)] * recent},
        NOW,
        s,
    )
    assert sum(c.act for c in choices) == acted
    assert all(c.reason for c in choices)


def test_replacement_is_off_unless_the_policy_turns_it_on() -> None:
    [c] = choose_replacements([finding("i-1")], {"asg:train": 4}, {"asg:train": 1}, {}, NOW, HealthSettings())
    assert not c.act and "off" in c.reason


def test_group_pressure_needs_the_configured_share_of_instances() -> None:
    at_risk = forecast_gpu(series([pct(95)] * 10), NOW, S)
    same_node = at_risk.model_copy(update={"gpu": at_risk.gpu.model_copy(update={"gpu_index": 1})})
    s = OomSettings(scale_out_on_pressure=True, pressure_share=0.5)
    assert group_pressure([at_risk, same_node], {"asg:train": 2}, s) == {
        "asg:train": "memory pressure: 1 of 2 instances have a GPU at risk of running out of memory"
    }
    assert group_pressure([at_risk, same_node], {"asg:train": 3}, s) == {}  # two GPUs, one instance of three


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([50.0 + 0.3 * i for i in range(10)], True),  # one leaking GPU of four lifts the average steadily
        ([60.0] * 10, False),  # flat
        ([60.0, 61.0] * 5, False),  # noise: no consistent rise
        ([60.0 + 0.01 * i for i in range(10)], False),  # below the minimum rise
        ([60.0, 61.0, 62.0], False),  # too few points
    ],
)
def test_a_steadily_rising_average_is_flagged(values: list[float], expected: bool) -> None:
    points = [(NOW + timedelta(minutes=i), v) for i, v in enumerate(values)]
    assert rising(points, 5) is expected


@pytest.mark.parametrize(
    ("instances", "expected"),
    [
        (1, False),  # one 8-GPU node: 0.019 %/min of average is noise-level for one node
        (10, True),  # ten nodes: the same rise is one GPU leaking 1.5 %/min below the group's fullest
        (100, True),
    ],
)
def test_a_group_average_is_judged_against_its_size(instances: int, expected: bool) -> None:
    """One GPU of 80 (10 nodes x 8) leaking 1.5 %/min lifts the group's average by ~0.019 %/min: below the
    per-node bar, so the bar is lowered by the group's size or the leak hides until it is the fullest."""
    points = [(NOW + timedelta(minutes=i), 60.0 + 1.5 / 80 * i) for i in range(15)]
    assert rising(points, 5, instances) is expected
