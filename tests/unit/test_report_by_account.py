"""`gpufleet report --by account|partition`: a Slurm job's GPU-hours charged to its Slurm account or
partition (recorded by the node from squeue); pods keep their team. A HyperPod node's records read as its
instance group, not "(no group)"."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet_tools.report.identity import identify_by
from gpufleet_tools.report.prices import PriceBook
from gpufleet_tools.report.records import RecordParser
from gpufleet_tools.report.usage import Period, Report, Selection, UsageSums
from tests.unit.test_report_records import START, TRAINER, message

PERIOD = Period(START.replace(hour=0, minute=0), START.replace(hour=0, minute=0) + timedelta(days=1))
JOBS = {
    "0": {"kind": "slurm", "job_id": "4242", "user": "alice", "account": "ml-research", "partition": "train"},
    "1": {"kind": "slurm", "job_id": "4243", "user": "bob", "account": "ml-research", "partition": "debug"},
    "2": {"kind": "slurm", "job_id": "4244", "user": "carol"},  # squeue did not know it
    "3": TRAINER,
}
ROWS = [[0, "0", 300, 300, 0, 1], [1, "1", 300, 0, 300, 1], [2, "2", 300, 150, 0, 1], [3, "3", 300, 30, 0, 1]]
HYPERPOD = "hyperpod:ml-cluster/gpu-a"


def report(by: str) -> Report:
    sums, parser = UsageSums(PERIOD, Selection()), RecordParser(identify_by(by))
    sums.add(parser.parse(message(group=HYPERPOD, workloads=JOBS, rows=ROWS)))
    return sums.report(PriceBook())


@pytest.mark.parametrize(
    ("by", "held_h"),
    [
        ("team", {"alice": 300 / 3600, "bob": 300 / 3600, "carol": 300 / 3600, "team-a": 300 / 3600}),
        ("account", {"ml-research": 600 / 3600, "(no account)": 300 / 3600, "team-a": 300 / 3600}),
        ("partition", {"train": 300 / 3600, "debug": 300 / 3600, "(no partition)": 300 / 3600, "team-a": 300 / 3600}),
    ],
)
def test_by_account_and_partition(by: str, held_h: dict[str, float]) -> None:
    got = {t.team: t.usage.held_h for t in report(by).teams}
    assert got == pytest.approx(held_h)


def test_a_hyperpod_nodes_usage_is_its_instance_group() -> None:
    assert [g.group for g in report("account").groups] == [HYPERPOD]


def test_an_unknown_by_is_refused() -> None:
    with pytest.raises(ValueError, match="--by"):
        identify_by("queue")
