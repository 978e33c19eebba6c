"""IAM conformance for the calls issue 28 added to the scaler's demand path, made for real on moto server
and checked against the scaler's role in the expanded template (the conformance test evaluates whatever
calls a session made; this one makes sure these calls are among them, whatever else runs):

- SQS GetQueueAttributes with both counts (visible: waiting; NotVisible: in flight, holding nodes);
- EC2 DescribeInstances filtered by instance id (when each node launched: the GPU-ready probe);
- CloudWatch GetMetricData, SampleCount of each young node's GPUUtilization (has it reported GPUs).

The tick releases idle nodes down to what the in-flight job holds, so the release path's own calls
(instance metrics, TerminateInstanceInAutoScalingGroup) are checked too. A role without one of the three
actions is denied here (so the check can fail).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient

from gpufleet.aws.backlog import IN_FLIGHT, VISIBLE
from gpufleet_node import schema
from rehearsal import fleet
from rehearsal.calls import CallRecord, calling_function
from tests.conftest import RECORDER, ROOT
from tests.iam.test_conformance import denials
from tests.integration.conftest import TABLE, Fleet

pytestmark = pytest.mark.integration
TICK = ROOT / "events" / "scaler" / "scheduler-reconcile.json"
NEW_ACTIONS = {"sqs:GetQueueAttributes", "ec2:DescribeInstances", "cloudwatch:GetMetricData"}


@contextmanager
def scaler_params() -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    """(service, operation, parameters) of every call the scaler function makes meanwhile (the recorder
    keeps actions and resources only; the probe's filter and statistic are in the parameters)."""
    seen: list[tuple[str, str, dict[str, Any]]] = []
    original: Callable[..., Any] = BaseClient._make_api_call

    def call(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        if calling_function() == "scaler":
            seen.append(
                (client.meta.service_model.service_name, operation, json.loads(json.dumps(params, default=str)))
            )
        return original(client, operation, params)

    BaseClient._make_api_call = call
    try:
        yield seen
    finally:
        BaseClient._make_api_call = original


@pytest.fixture
def queue_tick(
    aws: str, tmp_path: Path
) -> tuple[list[CallRecord], list[tuple[str, str, dict[str, Any]]], dict[str, Any]]:
    """Three young, idle-reading 8-GPU nodes of ASG `jobs` (min 0); queue train-jobs has one job in flight
    and none visible. One reconcile tick; what it recorded, its parameters, and the setup's names."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_asg(clients, "jobs", min_size=0, max_size=8, desired=3, tags=fleet.MANAGED_TAG)
    sqs = boto3.client("sqs")
    queue = sqs.create_queue(QueueName="train-jobs")["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody="{}")
    assert sqs.receive_message(QueueUrl=queue, VisibilityTimeout=3600)["Messages"]  # in flight, not deleted
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "defaults: {scale_in_cooldown_s: 0}\n"
        f'groups:\n  - {{name: jobs, kind: asg, demand: {{sqs: {{queue_url: "{queue}", gpus_per_message: 8}}, '
        "gpus_per_node: 8}}\n"
    )
    f = Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg="")
    ids = f.instances("jobs")
    now = datetime.now(UTC) + timedelta(seconds=5)  # launched a moment ago (moto's clock): young nodes
    for minute in range(0, 6):
        for iid in ids:
            f.put_instance_gpu(iid, 0, 1, now - timedelta(minutes=minute))
    scaler = f.scaler()
    before = len(RECORDER.records)
    with scaler_params() as seen:
        result = scaler.handle(json.loads(TICK.read_text()), now)
    [d] = [d for r in result["results"] for d in r["decisions"] if d["group"] == "asg:jobs"]
    assert d["action"] == "scale-in" and len(d["victims"]) == 2, d["reason"]  # down to the one node held
    return RECORDER.records[before:], seen, {"ids": ids, "queue": queue}


def test_the_demand_paths_new_calls_are_made_as_described(
    queue_tick: tuple[list[CallRecord], list[tuple[str, str, dict[str, Any]]], dict[str, Any]],
) -> None:
    records, seen, setup = queue_tick
    assert {r.action for r in records if r.function == "scaler"} >= NEW_ACTIONS, {r.action for r in records}

    [counts] = [p for svc, op, p in seen if (svc, op) == ("sqs", "GetQueueAttributes")]
    assert counts["QueueUrl"] == setup["queue"] and set(counts["AttributeNames"]) == {VISIBLE, IN_FLIGHT}

    described = [p for svc, op, p in seen if (svc, op) == ("ec2", "DescribeInstances")]
    filters = [f for p in described for f in p.get("Filters", [])]
    assert {"Name": "instance-id", "Values": sorted(setup["ids"])} in filters, described

    probed = {
        {d["Name"]: d["Value"] for d in q["MetricStat"]["Metric"]["Dimensions"]}[schema.DIM_INSTANCE_ID]
        for svc, op, p in seen
        if (svc, op) == ("cloudwatch", "GetMetricData")
        for q in p["MetricDataQueries"]
        if q["MetricStat"]["Stat"] == "SampleCount"
        and q["MetricStat"]["Metric"]["MetricName"] == schema.GPU_UTILIZATION.name
    }
    assert probed == set(setup["ids"]), "the GPU-ready probe asked for every young node's GPU reports"


def test_the_scalers_role_allows_every_call_of_the_queue_tick(
    queue_tick: tuple[list[CallRecord], list[tuple[str, str, dict[str, Any]]], dict[str, Any]],
) -> None:
    records, _, _ = queue_tick
    assert [r.resources[0].arn for r in records if r.action == "sqs:GetQueueAttributes"] == [
        "arn:aws:sqs:us-east-1:123456789012:train-jobs"
    ]
    assert denials(records) == []


@pytest.mark.parametrize(
    ("action", "edit"),
    [
        ("sqs:GetQueueAttributes", ("Action: sqs:GetQueueAttributes\n", "Action: sqs:GetQueueUrl\n")),
        ("ec2:DescribeInstances", ("- ec2:DescribeInstances  #", "- ec2:DescribeImages  #")),
        ("cloudwatch:GetMetricData", ("- cloudwatch:GetMetricData\n", "- cloudwatch:GetMetricStatistics\n")),
    ],
)
def test_a_role_without_the_action_is_denied(
    queue_tick: tuple[list[CallRecord], list[tuple[str, str, dict[str, Any]]], dict[str, Any]],
    action: str,
    edit: tuple[str, str],
) -> None:
    """The check bites: the scaler's role with one new action taken out denies exactly that call."""
    records, _, _ = queue_tick
    template = (ROOT / "template.yaml").read_text()
    scaler_at = template.index("  ScalerFunction:\n")
    head, tail = template[:scaler_at], template[scaler_at:]
    assert edit[0] in tail
    found = denials(records, head + tail.replace(edit[0], edit[1], 1))
    assert found and all(line.startswith(f"scaler: {action} on ") for line in found), found
