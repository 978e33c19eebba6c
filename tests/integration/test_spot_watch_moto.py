"""spot_watch against moto server. moto never fails a launch: failed activities are INJECTED into moto's
Auto Scaling backend (rehearsal.moto_ext) and undeliverable instances are held out of service (Standby),
both labelled emulation; everything else is the real code over HTTP."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aws_lambda_powertools import Logger, Metrics

from gpufleet.capacity.service import SpotWatch
from gpufleet.domain import defaults
from gpufleet.domain.notification import IncidentState
from gpufleet.runtime import build_spot_watch
from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet, count_calls, queued

NOW = datetime.now(UTC).replace(microsecond=0)
EVENTS = Path(__file__).resolve().parents[2] / "events" / "spot_watch"
SPOT_FULL = (
    "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to your request "
    "configuration. Please adjust your request and try again. Launching EC2 instance failed."
)
QUOTA = (
    "You have requested more vCPU capacity than your current vCPU limit of 96 allows for the instance bucket "
    "that the specified instance type belongs to. Launching EC2 instance failed."
)
POLICY = """
defaults: {scale_out_cooldown_s: 60, scale_in_cooldown_s: 60}
spot:
  groups:
    - group: asg:train-spot
      fallback: {group: asg:train-ondemand, wait_minutes: 5}
  prices:
    on_demand: {g5.12xlarge: 5.672}
    spot: {g5.12xlarge: 2.10}
"""


def watch(gpu_fleet: Fleet, queue: str) -> SpotWatch:
    gpu_fleet.policy_path.write_text(POLICY)
    fleet.create_asg(gpu_fleet.clients, "train-ondemand", min_size=0, max_size=3, desired=0, tags=fleet.MANAGED_TAG)
    env = {
        defaults.ENV_STATE_TABLE: TABLE,
        defaults.ENV_POLICY_FILE: str(gpu_fleet.policy_path),
        defaults.ENV_NOTIFY_QUEUE_URL: queue,
    }
    return build_spot_watch(Logger(service="test"), Metrics(namespace="GPUFleet/Test"), env=env)


def spot_outage(gpu_fleet: Fleet, wanted: int) -> list[str]:
    """The scaler raised train-spot to `wanted`; EC2 has no spot capacity for the new instances."""
    before = set(gpu_fleet.instances())
    gpu_fleet.clients.autoscaling.set_desired_capacity(AutoScalingGroupName="train-spot", DesiredCapacity=wanted)
    new = sorted(set(gpu_fleet.instances()) - before)
    fleet.hold_out_of_service(gpu_fleet.clients.autoscaling, "train-spot", new)
    return new


def test_fallback_after_the_wait_then_capacity_returns_to_spot(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    w = watch(gpu_fleet, stack.queue_url)
    spot_outage(gpu_fleet, 5)  # 2 in service, 3 held
    activity = fleet.inject_failed_launch(gpu_fleet.endpoint, "train-spot", NOW - timedelta(minutes=1), SPOT_FULL)
    # The event and the sweep both see the activity: one failure.
    event = json.loads((EVENTS / "launch-unsuccessful-spot-capacity.json").read_text())
    event["detail"].update(ActivityId=activity, StartTime=(NOW - timedelta(minutes=1)).isoformat())
    first = w.handle(event, NOW)["results"][0]["groups"][0]
    assert [f["class"] for f in first["new_failures"]] == ["spot-capacity"]
    swept = w.sweep(NOW + timedelta(seconds=30), "tick-1")["groups"]
    spot = next(g for g in swept if g["group"] == "asg:train-spot")
    assert spot["new_failures"] == [] and spot["unavailable"] == ["g5.12xlarge/us-east-1a/spot"]
    assert "fallback in" in spot["fallback"]["reason"], spot["fallback"]
    [warning] = queued(stack.queue_url)
    assert warning.incident_key == "asg:train-spot|capacity" and "spot-capacity" in warning.title
    assert "add instance types and AZs" in warning.facts["fix"]
    # Still failing after the bounded wait: the on-demand group covers what spot cannot deliver.
    later = NOW + timedelta(minutes=6)
    fleet.inject_failed_launch(gpu_fleet.endpoint, "train-spot", later - timedelta(seconds=20), SPOT_FULL)
    spot = next(g for g in w.sweep(later, "tick-2")["groups"] if g["group"] == "asg:train-spot")
    assert spot["fallback_action"]["outcome"] == "applied"
    assert _desired(gpu_fleet, "train-ondemand") == 3  # unfulfilled 3, within its max 3
    fallback_note = next(n for n in queued(stack.queue_url) if "fell back" in n.title)
    assert fallback_note.facts["cost"] == "+$10.72/h vs spot (g5.12xlarge)"
    # Spot recovers: held instances come into service; the fallback is handed back, idle nodes only.
    fleet.deliver_held(gpu_fleet.clients.autoscaling, "train-spot")
    recovered_at = later + timedelta(minutes=2)
    busy, *idle = gpu_fleet.instances("train-ondemand")
    for minute in (1, 2, 3):
        at = recovered_at - timedelta(minutes=minute)
        gpu_fleet.put_instance_gpu(busy, 90, 70, at)
        for iid in idle:
            gpu_fleet.put_instance_gpu(iid, 0, 1, at)
    spot = next(g for g in w.sweep(recovered_at, "tick-3")["groups"] if g["group"] == "asg:train-spot")
    assert "hand back 3 of 3" in spot["fallback"]["reason"], (spot["fallback"], spot["fallback_action"])
    assert sorted(spot["fallback_action"]["victims"]) == sorted(idle)  # the busy node stays for now
    assert _desired(gpu_fleet, "train-ondemand") == 1
    for minute in (1, 2, 3):  # its job finishes
        gpu_fleet.put_instance_gpu(busy, 0, 1, recovered_at + timedelta(minutes=5 - minute))
    spot = next(
        g for g in w.sweep(recovered_at + timedelta(minutes=5), "tick-4")["groups"] if g["group"] == "asg:train-spot"
    )
    assert spot["fallback_action"]["victims"] == [busy]
    assert _desired(gpu_fleet, "train-ondemand") == 0, (
        spot["fallback_action"]["outcome"] + spot["fallback_action"]["detail"]
    )
    notes = queued(stack.queue_url)
    assert any("handing capacity back" in n.title for n in notes)
    assert any(n.state is IncidentState.RESOLVED and "recovered" in n.title for n in notes)
    assert {n.incident_key for n in notes} == {"asg:train-spot|capacity"}  # one story


def test_quota_errors_never_fall_back_and_say_how_to_fix(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    w = watch(gpu_fleet, stack.queue_url)
    spot_outage(gpu_fleet, 4)
    for minutes in (10, 5, 1):
        fleet.inject_failed_launch(gpu_fleet.endpoint, "train-spot", NOW - timedelta(minutes=minutes), QUOTA)
    spot = next(g for g in w.sweep(NOW, "tick-1")["groups"] if g["group"] == "asg:train-spot")
    assert [f["class"] for f in spot["new_failures"]] == ["quota"] * 3
    assert "no fallback" in spot["fallback"]["reason"] and spot["fallback_action"] is None
    assert _desired(gpu_fleet, "train-ondemand") == 0
    [note] = queued(stack.queue_url)
    assert str(note.severity) == "critical" and "Service Quotas" in note.facts["fix"]


def test_sweep_reads_only_groups_short_of_capacity_and_only_new_activities(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    w = watch(gpu_fleet, stack.queue_url)
    calls = count_calls(w.activities.autoscaling, w.ctx.state.dynamodb)
    w.sweep(NOW, "tick-1")
    assert calls["autoscaling:DescribeScalingActivities"] == 0  # every group has its capacity in service
    # Two reads: the spot documents, and the groups' states (early replacements owed after interruptions).
    assert calls["dynamodb:BatchGetItem"] == 2 and calls["dynamodb:PutItem"] == 0
    spot_outage(gpu_fleet, 3)  # now train-spot is one short
    fleet.inject_failed_launch(gpu_fleet.endpoint, "train-spot", NOW + timedelta(seconds=10), SPOT_FULL)
    result = w.sweep(NOW + timedelta(minutes=1), "tick-2")
    assert sum(len(g["new_failures"]) for g in result["groups"]) == 1
    again = w.sweep(NOW + timedelta(minutes=2), "tick-3")
    assert sum(len(g["new_failures"]) for g in again["groups"]) == 0
    assert calls["autoscaling:DescribeScalingActivities"] == 2  # train-spot only, in the two later sweeps


def _desired(gpu_fleet: Fleet, asg: str) -> int:
    return gpu_fleet.desired(asg)


def test_the_hand_back_never_takes_a_fallback_runner_that_holds_a_job(gpu_fleet: Fleet) -> None:
    """Issue 28 (found by the probe): the spot fallback's hand-back decided on the fallback group without
    its demand, so on-demand runners holding queue jobs (GPUs idle while they download) were handed back.
    The same group read with its queue keeps the node its in-flight job holds."""
    import boto3

    stack = fleet.create_notification_stack(slack_secret=None)
    w = watch(gpu_fleet, stack.queue_url)
    sqs = boto3.client("sqs")
    jobs = sqs.create_queue(QueueName="train-jobs")["QueueUrl"]
    gpu_fleet.policy_path.write_text(
        POLICY
        + f"""groups:
  - {{name: train-ondemand, kind: asg, demand: {{sqs: {{queue_url: "{jobs}", gpus_per_message: 4}}, gpus_per_node: 4}},
     target: {{enabled: false}}}}
