"""Queue workers on moto server (issue 28): a worker that holds a job protects its node the way AWS
recommends (instance scale-in protection, set by `gpufleet-node busy`'s own code), and the scaler then
passes that node over however idle its GPUs read; doctor warns about a queue group whose workers hold
messages while nothing marks their nodes busy, and stops once one does."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from gpufleet_node.busy import AsgProtection, Holders
from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet
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


def test_the_node_whose_worker_holds_a_job_is_never_the_victim(aws: str, tmp_path: Path) -> None:
    """Three idle-reading nodes, one job in flight on the second: its worker protected it through the
    helper's own SetInstanceProtection code. Scale-in passes it over; the idle nodes go."""
    f, queue, (idle_a, busy, idle_b) = queue_fleet(aws, tmp_path, nodes=3)
    take_job(queue)
    holders = Holders(str(tmp_path / "busy"), name="worker")
    holders.acquire(lambda: AsgProtection(boto3.client("autoscaling"), busy, "jobs").set(True))
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

    AsgProtection(boto3.client("autoscaling"), first, "jobs").set(True)  # a worker marks its node
    main(["doctor", "--policy", str(f.policy_path), "--endpoint", aws])
    assert "gpufleet-node busy" not in capsys.readouterr().out
