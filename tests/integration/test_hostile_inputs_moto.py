"""The probe's defects (issue 22), each reproduced against moto server: one bad alarm, id or field must
never stop the fleet, act on something CloudWatch does not say, or act twice."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from gpufleet.aws.audit import AuditLog
from gpufleet.aws.state import StateStore
from gpufleet.domain.errors import InvalidEvent
from gpufleet.domain.models import Outcome
from rehearsal import fleet
from tests.integration.conftest import NOW, TABLE, Fleet, decisions, queued, sample, tick
from tests.integration.test_spot_watch_moto import watch

LONG_NAME = "gpufleet-" + "\U0001d518" * 246  # the prefix and 246 four-byte characters: 255 characters, 993 bytes
ZERO_COOLDOWNS = "defaults: {scale_out_step: 1, scale_in_step: 1, scale_out_cooldown_s: 0, scale_in_cooldown_s: 0}\n"
SNS_TIME = "%Y-%m-%dT%H:%M:%S.000+0000"  # how an SNS alarm message writes StateChangeTime


def outcomes(result: dict[str, Any]) -> list[str]:
    return [d["outcome"] for d in decisions(result)]


def sns(message: dict[str, Any], message_id: str = "m-1") -> dict[str, Any]:
    record = {"EventSource": "aws:sns", "Sns": {"MessageId": message_id, "Message": json.dumps(message)}}
    record["Sns"]["TopicArn"] = "arn:aws:sns:us-east-1:123456789012:gpufleet-alarms"
    return {"Records": [record]}


def sns_alarm(name: str, arn: str, dims: dict[str, str], at: datetime, account: str = "123456789012") -> dict[str, Any]:
    return {
        "AlarmName": name,
        "AlarmArn": arn,
        "AWSAccountId": account,
        "NewStateValue": "ALARM",
        "OldStateValue": "OK",
        "NewStateReason": "Threshold Crossed",
        "StateChangeTime": at.strftime(SNS_TIME),
        "Trigger": {
            "MetricName": "GPUUtilization",
            "Namespace": "GPUFleet",
            "Dimensions": [{"name": k, "value": v} for k, v in dims.items()],
        },
    }


def test_a_long_alarm_name_scales_once_is_audited_and_every_later_tick_works(gpu_fleet: Fleet) -> None:
    """#1: the decision's audit key (alarm ARN + time) overflowed 1,024 bytes after capacity changed,
    and the outbox entry then failed every retry and every reconcile tick, for every group."""
    cw = gpu_fleet.clients.cloudwatch
    fleet.put_gpu_alarm(
        cw, LONG_NAME, {"AutoScalingGroupName": "train-spot"}, direction="out", threshold=50, evaluation_periods=1
    )
    gpu_fleet.alarm_state(LONG_NAME, "ALARM")
    event = sample("scaler/alarm-action-asg-low.json")
    event["alarmArn"] = f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{LONG_NAME}"
    event["alarmData"]["alarmName"] = LONG_NAME
    stack = fleet.create_notification_stack(slack_secret=None)
    scaler = gpu_fleet.scaler(notify_queue=stack.queue_url)
    assert outcomes(scaler.handle(event, NOW)) == ["applied"]
    assert gpu_fleet.desired() == 3
    assert [d.outcome for d in AuditLog(gpu_fleet.clients.dynamodb, TABLE).recent("asg:train-spot")] == [
        Outcome.APPLIED
    ]
    assert StateStore(gpu_fleet.clients.dynamodb, TABLE).load(["asg:train-spot"])["asg:train-spot"].outbox == ()
    told = queued(stack.queue_url)
    assert [n.title for n in told] == ["asg:train-spot: scaled 2 -> 3"]
    # The next tick, with an execution id as long and as wide, still decides for every group.
    later = NOW + timedelta(minutes=10)
    assert "failed" not in outcomes(scaler.handle(tick("\U0001d518" * 300, later), later))


def test_an_sns_message_cannot_borrow_another_alarms_arn_or_dimensions(gpu_fleet: Fleet) -> None:
    """#2: an unrelated alarm in ALARM, named in an SNS message carrying the scale-in alarm's ARN and a
    managed group's dimensions, scaled the group in while its own low alarm was OK."""
    cw = gpu_fleet.clients.cloudwatch
    cw.put_metric_alarm(
        AlarmName="billing-high",
        MetricName="EstimatedCharges",
        Namespace="AWS/Billing",
        Statistic="Maximum",
        Period=21600,
        EvaluationPeriods=1,
        Threshold=1000,
        ComparisonOperator="GreaterThanThreshold",
    )
    gpu_fleet.alarm_state("billing-high", "ALARM")
    low_arn = "arn:aws:cloudwatch:us-east-1:123456789012:alarm:gpufleet-train-gpu-low"
    forged = sns_alarm("billing-high", low_arn, {"AutoScalingGroupName": "train-spot"}, NOW)
    gpu_fleet.clients.autoscaling.set_desired_capacity(AutoScalingGroupName="train-spot", DesiredCapacity=4)
    for minute in (1, 2, 3):  # idle nodes: the forged scale-in had victims
        for instance in gpu_fleet.instances():
            gpu_fleet.put_instance_gpu(instance, 0, 1, NOW - timedelta(minutes=minute))
    result = gpu_fleet.scaler(policy=ZERO_COOLDOWNS).handle(sns(forged), NOW)
    [decision] = decisions(result)
    assert decision["action"] == "hold" and "is not gpufleet's" in decision["reason"]
    assert gpu_fleet.desired() == 4