"""
    )
    spot_outage(gpu_fleet, 5)
    fleet.inject_failed_launch(gpu_fleet.endpoint, "train-spot", NOW - timedelta(minutes=1), SPOT_FULL)
    w.sweep(NOW, "tick-1")
    later = NOW + timedelta(minutes=6)
    fleet.inject_failed_launch(gpu_fleet.endpoint, "train-spot", later - timedelta(seconds=20), SPOT_FULL)
    w.sweep(later, "tick-2")
    assert _desired(gpu_fleet, "train-ondemand") == 3
    sqs.send_message(QueueUrl=jobs, MessageBody="job")
    sqs.receive_message(QueueUrl=jobs, VisibilityTimeout=3600)  # a runner took it: in flight
    fleet.deliver_held(gpu_fleet.clients.autoscaling, "train-spot")
    recovered_at = later + timedelta(minutes=2)
    for iid in gpu_fleet.instances("train-ondemand"):  # every GPU idle: the runner is downloading
        for minute in (1, 2, 3):
            gpu_fleet.put_instance_gpu(iid, 0, 1, recovered_at - timedelta(minutes=minute))
    spot = next(g for g in w.sweep(recovered_at, "tick-3")["groups"] if g["group"] == "asg:train-spot")
    assert len(spot["fallback_action"]["victims"]) == 2, spot["fallback_action"]
    assert _desired(gpu_fleet, "train-ondemand") == 1  # the node the in-flight job holds stays
