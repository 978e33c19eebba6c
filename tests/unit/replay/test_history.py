"""What gpufleet would have done on a group's history: scale-outs, idle nodes reclaimed, busy refusals."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.domain.models import GroupRef
from gpufleet.policy.fleet import parse_policy
from gpufleet_tools.replay.core import group_settings
from gpufleet_tools.replay.history import History, InstanceSeries, history_md, replay_history, unreplayable

SETTINGS = group_settings(
    parse_policy("defaults: {target: {low: 50, high: 80}, scale_in_step: 1, scale_in_cooldown_s: 600}")
)
START = datetime(2026, 11, 1, tzinfo=UTC)


def _history() -> History:
    """3 nodes for 2 hours: i-a busy all along, i-b idle from minute 30, i-c busy until the group removes
    it (busy) at minute 60; the group's utilization is what the instances say."""
    minutes = 120
    a = InstanceSeries(instance_id="i-a", utilization=(90.0,) * minutes, memory=(60.0,) * minutes)
    b = InstanceSeries(
        instance_id="i-b",
        utilization=(60.0,) * 30 + (0.0,) * 90,
        memory=(50.0,) * 30 + (1.0,) * 90,
    )
    c = InstanceSeries(instance_id="i-c", utilization=(70.0,) * 60 + (None,) * 60, memory=(40.0,) * 60 + (None,) * 60)
    util = tuple((90 + 60 + 70) / 3 if t < 30 else (90 + 70) / 3 if t < 60 else 90 / 2 for t in range(minutes))
    return History(
        group=GroupRef.parse_key("asg:train"),
        start=START,
        gpu_utilization=util,
        in_service=(3,) * 60 + (2,) * 60,
        instances=(a, b, c),
        min_size=1,
        max_size=10,
    )


def test_history_counts_what_the_group_did_and_what_gpufleet_would_have() -> None:
    r = replay_history(_history(), SETTINGS, lookback=5, gpus_per_node=8, boot=5)
    assert r.actual_node_hours == round((3 * 60 + 2 * 60) / 60, 2) and r.actual_changes == 1
    assert r.busy_nodes_removed_by_group == 1  # i-c stopped reporting while busy
    assert r.idle_node_hours > 0 and 0 < r.idle_node_hours_reclaimed <= r.idle_node_hours
    assert r.gpufleet_scale_ins >= 1 and r.gpufleet_node_hours < 3 * 2  # less than keeping all three
    md = history_md(r)
    assert "asg:train" in md and "idle node-hours" in md


def test_every_node_busy_and_low_utilization_is_a_refusal() -> None:
    minutes = 30
    busy = tuple(
        InstanceSeries(instance_id=f"i-{k}", utilization=(20.0,) * minutes, memory=(30.0,) * minutes) for k in range(4)
    )
    h = History(
        group=GroupRef.parse_key("asg:x"),
        start=START,
        gpu_utilization=(20.0,) * minutes,
        in_service=(4,) * minutes,
        instances=busy,
    )
    r = replay_history(h, SETTINGS, lookback=5, gpus_per_node=8, boot=5)
    assert r.busy_refusals == minutes and r.busy_nodes_removed_by_group == 0 and r.idle_node_hours == 0


def test_a_history_without_the_work_or_the_size_is_unreplayable() -> None:
    """Every number would be 0: the service refuses it instead of printing a table of zeros."""
    empty = History(group=GroupRef.parse_key("asg:x"), start=START, gpu_utilization=(None,) * 5, in_service=(None,) * 5)
    assert unreplayable(empty) == ["GPU utilization", "size"]
    sized = empty.model_copy(update={"in_service": (2,) * 5})
    assert unreplayable(sized) == ["GPU utilization"]
    assert unreplayable(_history()) == []


def test_what_the_window_lacked_is_in_the_report() -> None:
    missing = ("no per-instance GPUFleet GPUUtilization or GPUMemoryUsedPercent datapoints: idle node-hours ...",)
    h = _history().model_copy(update={"missing": missing})
    r = replay_history(h, SETTINGS, lookback=5, gpus_per_node=8, boot=5)
    assert r.missing == missing
    md = history_md(r)
    assert md.endswith(f"Missing in the window (the numbers that need it are 0 for want of data):\n\n- {missing[0]}\n")
    assert "Missing in the window" not in history_md(replay_history(_history(), SETTINGS, 5, 8, 5))
