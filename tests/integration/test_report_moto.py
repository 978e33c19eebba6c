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
from gpufleet_tools.report.model import Period, Selection
from gpufleet_tools.report.reader import read_usage
from rehearsal.calls import ACCOUNT, REGION
from tests.iam.evaluator import evaluate
from tests.iam.test_node_policy import FORGER
from tests.iam.test_node_policy import node_policy as node_policy  # a fixture, for the IAM premise
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


def put_records(logs: Any, by_node: dict[str, list[tuple[datetime, str]]], create: bool = True) -> None:
    """Each node's records into its stream (`create`: the log group and the streams first)."""
    if create:
        logs.create_log_group(logGroupName=USAGE_LOG_GROUP)
    for node, records in by_node.items():
        if create:
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
    got: list[tuple[str, int, str]] = []
    period = Period(hour, hour + timedelta(hours=1))
    stats = read_usage(boto3.client("logs"), period, Selection(), lambda *e: got.append(e), workers=1)
    assert (stats.events, stats.calls, stats.slices) == (10_500, 2, 1) and len(got) == 10_500
    assert {stream for stream, _, _ in got} == {"i-many"}


# ---- issue 29: one node's records must not set the bill ----

FINANCE = {"kind": "pod", "namespace": "finance", "pod": "ledger-0", "container": "main"}
P5_GPU_HOUR = 55.04 / 8


def _p5(node: str, at: datetime, workload: dict[str, str], rows: list[list[Any]] | None = None) -> str:
    rows = rows if rows is not None else [[g, "0", 300, 240, 0, 1000] for g in range(8)]
    return message(start=at, node=node, instance_type="p5.48xlarge", group="asg:train", gpus=8,
                   workloads={"0": workload}, rows=rows)  # fmt: skip


def test_a_node_may_write_any_stream_of_the_usage_group(node_policy: list[dict[str, Any]]) -> None:
    """The premise, on the deployed NodePublisherPolicy: IAM cannot tie a stream to its writer (a stream
    name may not hold the ':' of `${aws:userid}`, "ROLEID:i-..."), so the report checks the records."""
    victim = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{USAGE_LOG_GROUP}:log-stream:i-a"
    assert evaluate(node_policy, "logs:PutLogEvents", victim, FORGER).allowed


def test_a_forging_node_is_flagged_in_the_report_not_billed(aws: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Two p5.48xlarge nodes, 6 hours each: 96 GPU-h. Node i-f then writes 10,000 GPU-h for `finance`:
    under i-a's id in its own stream, into i-a's stream over three of i-a's windows (before i-a wrote
    them: CloudWatch Logs takes events up to 2 h ahead, so they are read first), and one record holding a
    GPU for 9,994 hours. The report at HEAD billed finance 10,000 GPU-h, $68,800; with the first-read rule
    it billed finance those three windows. Now they are a conflict: neither record counts (94 GPU-h)."""
    windows = [DAY0 + timedelta(minutes=5 * i) for i in range(72)]
    team = {"kind": "pod", "namespace": "ml", "pod": "train-0", "container": "main"}
    by_node = {node: [(at, _p5(node, at, team)) for at in windows] for node in ("i-a", "i-f")}
    by_node["i-f"] += [(at, _p5("i-a", at, FINANCE)) for at in windows[:6]]  # another node's id: 4 GPU-h
    by_node["i-f"].append((windows[7], _p5("i-f", windows[7], FINANCE, [[0, "0", 9994 * 3600.0, 0, 0, 0]])))
    logs = boto3.client("logs")
    put_records(logs, {"i-a": [(at, _p5("i-a", at, FINANCE)) for at in windows[10:13]]})  # i-a's own: 2 GPU-h
    logs.create_log_stream(logGroupName=USAGE_LOG_GROUP, logStreamName="i-f")
    put_records(logs, by_node, create=False)
    period = ["--start", DAY0.isoformat(), "--end", (DAY0 + timedelta(hours=6)).isoformat()]
    assert main(["report", "--endpoint", aws, "--no-progress", "--format", "json", *period]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"]["gpu_hours_held"] == pytest.approx(96.0 - 2.0)
    assert doc["total"]["cost_usd"] == pytest.approx(94 * P5_GPU_HOUR)
    assert {t["team"] for t in doc["teams"]} == {"ml"} and doc["records"] == 141
    flagged = {(f["kind"], f["stream"], f["node"]): f for f in doc["flagged"]}
    assert set(flagged) == {("stream", "i-f", "i-a"), ("held", "i-f", "i-f"), ("conflict", "i-a", "i-a")}
    assert sum(f["claimed_gpu_hours"] for f in flagged.values()) == pytest.approx(10_000.0 + 2.0)
    assert [flagged[k]["teams"] for k in sorted(flagged)] == [["finance", "ml"], ["finance"], ["finance"]]
    assert [flagged[k]["records"] for k in sorted(flagged)] == [6, 1, 6]  # conflict, held, stream
    assert "neither counted" in flagged[("conflict", "i-a", "i-a")]["detail"]


# ---- issue 41 (part 3): who pays, invented node ids, names that are not text ----

ALICE_JOB_NLP = {"kind": "slurm", "job_id": "4242", "user": "alice", "account": "nlp", "partition": "gpu"}
MALLORY_JOB = {**ALICE_JOB_NLP, "user": "mallory", "account": "finance"}


def _idle_job(at: datetime, job: dict[str, str], node: str = "i-s") -> str:
    """4 GPUs held by the job and idle: what the node writes is predictable, window after window."""
    return message(start=at, node=node, group="hyperpod:ml/gpu-a", workloads={"0": job},
                   rows=[[g, "0", 300, 0, 300, 0] for g in range(4)])  # fmt: skip


def _json(endpoint: str, capsys: pytest.CaptureFixture[str], start: datetime, end: datetime, *args: str) -> Any:
    period = ["--start", start.isoformat(), "--end", end.isoformat()]
    assert main(["report", "--endpoint", endpoint, "--no-progress", "--format", "json", *period, *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_prewritten_window_with_another_payer_moves_nothing(aws: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The forger writes node i-s's next 4 hours into i-s's stream first, Slurm job 4242 as mallory
    (account finance); the node then writes its own (alice, nlp). Before: the node's records were dropped
    as resends, 16.0 GPU-h billed to mallory (--by team), to finance (--by account). Now: 96 records in
    conflict, nobody billed."""
    windows = [DAY0 + timedelta(minutes=5 * i) for i in range(48)]
    logs = boto3.client("logs")
    put_records(logs, {"i-s": [(at, _idle_job(at, MALLORY_JOB)) for at in windows]})
    put_records(logs, {"i-s": [(at, _idle_job(at, ALICE_JOB_NLP)) for at in windows]}, create=False)
    for by, forged in (("team", "mallory"), ("account", "finance")):
        doc = _json(aws, capsys, DAY0, DAY0 + timedelta(hours=4), "--by", by)
        assert doc["teams"] == [] and doc["total"]["gpu_hours_held"] == 0 and doc["duplicates"] == 0, by
        [flag] = doc["flagged"]
        assert (flag["kind"], flag["stream"], flag["records"]) == ("conflict", "i-s", 96)
        assert flag["claimed_gpu_hours"] == pytest.approx(32.0) and forged in flag["teams"]


