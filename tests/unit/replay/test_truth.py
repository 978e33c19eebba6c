"""The replay tells the truth: pods no node can hold are counted and shown, a baseline that cannot start
at the given bounds is marked and not compared. The plot's pending panel and `gpufleet replay`'s output:
tests/adapters/replay/test_truth_outputs.py."""

from __future__ import annotations

import json
import random
from functools import cache

import pytest

from gpufleet_tools.replay.baselines import oracle
from gpufleet_tools.replay.model import Pod, ReplayOptions, RunName, RunOutcome, RunResult, Timeline, Trace
from gpufleet_tools.replay.policy import Workload, recommended_policy
from gpufleet_tools.replay.report import (
    STALL_MINUTES,
    Comparison,
    compare,
    goals,
    report_json,
    report_md,
    stalled_for,
    table,
)
from gpufleet_tools.replay.traces import bursty_trace, fitting


def _compare(trace: Trace, **options: object) -> Comparison:
    return compare(trace, recommended_policy(Workload.BATCH), ReplayOptions(**options), random.Random(13))


def test_pods_bigger_than_a_node_are_counted_shown_and_left_out_of_every_run() -> None:
    trace = bursty_trace(random.Random(13), days=1)
    too_big = [p for p in trace.pods if p.gpus > 1]
    assert too_big  # the bursty trace has 2-, 4- and 8-GPU jobs
    c = _compare(trace, gpus_per_node=1)
    assert c.never_fit.pods == len(too_big) and c.pods + len(too_big) == len(trace.pods)
    doc = report_json(c)
    assert doc["never_fit"] == {"gpus_per_node": 1, "pods": len(too_big), "gpu_hours": c.never_fit.gpu_hours}
    assert c.never_fit.gpu_hours > 0
    assert f"\n{len(too_big):,} pods never fit a node of 1 GPU (" in report_md(c)
    # the oracle serves only what fits: its GPU-hours are the demand of the pods a node holds, nothing more
    fit = [p for p in trace.pods if p.gpus == 1]
    served = oracle(fit, trace.horizon, ReplayOptions(gpus_per_node=1)).result.gpu_hours_used
    assert c.result(RunName.ORACLE).gpu_hours_used == served == pytest.approx(sum(c.demand_gpus) / 60, abs=0.01)


def test_every_pod_fits_says_nothing() -> None:
    c = _compare(bursty_trace(random.Random(13), days=1))
    assert c.never_fit.pods == 0 and "never fit" not in report_md(c)


def test_fitting_counts_what_the_big_pods_would_have_run_within_the_trace() -> None:
    pods = [
        Pod(name="fits", arrival=0, duration=30, gpus=4),
        Pod(name="big", arrival=0, duration=30, gpus=5),
        Pod(name="forever", arrival=40, duration=None, gpus=8),  # runs to the end: 20 minutes of 8 GPUs
        Pod(name="past-end", arrival=50, duration=600, gpus=6),  # 10 minutes left in the trace
    ]
    fit, never = fitting(pods, 60, 4)
    assert [p.name for p in fit] == ["fits"]
    assert never.pods == 3 and never.gpu_hours == round((5 * 30 + 8 * 20 + 6 * 10) / 60, 2)


def test_the_oracle_does_not_count_a_pod_bigger_than_a_node_as_demand() -> None:
    options = ReplayOptions(gpus_per_node=4, boot_minutes=0, min_nodes=0)
    out = oracle([Pod(name="big", arrival=0, duration=60, gpus=5)], 60, options)
    assert out.result.gpu_hours_used == 0 and out.result.node_hours == 0


@cache
def _late_comparison(min_nodes: int) -> Comparison:
    """The late trace compared at `min_nodes` (once: tests read it, none changes it)."""
    return _compare(_late_trace(), min_nodes=min_nodes)


def _late_trace() -> Trace:
    """Nothing runs at minute 0, so at min 0 the fleet starts empty."""
    trace = bursty_trace(random.Random(13), days=1)
    late = tuple(
        p.model_copy(update={"arrival": min(p.arrival + 30, trace.horizon - 1)})
        for p in trace.pods
        if p.duration is not None
    )
    return trace.model_copy(update={"pods": late})


