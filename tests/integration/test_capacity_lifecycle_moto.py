"""Capacity going away, through `gpufleet invoke spot_watch` on moto server: a spot interruption warning
for a busy node (its replacement launched early, handed back once EC2 has the node), rebalance
recommendations, a Capacity Block ending. moto sends none of these events and reclaims no spot instance:
the events are AWS's documented shapes with this fleet's ids, and the reclaim is EMULATED by marking the
instance Unhealthy, as Auto Scaling's health check does after EC2 takes a spot instance."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger, Metrics

from gpufleet.capacity.notes import capacity_block_note
from gpufleet.domain import defaults
from gpufleet.events.model import CapacityBlockEvent
from gpufleet.runtime import build_spot_watch
from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet, queued
from tests.integration.test_invoke_events import ROOT, invoke_function

EVENTS = ROOT / "events" / "spot_watch"
PRELAUNCH = """
defaults: {scale_out_cooldown_s: 600, scale_in_cooldown_s: 600}
spot: {interruptions: {on_interruption: prelaunch, on_rebalance: notify}}
"""
RESERVATION = "cr-0123456789abcdef0"


def event_for(name: str, tmp_path: Path, **detail: str) -> Path:
    doc: dict[str, Any] = json.loads((EVENTS / name).read_text())
    doc["detail"].update(detail)
    doc["time"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def run(gpu_fleet: Fleet, event: Path, queue: str) -> dict[str, Any]:
    proc = invoke_function("spot_watch", gpu_fleet, event, extra_env={defaults.ENV_NOTIFY_QUEUE_URL: queue})
    assert proc.returncode == 0, proc.stderr
    [result] = json.loads(proc.stdout[proc.stdout.index('{\n  "results"') :])["results"]
    return dict(result)


def busy(gpu_fleet: Fleet, *instances: str) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    for minute in range(1, 4):
        for iid in instances:
            gpu_fleet.put_instance_gpu(iid, 91, 72, now - timedelta(minutes=minute))


def test_interruption_of_a_busy_node_joins_the_incident_launches_early_and_hands_back(
    gpu_fleet: Fleet, tmp_path: Path
) -> None:
    queue = fleet.create_notification_stack(slack_secret=None).queue_url
    gpu_fleet.policy_path.write_text(PRELAUNCH)
    doomed, other = gpu_fleet.instances()
    busy(gpu_fleet, doomed, other)
    warning = event_for("spot-interruption-warning.json", tmp_path, **{"instance-id": doomed})

    result = run(gpu_fleet, warning, queue)
    assert result["group"] == "asg:train-spot" and result["gpu"]["utilization"] == 91
    assert gpu_fleet.desired() == 3  # the replacement launches now, not after the node is gone
    [told] = queued(queue)
    assert told.kind == "interruption" and told.severity == "warning"
    assert told.incident_key == "asg:train-spot|capacity"
    assert told.facts["GPUs"].startswith("busy: GPU 91% util, 72% memory")
    assert told.facts["replacement"].startswith("launched: 2 -> 3")

    run(gpu_fleet, warning, queue)  # EventBridge delivers at least once: no second replacement
    assert gpu_fleet.desired() == 3

    sweep = run(gpu_fleet, EVENTS / "scheduler-sweep.json", queue)
    assert sweep["handed_back"] == [] and gpu_fleet.desired() == 3  # still running: nothing given back

    # [emulated] EC2 reclaims the spot instance; Auto Scaling's health check marks it Unhealthy.
    gpu_fleet.clients.autoscaling.set_instance_health(InstanceId=doomed, HealthStatus="Unhealthy")
    sweep = run(gpu_fleet, EVENTS / "scheduler-sweep.json", queue)
    [back] = sweep["handed_back"]
    assert back["instance"] == doomed and back["outcome"] == "applied"
    assert gpu_fleet.desired() == 2 and doomed not in gpu_fleet.instances()  # no second replacement
    assert any(n.title.startswith(f"asg:train-spot: {doomed} is gone") for n in queued(queue))
    assert run(gpu_fleet, EVENTS / "scheduler-sweep.json", queue)["handed_back"] == []  # once


def test_interruption_at_max_only_tells(gpu_fleet: Fleet, tmp_path: Path) -> None:
    queue = fleet.create_notification_stack(slack_secret=None).queue_url
    gpu_fleet.policy_path.write_text(PRELAUNCH.replace("defaults: {", "defaults: {max: 2, "))
    doomed = gpu_fleet.instances()[0]
    run(gpu_fleet, event_for("spot-interruption-warning.json", tmp_path, **{"instance-id": doomed}), queue)
    assert gpu_fleet.desired() == 2
    [told] = queued(queue)
    assert "already at max 2" in told.facts["replacement"]
    assert told.facts["GPUs"].startswith("no GPU metrics")


def test_a_flood_of_rebalance_recommendations_is_one_incident_and_changes_nothing(
    gpu_fleet: Fleet, tmp_path: Path
) -> None:
    queue = fleet.create_notification_stack(slack_secret=None).queue_url
    gpu_fleet.policy_path.write_text(PRELAUNCH)
    for iid in gpu_fleet.instances() * 3:  # each node recommended three times
        run(gpu_fleet, event_for("rebalance-recommendation.json", tmp_path, **{"instance-id": iid}), queue)
    notes = queued(queue)
    assert gpu_fleet.desired() == 2  # notify-only by default
    assert {n.incident_key for n in notes} == {"asg:train-spot|capacity"}
    assert len({n.notification_id for n in notes}) == 2  # one per node: repeats fold into the incident


def block_group(gpu_fleet: Fleet, desired: int) -> list[str]:
    """A managed ASG whose launch template targets the Capacity Block; its instances."""
    fleet.create_asg(
        gpu_fleet.clients,
        "train-p5-block",
        min_size=0,
        max_size=4,
        desired=desired,
        tags=fleet.MANAGED_TAG,
        market="capacity-block",
        reservation=RESERVATION,
    )
    return gpu_fleet.instances("train-p5-block")


def test_a_capacity_block_warning_names_the_groups_nodes_and_which_are_busy(gpu_fleet: Fleet, tmp_path: Path) -> None:
    queue = fleet.create_notification_stack(slack_secret=None).queue_url
    nodes = block_group(gpu_fleet, 3)
    busy(gpu_fleet, *nodes[:2])
    gpu_fleet.put_instance_gpu(nodes[2], 0, 1, datetime.now(UTC) - timedelta(minutes=1))  # idle
    result = run(gpu_fleet, EVENTS / "capacity-block-expiration-warning.json", queue)
    assert set(result["groups"]) == {"asg:train-p5-block"}  # not train-spot: it does not launch into it
    [told] = queued(queue)
    assert told.kind == "reservation" and told.severity == "critical"
    assert told.title == f"Capacity Block {RESERVATION} ends: 3 node(s), 2 busy"
    assert told.facts["instances terminate from"] == "11:00 UTC" and told.facts["ends"] == "2026-11-23 11:30 UTC"
    assert all(n in told.facts["asg:train-p5-block"] for n in nodes)
    assert all(n in told.reason for n in nodes[:2]) and nodes[2] not in told.reason
    assert f"{nodes[2]} idle" in told.facts["asg:train-p5-block"]


def test_in_process_the_same_flows_are_recorded_for_the_iam_check(gpu_fleet: Fleet, tmp_path: Path) -> None:
    """The subprocess runs above are not seen by the session's call recorder; these are."""
    queue = fleet.create_notification_stack(slack_secret=None).queue_url
    gpu_fleet.policy_path.write_text(PRELAUNCH)
    block_group(gpu_fleet, 1)
    env = {
        defaults.ENV_STATE_TABLE: TABLE,
        defaults.ENV_POLICY_FILE: str(gpu_fleet.policy_path),
        defaults.ENV_NOTIFY_QUEUE_URL: queue,
    }
    watch = build_spot_watch(Logger(service="test"), Metrics(namespace="GPUFleet/Test"), env=env)
    doomed = gpu_fleet.instances()[0]
    now = datetime.now(UTC)
    watch.handle(
        json.loads(event_for("spot-interruption-warning.json", tmp_path, **{"instance-id": doomed}).read_text()), now
    )
    gpu_fleet.clients.autoscaling.set_instance_health(InstanceId=doomed, HealthStatus="Unhealthy")
    swept = watch.handle(json.loads((EVENTS / "scheduler-sweep.json").read_text()), now)
    assert swept["results"][0]["handed_back"][0]["instance"] == doomed
    block = watch.handle(json.loads((EVENTS / "capacity-block-expiration-warning.json").read_text()), now)
    assert "asg:train-p5-block" in block["results"][0]["groups"]


