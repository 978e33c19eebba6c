"""Queue workers on moto server (issues 28, 41): a worker that holds a job marks its node busy
(`gpufleet-node busy`'s own code: one item keyed by its own aws:userid), the scaler turns the mark into
instance scale-in protection and passes that node over however idle its GPUs read; a principal that
clears the worker's protection and protects a spare moves nothing (the mark re-protects, the spare's
protection is kept and told once); doctor warns about a queue group whose workers hold messages while
nothing marks their nodes busy, and stops once one does."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from gpufleet.domain.notification import NotificationKind
from gpufleet_node.busy import BusyMark, Holders
from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet, decisions, queued, tick
from tests.integration.test_demand_moto import TICK

pytestmark = pytest.mark.integration


def queue_fleet(aws: str, tmp_path: Path, nodes: int) -> tuple[Fleet, str, list[str]]:
    """ASG `jobs` (`nodes` of max 8, tagged) driven by queue train-jobs (1 GPU per message and node)."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_asg(clients, "jobs", min_size=0, max_size=8, desired=nodes, tags=fleet.MANAGED_TAG)
    queue = boto3.client("sqs").create_queue(QueueName="train-jobs")["QueueUrl"]
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "defaults: {scale_in_step: 2, scale_out_cooldown_s: 0, scale_in_cooldown_s: 0}\n"
        f'groups:\n  - {{name: jobs, kind: asg, demand: {{sqs: {{queue_url: "{queue}"}}, gpus_per_node: 1}}}}\n'
    )
    f = Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg="")
    return f, queue, f.instances("jobs")


def take_job(queue: str) -> None:
    """A worker receives one message and keeps it (in flight) while it works."""
    sqs = boto3.client("sqs")
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": 1}))
    [message] = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, VisibilityTimeout=3600)["Messages"]
    assert message["Body"]


def mark(instance_id: str) -> BusyMark:
    """The helper's own mark for a node, with the aws:userid its instance profile would have."""
    return BusyMark(boto3.client("dynamodb"), f"AROAWORKERROLEID:{instance_id}", instance_id, "jobs")


def protected(f: Fleet, asg: str = "jobs") -> dict[str, bool]:
    [group] = f.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"]
    return {i["InstanceId"]: bool(i["ProtectedFromScaleIn"]) for i in group["Instances"]}


def test_the_node_whose_worker_holds_a_job_is_never_the_victim(aws: str, tmp_path: Path) -> None:
    """Three idle-reading nodes, one job in flight on the second: its worker marked it through the
    helper's own code. The tick protects it in Auto Scaling and passes it over; the idle nodes go."""
    f, queue, (idle_a, busy, idle_b) = queue_fleet(aws, tmp_path, nodes=3)
    take_job(queue)
    holders = Holders(str(tmp_path / "busy"), name="worker")
    holders.acquire(lambda: mark(busy).set(True))
    now = datetime.now(UTC)
    for minute in range(1, 6):
        for instance in (idle_a, busy, idle_b):
            f.put_instance_gpu(instance, 0, 1, now - timedelta(minutes=minute))
    result = f.scaler().handle(json.loads(TICK.read_text()), now)
    [d] = [d for r in result["results"] for d in r["decisions"] if d["group"] == "asg:jobs"]
    assert d["action"] == "scale-in", d["reason"]
    assert sorted(d["victims"]) == sorted([idle_a, idle_b]), d["reason"]
    assert "1 node(s) held by running messages" in d["reason"] and "passed over 1 scale-in protected" in d["reason"]
    assert f.instances("jobs") == [busy]
    assert protected(f) == {busy: True}  # Auto Scaling's own scale-in passes it over too
    holders.release(lambda: mark(busy).set(False))  # the job ends: the next tick clears what it set
    f.scaler().handle(tick("after-the-job", now + timedelta(minutes=1)), now + timedelta(minutes=1))
    assert protected(f) == {busy: False}


