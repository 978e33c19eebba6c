"""`gpufleet local send` on moto server: a real EventBridge alarm event (AWS's documentation sample) whose
name lacks the stack's prefix is not delivered - the template's rule pattern decides, as on AWS - and the
same event named with the prefix is delivered to the scaler, which acts on it."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from gpufleet_tools.local import load_template
from gpufleet_tools.local_stack import create_stack
from tests.integration.conftest import Fleet
from tests.integration.test_invoke_events import ROOT, gpufleet, on_fleet

pytestmark = pytest.mark.integration

TEMPLATE = ROOT / "template.yaml"
REAL = ROOT / "tests" / "fixtures" / "real_events" / "eb-alarm-state-change-metric--awsdocs-cloudwatch-user-guide.json"


def send(fleet: Fleet, event: Path, *extra: str, extra_env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = gpufleet("local", "send", str(event), *on_fleet(fleet), *extra, extra_env=extra_env)
    return proc.returncode, proc.stdout, proc.stderr


def test_an_alarm_without_the_prefix_is_not_delivered_one_with_it_is(gpu_fleet: Fleet, tmp_path: Path) -> None:
    code, out, err = send(gpu_fleet, REAL)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"not delivered: no EventBridge rule in {ROOT / 'template.yaml'} matches (source 'aws.cloudwatch', "
        "detail-type 'CloudWatch Alarm State Change', alarmName 'ServerCpuTooHigh')"
    ]
    event = json.loads(REAL.read_text())
    event["detail"]["alarmName"] = "gpufleet-train-spot-high"
    event["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = {
        "AutoScalingGroupName": "train-spot"
    }
    event["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["namespace"] = "GPUFleet"
    named = tmp_path / "named.json"
    named.write_text(json.dumps(event))
    gpu_fleet.policy_path.write_text(
        gpu_fleet.policy_path.read_text() + "alarms: [{alarm: 'gpufleet-train-spot-*', direction: out}]\n"
    )
    before = gpu_fleet.desired()
    code, out, err = send(gpu_fleet, named, "--param", "AlarmNamePrefix=gpufleet-")
    assert code == 0, err
    assert "delivered to scaler (rule AlarmStateChange)" in err
    [delivery] = json.loads(out)["delivered_to"]  # stdout is one JSON document; the logs are on stderr
    assert (delivery["function"], delivery["rule"], delivery["already_handled"]) == ("scaler", "AlarmStateChange", [])
    [decision] = [d for r in delivery["result"]["results"] for d in r["decisions"]]
    assert decision["group"] == "asg:train-spot" and gpu_fleet.desired() == before + 1, decision


def _named_alarm(tmp_path: Path) -> Path:
    """AWS's sample alarm event, named and aimed so the template's rule delivers it to train-spot's scaler."""
    event = json.loads(REAL.read_text())
    event["detail"]["alarmName"] = "gpufleet-train-spot-high"
    metric = event["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]
    metric["dimensions"], metric["namespace"] = {"AutoScalingGroupName": "train-spot"}, "GPUFleet"
    named = tmp_path / "named.json"
    named.write_text(json.dumps(event))
    return named


def test_local_up_makes_the_queues_as_the_template_does(aws: str) -> None:
    """Before: the notification queue had SQS's 30 s visibility (the template says 720 s: six times the
    notifier's timeout), so a record came back while its invocation still ran. Every property the
    template gives a queue is read from the template here, never copied."""
    doc, _ = load_template(TEMPLATE)
    create_stack(TEMPLATE, aws)
    sqs = boto3.client("sqs")
    queues = {n: r["Properties"] for n, r in doc["Resources"].items() if r["Type"] == "AWS::SQS::Queue"}
    assert "VisibilityTimeout" in queues["NotificationQueue"]
    for name, props in queues.items():
        url = sqs.get_queue_url(QueueName=f"gpufleet-{name}")["QueueUrl"]
        have = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        for key in ("VisibilityTimeout", "MessageRetentionPeriod"):
            assert have[key] == str(props.get(key, DEFAULTS[key])), (name, key)
        if "RedrivePolicy" in props:
            redrive = json.loads(have["RedrivePolicy"])
            assert int(redrive["maxReceiveCount"]) == props["RedrivePolicy"]["maxReceiveCount"]
            dlq = props["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
            assert redrive["deadLetterTargetArn"].endswith(f":gpufleet-{dlq}")


DEFAULTS = {"VisibilityTimeout": 30, "MessageRetentionPeriod": 345600}  # SQS's own, for a property left out


FAKE_SCALER = """
import os, boto3
def lambda_handler(event, context):  # queues two notifications, as the scaler queues its own
    sqs = boto3.client("sqs")
    for body in ("fine", "refused by Slack"):
        sqs.send_message(QueueUrl=os.environ["GPUFLEET_NOTIFY_QUEUE_URL"], MessageBody=body)
    return {"results": []}
"""
FAKE_NOTIFIER = """
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)  # as the notifier's
def record_handler(record):
    if record.body != "fine":
        raise RuntimeError(record.body)
def lambda_handler(event, context):
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
"""


def test_failed_notifications_stay_on_the_queue_and_the_send_fails(gpu_fleet: Fleet, tmp_path: Path) -> None:
    """Before: `local send` deleted every received notification, the notifier's batchItemFailures
    included, and exited 0. Now only the successes are deleted; the failed one stays on the queue (as
    Lambda's event source leaves it, back after the template's visibility timeout), stderr names it with
    why, and the exit code is 1. The functions are stand-ins (--functions-dir) that queue one good and one
    bad notification and answer as the notifier does, with Powertools' batch processor."""
    env = create_stack(TEMPLATE, gpu_fleet.endpoint)
    for name, source in (("scaler", FAKE_SCALER), ("notifier", FAKE_NOTIFIER)):
        (tmp_path / "functions" / name).mkdir(parents=True)
        (tmp_path / "functions" / name / "app.py").write_text(source)
    extra = ("--param", "AlarmNamePrefix=gpufleet-", "--functions-dir", str(tmp_path / "functions"))
    code, out, err = send(gpu_fleet, _named_alarm(tmp_path), *extra, extra_env=env)
    assert code == 1, err
    notifier = json.loads(out)["notifier"]
    [failed] = notifier["failed"]
    assert failed["why"] == "RuntimeError: refused by Slack"
    queue = load_template(TEMPLATE)[0]["Resources"]["NotificationQueue"]["Properties"]
    visibility, receives = queue["VisibilityTimeout"], queue["RedrivePolicy"]["maxReceiveCount"]
    head = "error: notifier failed 1 of 2 notification(s): left on the queue, back after its visibility timeout"
    assert f"{head} ({visibility} s)" in err
    assert f"  {failed['messageId']} (receive 1 of {receives} before the DLQ): RuntimeError: refused by Slack" in err
    sqs = boto3.client("sqs")
    names = ["ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessages"]
    counts = sqs.get_queue_attributes(QueueUrl=env["GPUFLEET_NOTIFY_QUEUE_URL"], AttributeNames=names)["Attributes"]
    assert (counts[names[0]], counts[names[1]]) == ("1", "0")  # the failed one in flight; the good one deleted


def test_more_than_one_batch_of_notifications_is_all_delivered(gpu_fleet: Fleet, tmp_path: Path) -> None:
    """Before: `local send` received one batch (10) and exited 0; the other 15 stayed queued, never
    delivered. Now it hands the queue over batch after batch until nothing is visible: all 25 reach the
    notifier, the 24 good ones are deleted, the one failure (in a later batch) stays and the send fails."""
    env = create_stack(TEMPLATE, gpu_fleet.endpoint)
    scaler = FAKE_SCALER.replace('("fine", "refused by Slack")', '["fine"] * 20 + ["refused by Slack"] + ["fine"] * 4')
    for name, source in (("scaler", scaler), ("notifier", FAKE_NOTIFIER)):
        (tmp_path / "functions" / name).mkdir(parents=True)
        (tmp_path / "functions" / name / "app.py").write_text(source)
    extra = ("--param", "AlarmNamePrefix=gpufleet-", "--functions-dir", str(tmp_path / "functions"))
    code, out, err = send(gpu_fleet, _named_alarm(tmp_path), *extra, extra_env=env)
    notifier = json.loads(out)["notifier"]
    assert code == 1 and notifier["notifications"] == 25, err
    [failed] = notifier["failed"]
    assert failed["why"] == "RuntimeError: refused by Slack"
    assert notifier["result"]["batchItemFailures"] == [{"itemIdentifier": failed["messageId"]}]
    names = ["ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessages"]
    counts = boto3.client("sqs").get_queue_attributes(QueueUrl=env["GPUFLEET_NOTIFY_QUEUE_URL"], AttributeNames=names)
    assert (counts["Attributes"][names[0]], counts["Attributes"][names[1]]) == ("1", "0")
