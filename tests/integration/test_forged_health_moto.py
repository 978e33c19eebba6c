"""A node's forged GPU fault never gets a healthy node replaced (issue 29).

Any node may write any InstanceId into the shared namespace GPUFleet (IAM has no condition key for
dimensions), so the forger here writes "GPU 1 lost" and a critical XID under the victim's id with the real
publisher, as a node of another group could. What it cannot write is the victim's own namespace,
GPUFleet/Node/ROLEID:<victim> (tests/iam/test_node_policy.py: the node policy's
`cloudwatch:namespace = GPUFleet/Node/${aws:userid}` denies it). Before, the guard marked the victim
Unhealthy on the shared datum alone (what test_oom_guard_moto's first test still shows for a real fault);
now it holds the replacement and tells on-call why, once. The victim's own datum then confirms it."""

from __future__ import annotations

from datetime import timedelta

from gpufleet.guard.core import forgery_reason
from rehearsal import fleet
from tests.integration.conftest import Fleet, count_calls, queued
from tests.integration.test_oom_guard_moto import NOW, guard, publish


def health(gpu_fleet: Fleet, instance_id: str) -> str:
    asg = gpu_fleet.clients.autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id])
    return str(asg["AutoScalingInstances"][0]["HealthStatus"]).upper()


def test_a_forged_gpu_fault_is_told_not_acted_on_and_the_victims_own_confirms_a_real_one(gpu_fleet: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    victim = gpu_fleet.instances()[1]
    # The forger: the victim's InstanceId in the shared namespace, its own credentials (not the victim's).
    publish(victim, 5, lambda m, g: 20, lost_at=3, caller="AROAEXAMPLE:i-0f0f0f0f0f0f0f0f0")
    g = guard(gpu_fleet, stack.queue_url)
    calls = count_calls(g.metrics.cloudwatch, g.actuator.autoscaling)
    result = g.evaluate(NOW, "tick-1")
    assert "GPU lost" in result["unhealthy"][f"{victim}/gpu1"]
    [held] = result["replacements"]
    assert not held["act"] and held["reason"] == forgery_reason(victim)
    assert health(gpu_fleet, victim) == "HEALTHY" and calls["autoscaling:SetInstanceHealth"] == 0
    [note] = queued(stack.queue_url)
    assert note.kind == "gpu-health" and note.facts["action"] == forgery_reason(victim)
    assert "possible forgery from another node" in note.facts["action"]
    # Told once: the next run looks again (the fault could still be on its way), says nothing new.
    again = g.evaluate(NOW + timedelta(seconds=30), "tick-2")
    assert [r["act"] for r in again["replacements"]] == [False] and queued(stack.queue_url) == []
    assert health(gpu_fleet, victim) == "HEALTHY"
    # The victim's own credentials report the fault in its own namespace: now it is replaced, and said.
    publish(victim, 2, lambda m, g: 20, lost_at=1)
    confirmed = g.evaluate(NOW + timedelta(seconds=50), "tick-3")
    [replacement] = confirmed["replacements"]
    assert replacement["act"] and replacement["instance_id"] == victim
    assert health(gpu_fleet, victim) == "UNHEALTHY"
    [note] = queued(stack.queue_url)
    assert note.title.endswith(f"GPU failure confirmed by {victim} itself: {victim}/gpu1")
