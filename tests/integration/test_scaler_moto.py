"""The scaler against moto server over HTTP: real boto3 calls, real DynamoDB conditional writes."""

from __future__ import annotations

import json
import math
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpufleet.aws.audit import AuditLog
from gpufleet.aws.state import StateStore
from gpufleet.domain import defaults
from gpufleet.domain.models import Action, Decision, Outcome, Trigger, TriggerKind
from gpufleet.domain.notification import IncidentState
from gpufleet.policy.fleet import PolicyError
from rehearsal import fleet
from tests.integration.conftest import EVENTS, NOW, TABLE, Fleet, count_calls, decisions, queued, sample


def event(name: str, **changes: Any) -> dict[str, Any]:
    """The scaler's sample event `name`, its top-level fields changed."""
    body = sample(f"scaler/{name}")
    body.update(changes)
    return body


def eks_low_alarm_on_one_idle_node(on: Fleet, backing: str, event_id: str) -> tuple[dict[str, Any], str, str]:
    """ml/infer-gpu's two nodes, one busy and one idle for 3 minutes, and its low alarm delivered by
    EventBridge: the scaler's decision, and the busy and idle instance ids."""
    dims = {"ClusterName": "ml", "NodegroupName": "infer-gpu"}
    fleet.put_gpu_alarm(
        on.clients.cloudwatch, "gpufleet-infer-gpu-low", dims, direction="in", threshold=20, evaluation_periods=1
    )
    busy, idle = on.instances(backing)
    for minute in range(3):
        on.put_instance_gpu(busy, 90, 70, NOW - timedelta(minutes=minute + 1))
        on.put_instance_gpu(idle, 0, 1, NOW - timedelta(minutes=minute + 1))
    low = event(
        "eventbridge-alarm-eks-math.json",
        id=event_id,
        resources=["arn:aws:cloudwatch:us-east-1:123456789012:alarm:gpufleet-infer-gpu-low"],
    )
    low["detail"]["alarmName"] = "gpufleet-infer-gpu-low"
    (d,) = decisions(on.scaler().handle(low, NOW))
    return d, busy, idle


def state_change(name: str, event_id: str, at: datetime) -> dict[str, Any]:
    """Another state change of the sample's alarm (a new change, not the same one delivered again)."""
    body = event(name, id=event_id)
    body["detail"]["state"]["timestamp"] = at.isoformat()
    return body


def test_alarm_scales_out_an_asg_once_per_event(gpu_fleet: Fleet) -> None:
    scaler = gpu_fleet.scaler()
    (d,) = decisions(scaler.handle(event("eventbridge-alarm-asg-high.json"), NOW))
    assert (d["action"], d["outcome"], d["current"], d["desired"]) == ("scale-out", "applied", 2, 3)
    assert "group asg:train-spot from metric dimensions; direction out from alarm tag" in d["reason"]
    assert gpu_fleet.desired() == 3
    # EventBridge delivers at least once: the same event id changes nothing more.
    again = decisions(scaler.handle(event("eventbridge-alarm-asg-high.json"), NOW + timedelta(seconds=5)))
    assert again == [d]
    assert gpu_fleet.desired() == 3
    # A new state change inside the cooldown is decided, recorded, and holds.
    later = NOW + timedelta(seconds=60)
    (held,) = decisions(scaler.handle(state_change("eventbridge-alarm-asg-high.json", "other", later), later))
    assert held["action"] == "hold" and "cooldown has 240s left" in held["reason"]
    audit = AuditLog(gpu_fleet.clients.dynamodb, TABLE).recent("asg:train-spot")
    assert [a.outcome for a in audit] == [Outcome.NOT_NEEDED, Outcome.APPLIED]


