"""Issue 42 on moto server, through the real scaler.

A FIFO queue runs one message of a message group at a time (SQS developer guide, "Using the message
group ID": no two messages of one group are processed at once; an in-flight message blocks its group),
yet counts every blocked message as visible and counts no groups. One group, 10 messages (1 in flight, 9 visible)
asked for 10 nodes; now it asks for what can start: nothing more when the policy says 1 group, at most
one runner beyond those at work (told once) when it does not say.

Two groups share a queue; every in-flight message is on a node its worker marked busy. The other
group's finished runner was kept while any message ran (each group held as many nodes as messages ran);
now it goes, as the marked nodes account for every message."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from gpufleet_node.busy import BusyMark
from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet, decisions, queued, tick

pytestmark = pytest.mark.integration


def fifo_fleet(aws: str, tmp_path: Path, groups: str) -> tuple[Fleet, str]:
    """ASG `jobs` (1 busy node, max 16) driven by FIFO queue train-jobs.fifo: 10 messages of one message
    group, the first received by the node's worker and kept (in flight)."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_asg(clients, "jobs", min_size=0, max_size=16, desired=1, tags=fleet.MANAGED_TAG)
    sqs = boto3.client("sqs")
    attrs = {"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    queue = sqs.create_queue(QueueName="train-jobs.fifo", Attributes=attrs)["QueueUrl"]
    for i in range(10):
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"step": i}), MessageGroupId="model-a")
    taken = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, VisibilityTimeout=3600)["Messages"]
    assert len(taken) == 1
    # SQS holds the rest of the group back while one is in flight; moto does too
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
    policy = tmp_path / "policy.yaml"
    source = f'{{queue_url: "{queue}"{groups}}}'
    policy.write_text(
        "defaults: {scale_out_cooldown_s: 0, scale_in_cooldown_s: 0}\n"
        f"groups:\n  - {{name: jobs, kind: asg, demand: {{sqs: {source}, gpus_per_node: 1}}}}\n"
    )
    f = Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg="")
    now = datetime.now(UTC)
    [node] = f.instances("jobs")
    for minute in range(1, 6):
        f.put_instance_gpu(node, 95, 60, now - timedelta(minutes=minute))  # the worker runs its job
    return f, queue


def jobs_decision(f: Fleet, at: datetime, notify: str | None = None) -> dict[str, object]:
    result = f.scaler(notify_queue=notify).handle(tick(at.isoformat(), at), at)
    [d] = [d for d in decisions(result) if d["group"] == "asg:jobs"]
    return d


def test_a_fifo_queue_of_one_message_group_asks_for_no_node_its_blocked_messages_cannot_use(
    aws: str, tmp_path: Path
) -> None:
    f, _ = fifo_fleet(aws, tmp_path, ", message_groups: 1")
    d = jobs_decision(f, datetime.now(UTC))
    assert d["action"] != "scale-out", d["reason"]
    assert f.desired("jobs") == 1, d["reason"]


def test_a_fifo_queue_whose_groups_are_unknown_asks_for_one_runner_more_and_says_so_once(
    aws: str, tmp_path: Path
) -> None:
    f, _ = fifo_fleet(aws, tmp_path, "")
    notify = boto3.client("sqs").create_queue(QueueName="gpufleet-notify")["QueueUrl"]
    now = datetime.now(UTC)
    d = jobs_decision(f, now, notify)
    assert (d["action"], f.desired("jobs")) == ("scale-out", 2), d["reason"]  # not 11
    told = [n for n in queued(notify) if "not counted as demand" in n.title]
    d = jobs_decision(f, now + timedelta(minutes=1), notify)
    told += [n for n in queued(notify) if "not counted as demand" in n.title]
    assert f.desired("jobs") == 2, d["reason"]
    assert len({n.notification_id for n in told}) == 1, [n.title for n in told]  # told once
    assert "set demand.sqs.message_groups" in told[0].reason and "of 9 visible messages (1 in flight)" in told[0].reason


def test_a_standard_queue_refuses_message_groups() -> None:
    from gpufleet.domain.errors import PolicyError
    from gpufleet.policy.fleet import parse_policy

    text = 'groups:\n  - {name: jobs, kind: asg, demand: {sqs: {queue_url: "https://sqs.x/1/q", message_groups: 2}}}\n'
    with pytest.raises(PolicyError, match="message_groups is for a FIFO queue"):
        parse_policy(text)


def test_a_finished_runner_goes_when_marked_nodes_hold_every_message(aws: str, tmp_path: Path) -> None:
    """Groups `spot` (order 0) and `od` (order 1) read one queue. Both of spot's nodes hold a message and
    their workers marked them busy; od's only node finished its job (idle GPUs, no mark)."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_asg(clients, "spot", min_size=0, max_size=8, desired=2, tags=fleet.MANAGED_TAG)
    fleet.create_asg(clients, "od", min_size=0, max_size=8, desired=1, tags=fleet.MANAGED_TAG)
    sqs = boto3.client("sqs")
    queue = sqs.create_queue(QueueName="train-jobs")["QueueUrl"]
    for i in range(2):
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": i}))
    assert len(sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=2, VisibilityTimeout=3600)["Messages"]) == 2
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "defaults: {scale_in_step: 2, scale_out_cooldown_s: 0, scale_in_cooldown_s: 0}\ngroups:\n"
        f'  - {{name: spot, kind: asg, demand: {{sqs: {{queue_url: "{queue}"}}, gpus_per_node: 1, order: 0}}}}\n'
        f'  - {{name: od, kind: asg, demand: {{sqs: {{queue_url: "{queue}"}}, gpus_per_node: 1, order: 1}}}}\n'
    )
    f = Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg="")
    runners, [finished] = f.instances("spot"), f.instances("od")
    for runner in runners:
        BusyMark(boto3.client("dynamodb"), f"AROAWORKERROLEID:{runner}", runner, "spot").set(True)
    now = datetime.now(UTC)
    for minute in range(1, 6):
        for instance in (*runners, finished):
            f.put_instance_gpu(instance, 0, 1, now - timedelta(minutes=minute))  # inputs loading; finished
    by_group = {d["group"]: d for d in decisions(f.scaler().handle(tick("t", now), now))}
    od, spot = by_group["asg:od"], by_group["asg:spot"]
    assert od["action"] == "scale-in" and od["victims"] == [finished], od["reason"]
    assert f.instances("od") == []
    assert spot["victims"] == [] and f.instances("spot") == runners, spot["reason"]