def tick(gpu_fleet: Fleet, tmp_path: Path, n: int, queue: str) -> dict[str, Any]:
    path = tmp_path / f"tick-{n}.json"
    now = datetime.now(UTC).isoformat()
    path.write_text(json.dumps({"gpufleet": "reconcile", "execution_id": f"tick-{n}", "scheduled_time": now}))
    proc = invoke_function("scaler", gpu_fleet, path, extra_env={defaults.ENV_NOTIFY_QUEUE_URL: queue})
    assert proc.returncode == 0, proc.stderr
    [result] = json.loads(proc.stdout[proc.stdout.index('{\n  "results"') :])["results"]
    return {d["group"]: d for d in result["decisions"]}


def test_a_group_another_actor_keeps_resizing_is_left_alone_with_a_warning(gpu_fleet: Fleet, tmp_path: Path) -> None:
    """gpufleet scales train-spot out on its alarm; then something else (a native policy, Cluster Autoscaler)
    sets desired twice within minutes. gpufleet stands aside: advice only, one WARNING naming the changes."""
    queue = fleet.create_notification_stack(slack_secret=None).queue_url
    gpu_fleet.policy_path.write_text("defaults: {scale_out_cooldown_s: 0, scale_in_cooldown_s: 0}\n")
    asg = gpu_fleet.clients.autoscaling
    proc = invoke_function(
        "scaler",
        gpu_fleet,
        ROOT / "events" / "scaler" / "eventbridge-alarm-asg-high.json",
        extra_env={defaults.ENV_NOTIFY_QUEUE_URL: queue},
    )
    assert proc.returncode == 0 and gpu_fleet.desired() == 3  # gpufleet's own change
    tick(gpu_fleet, tmp_path, 1, queue)
    asg.set_desired_capacity(AutoScalingGroupName="train-spot", DesiredCapacity=6)  # someone else
    tick(gpu_fleet, tmp_path, 2, queue)
    asg.set_desired_capacity(AutoScalingGroupName="train-spot", DesiredCapacity=4)  # and again
    queued(queue)
    decisions = tick(gpu_fleet, tmp_path, 3, queue)
    [warning] = [n for n in queued(queue) if n.kind == "control"]
    assert warning.severity == "warning" and warning.incident_key == "asg:train-spot|ownership"
    assert warning.facts["changes gpufleet did not make"].startswith("3 -> 6 at ")
    assert ", 6 -> 4 at " in warning.facts["changes gpufleet did not make"]
    assert "owner: external" in warning.reason
    # moto records no scaling activity for SetDesiredCapacity, so none is named here (unit-tested instead).
    assert gpu_fleet.desired() == 4  # left alone
    # [emulated] the scale-out alarm fires again (moto evaluates no alarms): gpufleet only advises now.
    gpu_fleet.clients.cloudwatch.set_alarm_state(
        AlarmName="gpufleet-train-gpu-high", StateValue="ALARM", StateReason="GPU utilization above 85 %"
    )
    decisions = tick(gpu_fleet, tmp_path, 4, queue)
    held = decisions["asg:train-spot"]
    assert held["action"] == "hold" and held["reason"].startswith("advice only (standing aside until")
    assert "would scale-out 4 -> 5" in held["reason"]
    assert gpu_fleet.desired() == 4