def test_scaler_tells_on_call_what_it_did_and_when_the_alarm_clears(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    scaler = gpu_fleet.scaler(notify_queue=stack.queue_url)
    scaler.handle(event("eventbridge-alarm-asg-high.json"), NOW)
    scaler.handle(event("eventbridge-alarm-asg-ok.json"), NOW + timedelta(minutes=5))
    sent = queued(stack.queue_url)
    assert [(n.title, n.state) for n in sent] == [
        ("asg:train-spot: scaled 2 -> 3", IncidentState.FIRING),
        ("asg:train-spot: gpufleet-train-gpu-high is OK again", IncidentState.RESOLVED),
    ]
    assert sent[0].incident_key == sent[1].incident_key  # one story
    assert "scale out 2 -> 3" in sent[0].reason
    assert any("AutoScalingGroupDetails:id=train-spot" in link.url for link in sent[0].links)


def test_dry_run_notifies_would_scale(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    gpu_fleet.scaler(dry_run=True, notify_queue=stack.queue_url).handle(event("eventbridge-alarm-asg-high.json"), NOW)
    [sent] = [json.loads(m["Body"]) for m in fleet.drain(boto3.client("sqs"), stack.queue_url)]
    assert sent["title"] == "asg:train-spot: would scale (dry-run) 2 -> 3"
    assert gpu_fleet.desired() == 2


def test_scale_in_terminates_only_idle_instances(gpu_fleet: Fleet) -> None:
    gpu_fleet.clients.autoscaling.set_desired_capacity(AutoScalingGroupName="train-spot", DesiredCapacity=4)
    busy_a, busy_b, idle_a, idle_b = gpu_fleet.instances()
    for minute in range(3):
        at = NOW - timedelta(minutes=minute + 1)
        gpu_fleet.put_instance_gpu(busy_a, 97, 80, at)
        gpu_fleet.put_instance_gpu(busy_b, 3 if minute else 60, 70, at)  # one busy minute keeps it
        gpu_fleet.put_instance_gpu(idle_a, 0, 1, at)
        gpu_fleet.put_instance_gpu(idle_b, 2, 3, at)
    gpu_fleet.alarm_state("gpufleet-train-gpu-low", "ALARM")  # an alarm action is acted on as CloudWatch says
    (d,) = decisions(gpu_fleet.scaler().handle(event("alarm-action-asg-low.json"), NOW))
    assert (d["action"], d["outcome"], d["desired"]) == ("scale-in", "applied", 2)
    assert sorted(d["victims"]) == sorted([idle_a, idle_b])
    assert gpu_fleet.desired() == 2
    assert gpu_fleet.instances() == sorted([busy_a, busy_b])


def _asg_tags(gpu_fleet: Fleet, name: str) -> dict[str, str]:
    (group,) = gpu_fleet.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
        "AutoScalingGroups"
    ]
    return {t["Key"]: t["Value"] for t in group["Tags"]}


def test_eks_scale_in_with_the_backing_asg_tagged_as_eks_tags_it(gpu_fleet: Fleet) -> None:
    """EKS tags a node group's ASG eks:* and k8s.io/cluster-autoscaler/*, never with the node group's own
    tags. gpufleet adopts it (adds gpufleet:managed=true, the only tag its role may add) before removing an
    idle node through it; an untagged ASG and another node group's ASG stay untouched."""
    backing = gpu_fleet.backing_asg
    assert _asg_tags(gpu_fleet, backing) == fleet.eks_backing_asg_tags("ml", "infer-gpu")
    fleet.create_asg(gpu_fleet.clients, "someone-elses", min_size=0, max_size=4, desired=1)
    other = fleet.create_nodegroup(gpu_fleet.clients, "ml", "not-ours", min_size=1, max_size=3, desired=2, tags={})
    d, busy, idle = eks_low_alarm_on_one_idle_node(gpu_fleet, backing, "eks-low")
    assert (d["group"], d["action"], d["outcome"], d["victims"]) == ("eks:ml/infer-gpu", "scale-in", "applied", [idle])
    assert gpu_fleet.instances(backing) == [busy] and gpu_fleet.nodegroup_desired() == 1
    assert _asg_tags(gpu_fleet, backing)["gpufleet:managed"] == "true"
    assert "gpufleet:managed" not in _asg_tags(gpu_fleet, "someone-elses")
    assert "gpufleet:managed" not in _asg_tags(gpu_fleet, other)


def test_the_controller_refuses_to_change_a_group_without_the_managed_tag(gpu_fleet: Fleet) -> None:
    """Defence in depth beside IAM: a policy rule may name an untagged group (observed, never changed)."""
    fleet.create_asg(gpu_fleet.clients, "named-not-tagged", min_size=0, max_size=4, desired=1)
    scaler = gpu_fleet.scaler(policy="groups: [{name: named-not-tagged, kind: asg, min: 2}]\n")
    result = scaler.handle(
        {"gpufleet": "reconcile", "execution_id": "r1", "scheduled_time": "2026-11-23T08:12:00Z"}, NOW
    )
    (d,) = [x for x in decisions(result) if x["group"] == "asg:named-not-tagged"]
    assert d["action"] == "hold" and "is not tagged gpufleet:managed=true" in d["detail"]
    assert gpu_fleet.desired("named-not-tagged") == 1


def test_scale_in_without_gpu_metrics_terminates_nothing(gpu_fleet: Fleet) -> None:
    gpu_fleet.alarm_state("gpufleet-train-gpu-low", "ALARM")  # an alarm action is acted on as CloudWatch says
    (d,) = decisions(gpu_fleet.scaler().handle(event("alarm-action-asg-low.json"), NOW))
    assert d["action"] == "hold" and "2 without GPU metrics" in d["reason"]
    assert gpu_fleet.desired() == 2


def test_sns_alarm_scales_an_eks_nodegroup(gpu_fleet: Fleet) -> None:
    cw = gpu_fleet.clients.cloudwatch
    cw.set_alarm_state(AlarmName="gpufleet-infer-gpu-high", StateValue="ALARM", StateReason="test")
    (d,) = decisions(gpu_fleet.scaler().handle(event("sns-alarm-eks-high.json"), NOW))
    assert (d["group"], d["outcome"], d["desired"]) == ("eks:ml/infer-gpu", "applied", 3)
    assert "UpdateNodegroupConfig ml/infer-gpu desiredSize = 3" in d["detail"]
    assert gpu_fleet.nodegroup_desired() == 3


@pytest.mark.parametrize(("state", "enabled"), [("OK", True), ("ALARM", False)])
def test_an_sns_alarm_is_confirmed_with_describe_alarms_before_acting(
    gpu_fleet: Fleet, state: str, enabled: bool
) -> None:
    """SNS deliveries are not proof: the alarm must still be in ALARM with its actions enabled."""
    cw = gpu_fleet.clients.cloudwatch
    cw.set_alarm_state(AlarmName="gpufleet-infer-gpu-high", StateValue=state, StateReason="test")
    if not enabled:
        cw.disable_alarm_actions(AlarmNames=["gpufleet-infer-gpu-high"])
    (d,) = decisions(gpu_fleet.scaler().handle(event("sns-alarm-eks-high.json"), NOW))
    assert d["action"] == "hold" and "delivered by SNS is" in d["reason"] and "no action" in d["reason"]
    assert gpu_fleet.nodegroup_desired() == 2


def test_dry_run_decides_and_records_but_changes_nothing(gpu_fleet: Fleet) -> None:
    (d,) = decisions(gpu_fleet.scaler(dry_run=True).handle(event("eventbridge-alarm-asg-high.json"), NOW))
    assert (d["action"], d["outcome"], d["desired"]) == ("scale-out", "dry-run", 3)
    assert gpu_fleet.desired() == 2
    (audited,) = AuditLog(gpu_fleet.clients.dynamodb, TABLE).recent("asg:train-spot")
    assert audited.outcome is Outcome.DRY_RUN


def test_concurrent_invocations_make_one_change(gpu_fleet: Fleet) -> None:
    scalers = [gpu_fleet.scaler() for _ in range(4)]
    barrier = threading.Barrier(len(scalers))
    results: list[dict[str, Any]] = []

    def run(i: int) -> None:
        barrier.wait()
        change = state_change("eventbridge-alarm-asg-high.json", f"dup-{i}", NOW + timedelta(seconds=i))
        results.extend(decisions(scalers[i].handle(change, NOW)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(scalers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes.count("applied") == 1, outcomes
    assert set(outcomes) <= {"applied", "skipped-lease", "not-needed"}
    assert gpu_fleet.desired() == 3


def _change(event_id: str, at: datetime) -> Decision:
    return Decision(
        group="asg:x",
        action=Action.SCALE_OUT,
        current=1,
        desired=2,
        reason="r",
        trigger=Trigger(kind=TriggerKind.ALARM, name="a"),
        event_id=event_id,
        at=at,
    )


def test_lease_intent_and_version_make_one_change(gpu_fleet: Fleet) -> None:
    store = StateStore(gpu_fleet.clients.dynamodb, TABLE)
    assert store.begin(_change("e1", NOW), "e1#a", 0)
    assert not store.begin(_change("e2", NOW), "e2#b", 0)  # leased, and a change is in progress
    (state,) = store.load(["asg:x"]).values()
    assert state.intent is not None and state.intent.event_id == "e1" and state.intent_attempts == 1
    assert not store.take_over("asg:x", "e2#c", "e2", NOW + timedelta(seconds=30))  # someone else, lease held
    assert store.take_over("asg:x", "e1#d", "e1", NOW + timedelta(seconds=30))  # a retry of the same event
    late = NOW + timedelta(seconds=defaults.LEASE_SECONDS + 31)
    assert store.take_over("asg:x", "e3#e", "e3", late)  # the lease expired: anyone finishes it
    assert not store.commit("e1#d", _change("e1", NOW))  # the lease was taken over: no double commit
    assert store.commit("e3#e", _change("e1", NOW).model_copy(update={"outcome": Outcome.APPLIED}))
    (state,) = store.load(["asg:x"]).values()
    assert (state.version, state.intent, state.lease_owner, len(state.outbox)) == (1, None, None, 1)
    assert state.last_scale_out_at == NOW
    assert not store.begin(_change("e4", NOW), "e4#f", 0)  # read before the change: stale version
    assert store.clear_outbox("asg:x", 1) and store.begin(_change("e4", NOW), "e4#f", 1)


def test_lease_outlives_the_function_timeout() -> None:
    """A slow apply must never let a second invocation take the lease while the first still runs."""
    from samtranslator.yaml_helper import yaml_parse

    template = yaml_parse((EVENTS.parent / "template.yaml").read_text())
    assert int(template["Globals"]["Function"]["Timeout"]) < defaults.LEASE_SECONDS


def test_unresolvable_alarms_and_unknown_groups_change_nothing(gpu_fleet: Fleet) -> None:
    scaler = gpu_fleet.scaler()
    (d,) = decisions(scaler.handle(event("eventbridge-alarm-composite.json"), NOW))
    assert d["group"] == "unresolved" and "composite alarm" in d["reason"]
    unknown = event("eventbridge-alarm-asg-high.json", id="unknown-group")
    unknown["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = {
        "AutoScalingGroupName": "no-such-group"
    }
    (d,) = decisions(scaler.handle(unknown, NOW))
    assert "group asg:no-such-group not found" in d["reason"]
    assert gpu_fleet.desired() == 2


def test_untagged_group_is_not_managed(gpu_fleet: Fleet) -> None:
    fleet.create_asg(gpu_fleet.clients, "untagged", min_size=0, max_size=4, desired=1)
    ev = event("eventbridge-alarm-asg-high.json", id="untagged")
    ev["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = {
        "AutoScalingGroupName": "untagged"
    }
    (d,) = decisions(gpu_fleet.scaler().handle(ev, NOW))
    assert "is not managed" in d["reason"]
    assert gpu_fleet.desired("untagged") == 1


def test_a_broken_policy_changes_nothing(gpu_fleet: Fleet) -> None:
    scaler = gpu_fleet.scaler(policy="defaults: {scale_out_step: lots}")
    with pytest.raises(PolicyError, match=r"defaults\.scale_out_step"):
        scaler.handle(event("eventbridge-alarm-asg-high.json"), NOW)
    assert gpu_fleet.desired() == 2


def test_firing_alarm_acts_again_at_reconcile_after_cooldown(gpu_fleet: Fleet) -> None:
    cw = gpu_fleet.clients.cloudwatch
    cw.set_alarm_state(AlarmName="gpufleet-train-gpu-high", StateValue="ALARM", StateReason="test")
    scaler = gpu_fleet.scaler(policy="defaults: {target: {enabled: false}}")
    tick = {"gpufleet": "reconcile", "execution_id": "t1", "scheduled_time": "2026-11-23T08:12:00Z"}
    first = [d for d in decisions(scaler.handle(tick, NOW)) if d["group"] == "asg:train-spot"]
    assert first[0]["outcome"] == "applied" and first[0]["trigger"] == "alarm:gpufleet-train-gpu-high"
    soon = decisions(scaler.handle(dict(tick, execution_id="t2"), NOW + timedelta(minutes=1)))
    assert "cooldown" in next(d for d in soon if d["group"] == "asg:train-spot")["reason"]
    later = decisions(scaler.handle(dict(tick, execution_id="t3"), NOW + timedelta(minutes=6)))
    assert next(d for d in later if d["group"] == "asg:train-spot")["outcome"] == "applied"
    assert gpu_fleet.desired() == 4


@pytest.mark.parametrize("groups", [250, 620])
def test_reconcile_batches_its_reads(aws: str, tmp_path: Path, groups: int) -> None:
    """API calls per reconcile: ceil(series/500) GetMetricData + ceil(groups/100) describes."""
    from tests.integration.conftest import Fleet

    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_busy_asg_fleet(clients, groups, gpus=1, at=NOW - timedelta(minutes=1))
    policy = tmp_path / "p.yaml"
    policy.write_text("discovery: {eks: false}")
    scaler = Fleet(clients, policy, aws, "").scaler()
    calls = count_calls(
        scaler.ctx.fleet.autoscaling, scaler.metrics.cloudwatch, scaler.ctx.state.dynamodb, scaler.ctx.fleet.eks
    )
    result = scaler.handle(
        {"gpufleet": "reconcile", "execution_id": f"b{groups}", "scheduled_time": "2026-11-23T08:12:00Z"}, NOW
    )
    ds = decisions(result)
    assert len(ds) == groups
    assert all(d["action"] == Action.HOLD and "inside the band" in d["reason"] for d in ds)
    assert calls["cloudwatch:GetMetricData"] == math.ceil(groups / 500)
    assert calls["autoscaling:DescribeAutoScalingGroups"] == math.ceil(groups / 100)
    assert calls["autoscaling:SetDesiredCapacity"] == 0
    assert calls["dynamodb:BatchGetItem"] == math.ceil(groups / 100)


def test_an_alarm_whose_group_does_not_exist_warns_on_call_once_and_closes_when_ok(gpu_fleet: Fleet) -> None:
    """Issue 23: `hold not-needed ... group asg:ghost-gpu not found` used to exit 0 and tell nobody."""
    stack = fleet.create_notification_stack(slack_secret=None)
    scaler = gpu_fleet.scaler(notify_queue=stack.queue_url)

    def ghost(event_id: str, at: datetime, state: str = "ALARM") -> dict[str, Any]:
        body = state_change("eventbridge-alarm-asg-high.json", event_id, at)
        body["detail"]["state"]["value"] = state
        body["detail"]["previousState"]["value"] = "ALARM" if state == "OK" else "OK"
        body["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = {
            "AutoScalingGroupName": "ghost-gpu"
        }
        return body

    (d,) = decisions(scaler.handle(ghost("g-1", NOW), NOW))
    assert d["action"] == "hold" and "group asg:ghost-gpu not found" in d["reason"]
    scaler.handle(ghost("g-2", NOW + timedelta(minutes=5)), NOW + timedelta(minutes=5))  # delivered again
    scaler.handle(ghost("g-3", NOW + timedelta(minutes=9), "OK"), NOW + timedelta(minutes=9))
    sent = queued(stack.queue_url)
    warnings = [n for n in sent if n.state is IncidentState.FIRING]
    assert {n.notification_id for n in warnings} == {warnings[0].notification_id}  # folds into one post
    assert (
        warnings[0].severity == "warning" and warnings[0].title == "alarm gpufleet-train-gpu-high cannot scale anything"
    )
    assert "Fix the alarm's dimensions" in warnings[0].reason
    [closed] = [n for n in sent if n.state is IncidentState.RESOLVED]
    assert closed.incident_key == warnings[0].incident_key
    assert gpu_fleet.desired() == 2
