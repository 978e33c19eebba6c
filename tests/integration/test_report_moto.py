"""`gpufleet report` end to end on moto server: usage records put into /gpufleet/usage with PutLogEvents,
read back with FilterLogEvents by the command itself (`main(["report", ...])`), in every format."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpufleet_node.schema import USAGE_LOG_GROUP
from gpufleet_tools.cli import main
from gpufleet_tools.report.reader import read_usage
from gpufleet_tools.report.usage import Period, Selection
from tests.unit.test_report_records import ALICE_JOB, TRAINER, message

pytestmark = pytest.mark.integration

# moto, like CloudWatch Logs, refuses events older than 14 days: the records are from the last few days.
DAY0 = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)
DAYS = 2
NOTEBOOK = {"kind": "pod", "namespace": "team-b", "pod": "notebook-7", "container": "lab"}
RANKER = {"kind": "pod", "namespace": "team-b", "pod": "ranker-0", "container": "serve"}


def _node_a(at: datetime) -> str:  # the example: a pod with an idle GPU, a Slurm job, one GPU free
    return message(start=at, node="i-a", workloads={"0": TRAINER, "1": ALICE_JOB})


def _node_b(at: datetime) -> str:  # 8 x A100: a notebook sitting on a GPU, 6 busy, one free
    rows = [[0, "0", 300, 0, 300, 2048], *([g, "1", 300, 240, 0, 60000] for g in range(1, 7))]
    rows.append([7, None, 300, 0, 300, 0])
    return message(start=at, node="i-b", instance_type="p4d.24xlarge", group="asg:train", gpus=8,
                   workloads={"0": NOTEBOOK, "1": RANKER}, rows=rows)  # fmt: skip


def _node_c(at: datetime) -> str:  # a type without a price, and a kubelet it cannot read
    gone = {"allocations": "kubelet socket not found"}
    return message(start=at, node="i-c", instance_type="x9.huge", group="asg:train", gpus=1, workloads={},
                   rows=[[0, None, 300, 150, 0, 0]], gone=gone)  # fmt: skip


def put_records(logs: Any, by_node: dict[str, list[tuple[datetime, str]]]) -> None:
    logs.create_log_group(logGroupName=USAGE_LOG_GROUP)
    for node, records in by_node.items():
        logs.create_log_stream(logGroupName=USAGE_LOG_GROUP, logStreamName=node)
        events = sorted(({"timestamp": int(at.timestamp() * 1000), "message": m} for at, m in records), key=_ts)
        for i in range(0, len(events), 1000):
            logs.put_log_events(logGroupName=USAGE_LOG_GROUP, logStreamName=node, logEvents=events[i : i + 1000])


def _ts(event: dict[str, Any]) -> int:
    return int(event["timestamp"])


@pytest.fixture
def seeded(aws: str) -> str:
    windows = [DAY0 + timedelta(minutes=5 * i) for i in range(DAYS * 288)]
    by_node = {name: [(at, build(at)) for at in windows] for name, build in (("i-a", _node_a), ("i-b", _node_b))}
    by_node["i-c"] = [(at, _node_c(at)) for at in windows]
    by_node["i-c"].append((windows[5], "this is not a usage record"))
    put_records(boto3.client("logs"), by_node)
    return aws


def report(endpoint: str, *args: str) -> list[str]:
    period = ["--start", DAY0.isoformat(), "--end", (DAY0 + timedelta(days=DAYS)).isoformat()]
    return ["report", "--endpoint", endpoint, "--no-progress", *period, *args]


def test_the_table(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(report(seeded)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1] == "1,728 usage records from 3 nodes; 1 skipped (1 not JSON)"
    assert lines[2].startswith("GPU-hours seen 624.0: allocated 480.0")  # 48 h x (4 + 8 + 1) GPUs
    for expected in (
        "pod team-b/notebook-7 (lab) held 1 GPU idle 100 %: $131.75",  # 48 h x 21.957642 / 8
        "pod team-a/trainer-0 (main) requested 2 GPUs, one idle 99 % of its life: $67.38",
        "allocations unknown on 1 node: kubelet socket not found; 48.0 GPU-h in 576 records not surely attributed "
        "(its instance type has no price)",
        "group asg:train: 2.0 GPUs unallocated on average over the period, 22 % of its GPU-hours "
        "(+ 48.0 GPU-h without a price): $131.75",
        "no price for x9.huge (1 node, 48.0 GPU-h): cost unknown; set spot.prices.on_demand.x9.huge",
    ):
        assert any(expected in line for line in lines), expected
    assert any(line.startswith("team-b ") for line in lines) and "Slurm job 4242 (alice)" in out


def test_csv_json_markdown_and_the_png(seeded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_csv, out_md, png = tmp_path / "r.csv", tmp_path / "r.md", tmp_path / "r.png"
    assert main(report(seeded, "--format", "csv", "--out", str(out_csv), "--png", str(png))) == 0
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert {r["name"] for r in rows if r["section"] == "team"} == {"team-a", "team-b", "alice"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"report: {out_csv} (csv, 1,728 records)" in capsys.readouterr().out

    assert main(report(seeded, "--format", "json", "--share-unallocated")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["records"] == 1728 and doc["skipped"] == {"not JSON": 1}
    assert doc["total"]["gpu_hours_held"] == pytest.approx(624.0)
    shared = sum(t["shared_unallocated_usd"] for t in doc["teams"])
    assert shared == pytest.approx(doc["unallocated"]["shared_out_usd"]) and shared > 0

    assert main(report(seeded, "--format", "markdown", "--out", str(out_md))) == 0
    assert "| team | workloads |" in out_md.read_text()


def test_groups_and_clusters_narrow_the_report(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(report(seeded, "--group", "asg:train", "--format", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] == 2 and {g["group"] for g in doc["groups"]} == {"asg:train"}
    assert main(report(seeded, "--cluster", "prod", "--format", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] == 1 and {t["team"] for t in doc["teams"]} == {"team-a", "alice"}


def test_no_log_group_is_one_line_and_exit_1(aws: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--endpoint", aws, "--since", "1d", "--no-progress"]) == 1
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("error: no log group /gpufleet/usage: usage attribution is off") and not captured.out


def test_more_than_a_page_is_read_with_next_tokens(aws: str) -> None:
    """10,500 records in one hour: FilterLogEvents answers 10,000 events a page."""
    hour = DAY0 + timedelta(hours=1)
    records = [(hour + timedelta(milliseconds=k), message(start=hour, node=f"i-{k:05d}")) for k in range(10_500)]
    put_records(boto3.client("logs"), {"i-many": records})
    got: list[str] = []
    period = Period(hour, hour + timedelta(hours=1))
    stats = read_usage(boto3.client("logs"), period, Selection(), got.append, workers=1)
    assert (stats.events, stats.calls, stats.slices) == (10_500, 2, 1) and len(got) == 10_500