def test_another_principal_moving_protection_moves_nothing_and_is_told_once(aws: str, tmp_path: Path) -> None:
    """Issue 41: worker W holds a job while it downloads its inputs (GPUs idle), spare X is idle, one message
    in flight. Someone clears W's protection and protects X (a node can no longer: its role has no
    SetInstanceProtection, tests/iam/test_node_policy.py; here a principal with Auto Scaling rights, as moto
    enforces no IAM). Before, the tick then terminated W with its message in flight. Now W's own mark
    protects it again and keeps it; X's protection, which no mark explains, is kept and told once."""
    f, queue, (worker, spare) = queue_fleet(aws, tmp_path, nodes=2)
    take_job(queue)
    mark(worker).set(True)
    sqs = boto3.client("sqs")
    notify = sqs.create_queue(QueueName="gpufleet-notify")["QueueUrl"]
    now = datetime.now(UTC)
    for minute in range(1, 6):
        for instance in (worker, spare):
            f.put_instance_gpu(instance, 0, 1, now - timedelta(minutes=minute))
    autoscaling = f.clients.autoscaling
    autoscaling.set_instance_protection(InstanceIds=[worker], AutoScalingGroupName="jobs", ProtectedFromScaleIn=False)
    autoscaling.set_instance_protection(InstanceIds=[spare], AutoScalingGroupName="jobs", ProtectedFromScaleIn=True)
    told = []
    for k in range(2):
        at = now + timedelta(minutes=k)
        [d] = [
            d
            for d in decisions(f.scaler(notify_queue=notify).handle(tick(f"t{k}", at), at))
            if d["group"] == "asg:jobs"
        ]
        assert d["victims"] == [], d["reason"]
        assert f.instances("jobs") == sorted([worker, spare])
        assert protected(f) == {worker: True, spare: True}
        told += [n for n in queued(notify) if n.kind is NotificationKind.CONTROL]
    ids = {n.notification_id for n in told}
    assert len(ids) == 1, [n.title for n in told]  # one incident, folded: told once
    assert spare in told[0].facts["instances"] and worker not in told[0].facts["instances"]
    assert "protected by someone else, kept" in told[0].title


def test_a_mark_written_after_the_decision_keeps_its_node_at_the_last_look(aws: str, tmp_path: Path) -> None:
    """A job taken between the tick's read and the terminate call: the last look reads the marks again."""
    from gpufleet.aws.busy_marks import BusyMarks
    from gpufleet.aws.groups.asg import AutoScalingReads

    f, _, (a, b) = queue_fleet(aws, tmp_path, nodes=2)
    reads = AutoScalingReads(f.clients.autoscaling, BusyMarks(f.clients.dynamodb, f.clients.autoscaling))
    assert reads.standing("jobs", [a, b]) == {}
    mark(b).set(True)
    assert reads.standing("jobs", [a, b]) == {b: f"holds a job now (busy mark by AROAWORKERROLEID:{b})"}


def test_marks_that_cannot_be_read_keep_every_node(aws: str, tmp_path: Path) -> None:
    """No busy table (or no permission to read it): no node of the group is a victim, and the tick says why."""
    f, queue, nodes = queue_fleet(aws, tmp_path, nodes=3)
    take_job(queue)  # one node is held by a running message: two would go
    f.clients.dynamodb.delete_table(TableName="gpufleet-busy")
    now = datetime.now(UTC)
    for minute in range(1, 6):
        for instance in nodes:
            f.put_instance_gpu(instance, 0, 1, now - timedelta(minutes=minute))
    notify = boto3.client("sqs").create_queue(QueueName="gpufleet-notify")["QueueUrl"]
    [d] = [d for d in decisions(f.scaler(notify_queue=notify).handle(tick("t", now), now)) if d["group"] == "asg:jobs"]
    assert d["victims"] == [] and f.instances("jobs") == nodes, d["reason"]
    [told] = [n for n in queued(notify) if n.kind is NotificationKind.CONTROL]
    assert told.title == "busy marks are not kept as scale-in protection"
    assert "gpufleet-busy cannot be read" in told.reason and "no node of an ASG-backed group" in told.reason


def test_doctor_warns_about_a_queue_group_whose_busy_nodes_nothing_marks(
    aws: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpufleet_tools.cli import main

    f, queue, (first, _) = queue_fleet(aws, tmp_path, nodes=2)
    take_job(queue)
    main(["doctor", "--policy", str(f.policy_path), "--endpoint", aws])
    out = capsys.readouterr().out
    warned = [line for line in out.splitlines() if "gpufleet-node busy" in line]
    assert len(warned) == 1 and warned[0].startswith("warning") and "asg:jobs" in warned[0], out
    assert "1 message(s) of queue train-jobs are being worked on" in warned[0]
    assert "0 message(s) waiting, 1 being worked on now" in out

    mark(first).set(True)  # a worker marks its node; the next tick protects it
    f.scaler().handle(tick("mark-seen", datetime.now(UTC)), datetime.now(UTC))
    main(["doctor", "--policy", str(f.policy_path), "--endpoint", aws])
    assert "gpufleet-node busy" not in capsys.readouterr().out