def test_the_sweep_tells_of_a_reservation_ending_within_the_hour_before_ec2_does(
    gpu_fleet: Fleet, tmp_path: Path
) -> None:
    """[emulated EC2 DescribeCapacityReservations] the block ends in 50 min: the sweep opens the same
    incident EC2's 40-minute warning would (its notification id, so the two fold); 3 h away: nothing yet."""
    queue = fleet.create_notification_stack(slack_secret=None).queue_url
    nodes = block_group(gpu_fleet, 2)
    busy(gpu_fleet, nodes[0])
    now = datetime.now(UTC)
    gpu_fleet.put_instance_gpu(nodes[1], 0, 1, now - timedelta(minutes=1))  # idle
    fleet.inject_capacity_reservation(gpu_fleet.endpoint, RESERVATION, now + timedelta(hours=3))
    assert run(gpu_fleet, EVENTS / "scheduler-sweep.json", queue)["reservations_ending"] == []
    assert queued(queue) == []
    fleet.inject_capacity_reservation(gpu_fleet.endpoint, RESERVATION, now + timedelta(minutes=50))
    [ending] = run(gpu_fleet, EVENTS / "scheduler-sweep.json", queue)["reservations_ending"]
    assert ending["reservation"] == RESERVATION and set(ending["groups"]["asg:train-p5-block"]) == set(nodes)
    [told] = queued(queue)
    assert told.title == f"Capacity Block {RESERVATION} ends: 2 node(s), 1 busy" and told.severity == "critical"
    from_event = capacity_block_note(
        CapacityBlockEvent(event_id="e", reservation_id=RESERVATION, phase="expiring", end=now, at=now),
        {"asg:train-p5-block": {}},
        region="us-east-1",
    )
    assert told.notification_id == from_event.notification_id  # EC2's own warning folds into this one