def test_an_alarm_of_another_account_is_refused_even_when_the_policy_maps_its_name(gpu_fleet: Fleet) -> None:
    """#2: the event's account was never compared with the function's."""
    mapped = ZERO_COOLDOWNS + "alarms:\n  - {alarm: partner-gpu-high, group: asg:train-spot, direction: out}\n"
    foreign_arn = "arn:aws:cloudwatch:us-east-1:999988887777:alarm:partner-gpu-high"
    message = sns_alarm("partner-gpu-high", foreign_arn, {}, NOW, account="999988887777")
    refused = r"from account 999988887777 .* but this function serves account 123456789012"
    with pytest.raises(InvalidEvent, match=refused):
        gpu_fleet.scaler(policy=mapped).handle(sns(message), NOW)
    assert gpu_fleet.desired() == 2


def both_paths(gpu_fleet: Fleet, stamp: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The node group's high alarm changing state at `stamp`, by EventBridge and by SNS."""
    via_sns = sample("scaler/sns-alarm-eks-high.json")
    message = json.loads(via_sns["Records"][0]["Sns"]["Message"])
    message["StateChangeTime"] = stamp
    via_sns["Records"][0]["Sns"]["Message"] = json.dumps(message)
    via_eventbridge = sample("scaler/eventbridge-alarm-eks-math.json")
    via_eventbridge["detail"]["alarmName"] = message["AlarmName"]
    via_eventbridge["resources"] = [message["AlarmArn"]]
    via_eventbridge["detail"]["state"]["timestamp"] = stamp
    return via_eventbridge, via_sns


def test_the_same_alarm_change_delivered_by_eventbridge_and_sns_acts_once(gpu_fleet: Fleet) -> None:
    """#6: with cooldowns at 0 (the schema allows it) each delivery path acted."""
    gpu_fleet.alarm_state("gpufleet-infer-gpu-high", "ALARM")
    scaler = gpu_fleet.scaler(policy=ZERO_COOLDOWNS)
    stamp = gpu_fleet.changed_at("gpufleet-infer-gpu-high").strftime(SNS_TIME)
    via_eventbridge, via_sns = both_paths(gpu_fleet, stamp)
    first = outcomes(scaler.handle(via_eventbridge, NOW))
    second = outcomes(scaler.handle(via_sns, NOW + timedelta(seconds=2)))
    assert first == ["applied"] and second == ["applied"]  # the second is the first's answer, replayed
    assert gpu_fleet.nodegroup_desired() == 3


def test_a_forged_sns_delivery_cannot_claim_a_real_changes_second(gpu_fleet: Fleet) -> None:
    """Review of #6: a delivery CloudWatch refused used to store the change's idempotency key for the
    second the sender chose, so the real change in that second was skipped as a duplicate."""
    scaler = gpu_fleet.scaler(policy=ZERO_COOLDOWNS)
    gpu_fleet.alarm_state("gpufleet-infer-gpu-high", "ALARM")  # the real change, at `stamp`...
    stamp = gpu_fleet.changed_at("gpufleet-infer-gpu-high").strftime(SNS_TIME)
    gpu_fleet.alarm_state("gpufleet-infer-gpu-high", "OK")  # ...and back, before its EventBridge event lands
    real, forged = both_paths(gpu_fleet, stamp)
    assert outcomes(scaler.handle(forged, NOW)) == ["not-needed"]  # CloudWatch says OK: refused
    assert outcomes(scaler.handle(real, NOW + timedelta(seconds=5))) == ["applied"]  # not skipped as a duplicate
    assert gpu_fleet.nodegroup_desired() == 3


def test_a_lone_surrogate_in_a_launch_failures_details_is_refused_before_anything_acts(gpu_fleet: Fleet) -> None:
    """#3: the event was accepted, the fallback group raised, then its record could not be serialised."""
    stack = fleet.create_notification_stack(slack_secret=None)
    spot_watch = watch(gpu_fleet, stack.queue_url)
    event = sample("spot_watch/launch-unsuccessful-spot-capacity.json")
    event["detail"]["Details"] = {"Availability Zone": "us-east-1a\ud800", "Subnet ID": "subnet-1\udfff"}
    with pytest.raises(InvalidEvent, match="not valid Unicode in availability_zone"):
        spot_watch.handle(event, NOW)
    assert gpu_fleet.desired("train-ondemand") == 0
    assert fleet.drain(boto3.client("sqs"), stack.queue_url) == []


def test_a_failed_record_in_a_warm_container_never_clears_another_invocations_outbox(gpu_fleet: Fleet) -> None:
    """#9: groups committed by an invocation that raised before recording stayed in the executor, and
    the next invocation in the same container cleared their outbox though nobody had been told."""
    stack = fleet.create_notification_stack(slack_secret=None)
    scaler = gpu_fleet.scaler(notify_queue=stack.queue_url)
    dynamodb = scaler.ctx.executor.audit.dynamodb
    failures = iter([ClientError({"Error": {"Code": "InternalServerError", "Message": "injected"}}, "BatchWriteItem")])

    def fail_once(**_: Any) -> None:
        if (exc := next(failures, None)) is not None:
            raise exc

    dynamodb.meta.events.register("before-call.dynamodb.BatchWriteItem", fail_once)
    with pytest.raises(ClientError, match="injected"):
        scaler.handle(sample("scaler/eventbridge-alarm-asg-high.json"), NOW)  # train-spot 2 -> 3, not recorded
    gpu_fleet.alarm_state("gpufleet-infer-gpu-high", "ALARM")
    scaler.handle(sample("scaler/sns-alarm-eks-high.json"), NOW + timedelta(seconds=5))  # the same warm scaler
    state = StateStore(gpu_fleet.clients.dynamodb, TABLE).load(["asg:train-spot"])["asg:train-spot"]
    assert len(state.outbox) == 1  # still owed: audited and told by the next invocation that reads it
    later = NOW + timedelta(minutes=1)
    scaler.handle(tick("after", later), later)
    told = [n.title for n in queued(stack.queue_url)]
    assert "asg:train-spot: scaled 2 -> 3" in told


def test_a_decision_record_dynamodb_refuses_is_parked_told_once_and_blocks_nothing(gpu_fleet: Fleet) -> None:
    """Isolation: a record DynamoDB refuses for good (ValidationException) used to fail the invocation
    after the change, then every flush of the group's outbox and every tick. Now it is parked with its
    reason, counted and told once, and the group and the others go on."""
    stack = fleet.create_notification_stack(slack_secret=None)
    scaler = gpu_fleet.scaler(notify_queue=stack.queue_url)

    def refuse_train_spot_records(params: dict[str, Any], **_: Any) -> None:
        for request in params["RequestItems"].get(TABLE, []):
            item = request["PutRequest"]["Item"]
            if item["sk"]["S"].startswith("DECISION#") and "train-spot" in item["pk"]["S"]:
                error = {"Code": "ValidationException", "Message": "Item size has exceeded the maximum allowed size"}
                raise ClientError({"Error": error}, "BatchWriteItem")

    scaler.ctx.executor.audit.dynamodb.meta.events.register(
        "provide-client-params.dynamodb.BatchWriteItem", refuse_train_spot_records
    )
    assert outcomes(scaler.handle(sample("scaler/eventbridge-alarm-asg-high.json"), NOW)) == ["applied"]
    state = StateStore(gpu_fleet.clients.dynamodb, TABLE).load(["asg:train-spot"])["asg:train-spot"]
    assert state.outbox == ()  # nothing left to block the next read
    parked = gpu_fleet.clients.dynamodb.query(
        TableName=TABLE,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
        ExpressionAttributeValues={":pk": {"S": "GROUP#asg:train-spot"}, ":p": {"S": "PARKED#"}},
    )["Items"]
    assert len(parked) == 1 and "maximum allowed size" in parked[0]["reason"]["S"]
    told = queued(stack.queue_url)
    assert sorted(n.title for n in told) == [
        "asg:train-spot: a decision record could not be stored and was parked",
        "asg:train-spot: scaled 2 -> 3",
    ]
    later = NOW + timedelta(minutes=1)
    assert "failed" not in outcomes(scaler.handle(tick("after-parking", later), later))