def test_invented_node_ids_are_flagged_with_verify_nodes(aws: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Two p5.48xlarge instances EC2 knows (moto launches them now, so the records are of the coming
    hour: CloudWatch Logs takes events up to 2 h ahead) and one EC2 has terminated. A forging node writes
    50 ids nobody launched for finance (400 GPU-h), and the terminated one's windows after its end (6).
    Without --verify-nodes finance is billed all of it; with it, none, told in one line."""
    ec2 = boto3.client("ec2")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, MinCount=3, MaxCount=3,
                                                      InstanceType="p5.48xlarge")["Instances"]]  # fmt: skip
    ec2.terminate_instances(InstanceIds=ids[2:])
    now = datetime.now(UTC)
    start = datetime.fromtimestamp(int(now.timestamp()) // 300 * 300, UTC)
    windows = [start + timedelta(minutes=5 * i) for i in range(12)]
    by_node = {node: [(at, _p5(node, at, {**FINANCE, "namespace": "ml"})) for at in windows] for node in ids[:2]}
    by_node |= {f"i-{k:017x}": [(at, _p5(f"i-{k:017x}", at, FINANCE)) for at in windows] for k in range(50)}
    by_node[ids[2]] = [(at, _p5(ids[2], at, FINANCE)) for at in windows[3:]]  # 15 minutes after its end
    put_records(boto3.client("logs"), by_node)
    end = start + timedelta(hours=1)
    before = _json(aws, capsys, start, end)
    assert {t["team"]: t["gpu_hours_held"] for t in before["teams"]} == pytest.approx({"finance": 406.0, "ml": 16.0})
    doc = _json(aws, capsys, start, end, "--verify-nodes")
    assert {t["team"]: t["gpu_hours_held"] for t in doc["teams"]} == pytest.approx({"ml": 16.0})
    assert {f["kind"] for f in doc["flagged"]} == {"node"} and len(doc["flagged"]) == 51
    assert sum(f["claimed_gpu_hours"] for f in doc["flagged"]) == pytest.approx(406.0)
    assert doc["nodes_checked"]["known"] == 3
    period = ["--start", start.isoformat(), "--end", end.isoformat()]
    assert main(["report", "--endpoint", aws, "--no-progress", "--verify-nodes", *period]) == 0
    lines = capsys.readouterr().out.splitlines()
    told = "609 records of 51 nodes that no source knows, or not running then, claim 406.0 GPU-h (teams finance)"
    assert sum(told in line for line in lines) == 1


def test_names_are_escaped_in_the_table_and_neutralised_in_the_csv(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = '=HYPERLINK("https://evil.example","x")\nmallory  1  9,999.0\x1b[2J'
    windows = [DAY0 + timedelta(minutes=5 * i) for i in range(12)]
    job = {"kind": "slurm", "job_id": "7", "user": user}
    records = [
        (at, message(start=at, node="i-a", workloads={"0": job}, rows=[[0, "0", 300, 300, 0, 0]])) for at in windows
    ]
    put_records(boto3.client("logs"), {"i-a": records})
    assert main(report(aws)) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and not any(line.startswith("mallory") for line in out.splitlines())
    assert '=HYPERLINK("https://evil.example","x")\\x0amallory  1  9,999.0\\x1b[2J' in out
    out_csv = tmp_path / "r.csv"
    assert main(report(aws, "--format", "csv", "--out", str(out_csv))) == 0
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert {r["name"] for r in rows if r["section"] == "team"} == {"'" + user}