def test_target_tracking_at_min_zero_cannot_start_and_is_marked_not_ranked() -> None:
    c = _late_comparison(0)
    assert c.initial_nodes == 0
    tt = c.result(RunName.ASG_TARGET_TRACKING)
    assert tt.node_hours == 0  # served nothing: the cheapest row, which is why it must not be ranked
    assert tt.not_ranked == "cannot start at min 0: no metric without capacity"
    ranked = {r.result.name for r in c.runs if not r.result.not_ranked}
    assert ranked == {str(n) for n in RunName} - {RunName.ASG_TARGET_TRACKING}
    runs = {r["name"]: r for r in json.loads(json.dumps(report_json(c)))["runs"]}
    assert runs["asg-target-tracking"]["not_ranked"] == tt.not_ranked and runs["gpufleet"]["not_ranked"] is None
    row = next(line for line in report_md(c).splitlines() if line.startswith("| asg-target-tracking"))
    assert "(not ranked: cannot start at min 0: no metric without capacity) |" in row and "| not ranked |" in row
    assert all("target" not in g.goal and g.met is not None for g in goals(c))


def test_at_min_one_target_tracking_is_ranked() -> None:
    c = _late_comparison(1)
    assert all(r.result.not_ranked is None for r in c.runs)


def test_a_goal_against_a_run_that_could_not_start_is_not_compared() -> None:
    c = _late_comparison(0)
    runs = tuple(
        r.model_copy(update={"result": r.result.model_copy(update={"not_ranked": "cannot start at min 0: x"})})
        if r.result.name == RunName.CLUSTER_AUTOSCALER
        else r
        for r in c.runs
    )
    found = {g.goal: g for g in goals(c.model_copy(update={"runs": runs}))}
    waited = found["pending_gpu_minutes <= cluster-autoscaler"]
    assert waited.met is None and waited.verdict == "not compared"
    assert waited.detail == "cluster-autoscaler not ranked: cannot start at min 0: x"
    assert found["pods_disrupted = 0"].met is not None  # gpufleet alone: still checked


def _timeline(nodes: list[int], pending: list[float]) -> Timeline:
    return Timeline(nodes=tuple(nodes), used_gpus=(0.0,) * len(nodes), pending_gpus=tuple(pending))


@pytest.mark.parametrize(
    ("nodes", "pending", "stalled"),
    [
        ([0] * 5, [0.0] * 5, 0),  # nothing waited: an idle group at min 0 is fine
        ([0] * 5, [0.0, 0.0, 2.0, 2.0, 2.0], 3),  # never launched while pods waited
        ([1, 1, 0, 0, 0], [0.0, 0.0, 0.0, 1.0, 1.0], 2),  # emptied, then pods came and it never restarted
        ([0, 0, 1, 1, 1], [3.0, 3.0, 3.0, 0.0, 0.0], 0),  # started late but started
        ([0, 1, 0, 1, 0], [1.0, 1.0, 1.0, 1.0, 0.0], 0),  # nothing waits after its last node
    ],
)
def test_stalled_minutes_are_the_end_spent_at_zero_nodes_while_pods_wait(
    nodes: list[int], pending: list[float], stalled: int
) -> None:
    assert stalled_for(_timeline(nodes, pending)) == stalled


def _outcome(name: str, pending: list[float], not_ranked: str | None = None) -> RunOutcome:
    result = RunResult(
        name=name,
        node_hours=0,
        gpu_hours_provisioned=0,
        gpu_hours_used=0,
        pending_gpu_minutes=sum(pending),
        pods_disrupted=0,
        lost_gpu_hours=0,
        scaling_actions=0,
        cost_usd=0,
        not_ranked=not_ranked,
    )
    return RunOutcome(result=result, timeline=_timeline([1] * len(pending), pending))


def test_the_table_has_drained_and_undrained_columns() -> None:
    r = _outcome("gpufleet", [0.0]).result.model_copy(update={"nodes_drained": 7, "nodes_undrained": 2})
    head, _, row = table([r], 1.0)
    cells = [c.strip() for c in head.split("|")]
    values = [c.strip() for c in row.split("|")]
    assert values[cells.index("drained")] == "7" and values[cells.index("undrained")] == "2"
    assert STALL_MINUTES >= 30  # a controller that answers waiting work launches well within it
