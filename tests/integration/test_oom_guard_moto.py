"""The OOM guard against moto server: memory series written by the real publisher (simulated GPUs),
batched reads, incidents queued, an unhealthy instance handed to its ASG within the blast radius."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics

from gpufleet.domain import defaults
from gpufleet.domain.notification import IncidentState
from gpufleet.guard.service import OomGuard
from gpufleet.runtime import build_guard
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender
from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet, count_calls, queued

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
POLICY = """
defaults: {scale_out_step: 1, scale_out_cooldown_s: 60}
guard:
  memory: {scale_out_on_pressure: %s, pressure_share: 0.5}
  health: {replace_unhealthy: true, max_replacements_per_hour: 1, min_healthy_percent: 50}
"""


def publish(
    instance_id: str,
    minutes: int,
    memory: Any,
    lost_at: int | None = None,
    identity: Identity | None = None,
    xid_at: int | None = None,
    caller: str | None = "",
) -> None:
    """`minutes` of 2-GPU data ending now; memory(minute, gpu) -> percent used. The node is in train-spot
    unless `identity` says otherwise; `xid_at`: GPU 1 reports critical XID 94 (uncontained ECC) then.
    `caller` is the credentials' aws:userid: the instance's own profile unless given (None: no STS answer)."""
    backend = SimulatedBackend(gpus=2)
    identity = identity or Identity(instance_id, "us-east-1", asg_name="train-spot")
    caller = f"AROAEXAMPLE:{instance_id}" if caller == "" else caller
    pub = Publisher(backend, identity, Sender(boto3.client("cloudwatch")), detail="adaptive", caller=caller)
    pub.start(xid_thread=False)
    start = NOW - timedelta(minutes=minutes)
    for m in range(minutes):
        for gpu in range(2):
            backend.set(gpu, utilization=60, memory_percent=memory(m, gpu))
        if lost_at is not None and m == lost_at:
            backend.lost.add(1)
            pub.record_xid(1, 79)
        if xid_at is not None and m == xid_at:
            pub.record_xid(1, 94)
        simulate(pub, start + timedelta(minutes=m), 60, every_s=10)
        pub.close_windows(start + timedelta(minutes=m, seconds=59))


def guard(gpu_fleet: Fleet, queue: str, pressure: bool = False, dry_run: bool = False) -> OomGuard:
    gpu_fleet.policy_path.write_text(POLICY % ("true" if pressure else "false"))
    env = {
        defaults.ENV_STATE_TABLE: TABLE,
        defaults.ENV_POLICY_FILE: str(gpu_fleet.policy_path),
        defaults.ENV_NOTIFY_QUEUE_URL: queue,
    }
    if dry_run:
        env[defaults.ENV_DRY_RUN] = "true"
    return build_guard(Logger(service="test"), Metrics(namespace="GPUFleet/Test"), env=env)


def leaking(m: int, gpu: int) -> float:
    return 50 + 3 * m if gpu == 0 else 30  # GPU 0 leaks 3 %/min: 92 % after 15 min, full in under 3


def test_leak_and_lost_gpu_become_incidents_and_the_instance_is_replaced(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    healthy_node, sick_node = gpu_fleet.instances()
    publish(healthy_node, 15, leaking)
    publish(sick_node, 15, lambda m, g: 20, lost_at=12)
    g = guard(gpu_fleet, stack.queue_url)
    calls = count_calls(g.metrics.cloudwatch, g.ctx.fleet.autoscaling)
    result = g.evaluate(NOW, "tick-1")
    # Cheapest first: 3 series for the group, then per instance of a group at risk, then the suspects'
    # GPUs (ListMetrics per suspect instance: a GPU has series of its own only while in detail): memory
    # percent, then size and top process for the GPU at risk and health counters on the sick instance.
    # Two more ListMetrics find the nodes publishing outside managed groups (none here). The replacement
    # candidate costs one more of each: its own namespace, listed and read (the fault confirmed there).
    assert calls["cloudwatch:ListMetrics"] == 2 + 2 + 1
    assert result["unmanaged"] == 0
    assert calls["cloudwatch:GetMetricData"] == 4 + 1
    risky = result["at_risk"][f"{healthy_node}/gpu0"]
    assert risky.startswith("critical: ") and "full in ~3 min" in risky
    assert f"{healthy_node}/gpu1" not in result["at_risk"]
    assert "GPU lost" in result["unhealthy"][f"{sick_node}/gpu1"]
    assert "1 critical XID" in result["unhealthy"][f"{sick_node}/gpu1"]
    [replacement] = result["replacements"]
    assert replacement["act"] and replacement["instance_id"] == sick_node
    asg = gpu_fleet.clients.autoscaling.describe_auto_scaling_instances(InstanceIds=[sick_node])
    assert asg["AutoScalingInstances"][0]["HealthStatus"].upper() == "UNHEALTHY"
    notes = queued(stack.queue_url)
    assert sorted((n.kind, str(n.severity)) for n in notes) == [("gpu-health", "critical"), ("oom", "critical")]
    oom = next(n for n in notes if n.kind == "oom")
    assert oom.incident_key == f"asg:train-spot|oom|{healthy_node}/gpu0"
    assert {"instance", "GPU", "memory", "trend", "forecast", "top process"} <= set(oom.facts)
    assert any("metricsV2:graph" in link.url for link in oom.links)
    # The next run remembers: nothing new to say, nobody replaced twice.
    again = g.evaluate(NOW + timedelta(seconds=30), "tick-2")
    assert queued(stack.queue_url) == [] and not any(r["act"] for r in again["replacements"])


def test_the_leak_ends_and_the_incident_resolves(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    node = gpu_fleet.instances()[0]
    publish(node, 15, leaking)
    g = guard(gpu_fleet, stack.queue_url)
    g.evaluate(NOW, "tick-1")
    queued(stack.queue_url)
    # The process ends: memory drops back; a reset, not a trend.
    backend_minutes = 5
    publish_later = NOW + timedelta(minutes=backend_minutes)
    pub_backend = SimulatedBackend(gpus=2)
    identity = Identity(node, "us-east-1", asg_name="train-spot")
    pub = Publisher(pub_backend, identity, Sender(boto3.client("cloudwatch")), detail="adaptive")
    pub.start(xid_thread=False)
    for m in range(backend_minutes):
        pub_backend.set(0, 0, 5)
        pub_backend.set(1, 0, 30)
        simulate(pub, NOW + timedelta(minutes=m), 60, every_s=10)
        pub.close_windows(NOW + timedelta(minutes=m, seconds=59))
    result = g.evaluate(publish_later, "tick-2")
    assert result["at_risk"] == {}
    [note] = queued(stack.queue_url)
    assert note.state is IncidentState.RESOLVED and note.incident_key.endswith(f"{node}/gpu0")


def test_group_memory_pressure_scales_out_through_the_scaler(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    for node in gpu_fleet.instances():
        publish(node, 10, lambda m, g: 93)  # every GPU above WARNING
    result = guard(gpu_fleet, stack.queue_url, pressure=True).evaluate(NOW, "tick-1")
    why = "memory pressure: 2 of 2 instances have a GPU at risk of running out of memory"
    assert result["pressure"] == {"asg:train-spot": why}
    assert gpu_fleet.desired() == 3  # one step, the scaler's bounds and cooldowns applied
    kinds = {n.kind for n in queued(stack.queue_url)}
    assert kinds == {"oom", "scaling"}


def test_dry_run_replaces_nothing_and_says_so(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    sick = gpu_fleet.instances()[1]
    publish(sick, 5, lambda m, g: 20, lost_at=3)
    result = guard(gpu_fleet, stack.queue_url, dry_run=True).evaluate(NOW, "tick-1")
    [replacement] = result["replacements"]
    assert not replacement["act"] and replacement["reason"].startswith("dry-run: would")
    asg = gpu_fleet.clients.autoscaling.describe_auto_scaling_instances(InstanceIds=[sick])
    assert asg["AutoScalingInstances"][0]["HealthStatus"].upper() == "HEALTHY"
    [note] = queued(stack.queue_url)
    assert note.facts["action"].startswith("dry-run: would")


ACTIONS = ("SetInstanceHealth", "SetDesiredCapacity", "TerminateInstanceInAutoScalingGroup", "UpdateNodegroupConfig")


def test_a_node_outside_every_managed_group_is_told_about_and_never_acted_on(gpu_fleet: Fleet) -> None:
    """A self-managed node of cluster ml (tagged eks:cluster-name, in no node group gpufleet manages): its
    series carry InstanceId alone. GPU 0 leaks (1 %/min from 75 %), GPU 1 reports a critical XID. It gets
    an OOM warning and a GPU health incident, grouped as unmanaged:<instance>, and no replacement and no
    capacity request, although the policy replaces unhealthy nodes and scales out on pressure. (Before,
    the guard read managed groups only: no forecast, no finding, no note for this node.)"""
    stack = fleet.create_notification_stack(slack_secret=None)
    outsider = "i-0feedc0de0000001"
    identity = Identity(outsider, "us-east-1", cluster_name="ml")
    publish(outsider, 15, lambda m, gpu: 75 + m if gpu == 0 else 30, identity=identity, xid_at=12)
    g = guard(gpu_fleet, stack.queue_url, pressure=True)
    clients = (g.metrics.cloudwatch, g.actuator.autoscaling, g.actuator.eks, g.ctx.fleet.autoscaling, g.ctx.fleet.eks)
    calls = count_calls(*clients)
    result = g.evaluate(NOW, "tick-1")
    group = f"unmanaged:{outsider}"
    assert result["at_risk"].get(f"{outsider}/gpu0", "").startswith("warning: ")
    assert "1 critical XID" in result["unhealthy"].get(f"{outsider}/gpu1", "")
    assert result["unmanaged"] == 1
    assert result["replacements"] == [] and result["pressure"] == {}
    notes = queued(stack.queue_url)
    assert sorted((n.kind, str(n.severity), n.incident_key) for n in notes) == [
        ("gpu-health", "critical", f"{group}|gpu-health|{outsider}/gpu1"),
        ("oom", "warning", f"{group}|oom|{outsider}/gpu0"),
    ]
    health = next(n for n in notes if n.kind == "gpu-health")
    assert health.facts["action"] == "not in a managed group: told only, never replaced"
    assert [c for c in calls if c.split(":")[1] in ACTIONS] == []
    assert gpu_fleet.desired() == 2 and gpu_fleet.nodegroup_desired() == 2
    # Its cost: listed by the two ListMetrics, its two summaries (+ health, listed) ride in the groups'
    # first GetMetricData; then its GPUs as any suspect's (one ListMetrics, memory, then size and health).
    assert calls["cloudwatch:GetMetricData"] == 3
    # The next run remembers: nothing new told, still nobody acted on.
    again = g.evaluate(NOW + timedelta(seconds=30), "tick-2")
    assert queued(stack.queue_url) == [] and again["replacements"] == []
    assert [c for c in calls if c.split(":")[1] in ACTIONS] == []
