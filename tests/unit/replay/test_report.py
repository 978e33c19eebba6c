"""report.json's promised shape, the goals, and the whole comparison on a small v2023 file."""

from __future__ import annotations

import io
import random

from gpufleet_tools.replay.model import ReplayOptions, RunName
from gpufleet_tools.replay.policy import Workload, derived_max, recommended_policy, workload_of
from gpufleet_tools.replay.report import compare, goals, report_json, report_md
from gpufleet_tools.replay.traces import bursty_trace, parse_trace

KEYS = {
    "name",
    "node_hours",
    "gpu_hours_provisioned",
    "gpu_hours_used",
    "pending_gpu_minutes",
    "pods_disrupted",
    "lost_gpu_hours",
    "scaling_actions",
    "cost_usd",
    "nodes_drained",
    "nodes_undrained",
    "not_ranked",
    "gang_partial_node_minutes",
    "gangs_started",
    "gang_wait_minutes",
}


def test_report_json_has_the_five_runs_with_exactly_the_promised_keys(v2023_csv: str) -> None:
    trace = parse_trace(io.StringIO(v2023_csv), "pods.csv")
    c = compare(trace, recommended_policy(workload_of(trace.format)), ReplayOptions(), random.Random(13))
    doc = report_json(c)
    assert [r["name"] for r in doc["runs"]] == [str(n) for n in RunName]
    assert all(set(r) == KEYS for r in doc["runs"])
    md = report_md(c)
    assert md.count("\n| gpufleet |") == 1 and "| oracle |" in md and "cost USD" in md


def test_goals_on_a_bursty_week_and_the_cost_is_node_hours_times_price() -> None:
    trace = bursty_trace(random.Random(13), days=2)
    options = ReplayOptions(node_price=10.0)
    seen: list[int] = []
    c = compare(trace, recommended_policy(Workload.BATCH), options, random.Random(13), progress=seen.append)
    assert sum(seen) == trace.horizon * 4  # the progress bar covers every simulated run
    for outcome in c.runs:
        r = outcome.result
        assert abs(r.cost_usd - r.node_hours * 10.0) < 0.05
        assert (
            r.gpu_hours_provisioned == round(r.node_hours * 8, 2)
            or abs(r.gpu_hours_provisioned - r.node_hours * 8) < 0.1
        )
    assert c.result(RunName.ORACLE).node_hours <= min(r.result.node_hours for r in c.runs)
    found = {g.goal: g for g in goals(c)}
    assert found["pods_disrupted = 0"].met
    assert found["cost < static-peak"].met


def test_the_group_max_is_given_or_room_for_half_again_the_peak() -> None:
    assert derived_max(10, 1, None) == 15
    assert derived_max(10, 1, 12) == 12
    assert (
        workload_of(
            parse_trace(
                io.StringIO("instance_sn,role,gpu_request,creation_time,scheduled_time,deletion_time\n"), "x"
            ).format
        )
        is Workload.SERVING
    )
