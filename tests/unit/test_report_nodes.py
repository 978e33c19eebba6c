"""Issue 41 (part 3): invented node ids. A node's role may write a stream under any id; before, one node
inventing 50 p5.48xlarge ids, each within its own bounds for a day, added 9,600 GPU-h ($66,048) to one
team, unflagged. With --verify-nodes a record counts only if EC2, Auto Scaling or HyperPod knows its node
and the node ran during the window (report.fleet); the rest is flagged and told in one line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpufleet_tools.report.fleet import KnownNodes
from gpufleet_tools.report.identity import identify
from gpufleet_tools.report.model import FlagKind, NodeSource, Report
from gpufleet_tools.report.records import RecordParser
from gpufleet_tools.report.render import json_doc, table
from gpufleet_tools.report.usage import UsageSums
from tests.unit.test_report_forged import DAY, FINANCE, Event, event, honest, hour_rows, teams
from tests.unit.test_report_usage import DAY0

P5_GPU_HOUR = 55.04 / 8
ASKED = DAY0 + timedelta(days=2)


def report(events: list[Event], known: KnownNodes | None = None) -> Report:
    sums, parser = UsageSums(DAY, known=known), RecordParser(identify)
    for stream, stamp, text in sorted(events, key=lambda e: e[1]):
        sums.add(parser.parse(text, stream, stamp))
    return sums.report()


def instance(node: str, launched: datetime, itype: str = "p5.48xlarge", **kw: Any) -> dict[str, Any]:
    """One DescribeInstances instance, as EC2 answers it."""
    eni = {"Attachment": {"AttachTime": kw.pop("attached", launched), "DeviceIndex": 0}}
    doc = {"InstanceId": node, "InstanceType": itype, "LaunchTime": launched, "State": {"Name": "running"}}
    return doc | {"NetworkInterfaces": [eni]} | kw


def ec2_knows(*instances: dict[str, Any]) -> KnownNodes:
    known = KnownNodes(ASKED)
    known.add_instances([{"Instances": list(instances)}])
    known.add_activities([])
    known.add_cluster_nodes([])
    return known


def fleet(nodes: int = 10) -> KnownNodes:
    return ec2_knows(*(instance(f"i-{n}", DAY0 - timedelta(days=3)) for n in range(nodes)))


def invented(count: int = 50) -> list[Event]:
    """`count` ids nobody launched, 8 GPUs each for the day, for finance: each within its own bounds."""
    return [
        event(f"i-fake{k:02d}", 60 * w, seconds=3600, rows=hour_rows(), workloads={"0": FINANCE})
        for k in range(count)
        for w in range(24)
    ]


def test_fifty_invented_node_ids_are_billed_without_the_check_and_flagged_with_it() -> None:
    before = report([*honest(), *invented()])
    assert teams(before)["finance"] == pytest.approx(9_600.0) and not before.flagged  # the numbers
    assert before.total.cost - 13_209.60 == pytest.approx(9_600 * P5_GPU_HOUR) == pytest.approx(66_048.0)
    assert "note: node ids not checked against EC2, Auto Scaling or HyperPod (--verify-nodes)" in table(before)

    r = report([*honest(), *invented()], fleet())
    assert "finance" not in teams(r)
    assert r.total.held_h == pytest.approx(1920.0) and r.total.cost == pytest.approx(13_209.60)
    nodes, records, held_h, who = r.node_flags
    assert (nodes, records, who) == (50, 1200, ("finance",)) and held_h == pytest.approx(9_600.0)
    assert {f.kind for f in r.flagged} == {FlagKind.NODE}
    assert "no instance i-fake00 is known to EC2 DescribeInstances, Auto Scaling activities" in r.flagged[0].detail
    lines = table(r).splitlines()
    told = "1,200 records of 50 nodes that no source knows, or not running then, claim 9,600.0 GPU-h (teams finance)"
    assert sum(told in line for line in lines) == 1
    assert any(line.startswith("note: node ids checked against EC2 DescribeInstances, ") for line in lines)
    assert json_doc(r)["nodes_checked"] == {"sources": [s.value for s in NodeSource], "known": 10}


def test_windows_outside_a_nodes_life_in_the_scaling_activities_are_flagged() -> None:
    """A node the ASG launched at 06:00 and terminated at 12:00 (EC2 no longer lists it): the forger
    fills its id for the rest of the day. Only the six hours it ran count."""
    known = fleet(0)
    known.add_activities(
        [
            {"Description": "Launching a new EC2 instance: i-0123456789abcdef0", "StatusCode": "Successful",
             "StartTime": DAY0 + timedelta(hours=6), "EndTime": DAY0 + timedelta(hours=6, minutes=1)},
            {"Description": "Terminating EC2 instance: i-0123456789abcdef0", "StatusCode": "Successful",
             "StartTime": DAY0 + timedelta(hours=11, minutes=58), "EndTime": DAY0 + timedelta(hours=12)},
            {"Description": "Launching a new EC2 instance.  Status Reason: capacity", "StatusCode": "Failed",
             "StartTime": DAY0},
        ]
    )  # fmt: skip
    node = "i-0123456789abcdef0"
    events = [event(node, 60 * w, seconds=3600, rows=hour_rows()) for w in range(24)]
    r = report(events, known)
    assert r.total.held_h == pytest.approx(6 * 8.0)
    nodes, records, held_h, _ = r.node_flags
    assert (nodes, records) == (1, 18) and held_h == pytest.approx(18 * 8.0)
    assert "was not running then: known 2026-11-23 06:00 .. 2026-11-23 12:00 (Auto Scaling activities)" in (
        r.flagged[0].detail
    )


def test_a_stopped_and_started_instance_ran_since_its_network_interface_was_attached() -> None:
    """LaunchTime is the last start; the primary interface's AttachTime is the first launch."""
    restarted = instance("i-0", DAY0 + timedelta(hours=20), attached=DAY0 - timedelta(days=9))
    assert report(honest(1), ec2_knows(restarted)).total.held_h == pytest.approx(192.0)
    assert report(honest(1), ec2_knows(instance("i-0", DAY0 + timedelta(hours=20)))).total.held_h == pytest.approx(32)


def test_a_record_of_another_type_than_ec2_says_is_flagged() -> None:
    r = report(honest(1), ec2_knows(instance("i-0", DAY0 - timedelta(days=1), itype="g5.xlarge")))
    assert (
        r.total.held_h == 0 and "i-0 is a g5.xlarge (EC2 DescribeInstances), not a p5.48xlarge" in r.flagged[0].detail
    )


def test_a_terminated_instance_ended_when_ec2_says_and_hyperpod_nodes_are_known() -> None:
    gone = instance("i-0", DAY0 - timedelta(days=1), State={"Name": "terminated"})
    gone["StateTransitionReason"] = "User initiated (2026-11-23 02:00:00 GMT)"
    known = ec2_knows(gone)
    hyperpod = {"InstanceId": "i-1", "InstanceType": "p5.48xlarge", "LaunchTime": DAY0, "InstanceGroupName": "g"}
    known.add_cluster_nodes([hyperpod])
    r = report(honest(2), known)
    assert teams(r) == {"team-0": pytest.approx(2 * 8.0), "team-1": pytest.approx(192.0)}


def test_the_verdicts_do_not_depend_on_the_clock() -> None:
    """Pure: the time asked is handed in, never read."""
    assert KnownNodes(datetime(2030, 1, 1, tzinfo=UTC)).check.asked.year == 2030
