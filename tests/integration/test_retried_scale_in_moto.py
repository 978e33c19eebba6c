"""A scale-in whose terminate failed is never finished on stale victims (issue 40): the victims took work
since (a queue worker that took a job protects its instance; scale-in protection does not stop
TerminateInstanceInAutoScalingGroup, EC2 Auto Scaling user guide). Through the real scaler on moto server:
within a tick the saved change is finished through the last look; older, it is decided again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.aws.audit import AuditLog
from gpufleet.aws.state import StateStore
from gpufleet.domain.errors import ActionFailed
from gpufleet.domain.models import Decision, Outcome
from rehearsal.removal_scene import on_call, throttled
from tests.crash.scenarios import TABLE, ScaleInTwoVictims

pytestmark = pytest.mark.integration
NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)


def failed_scale_in(tmp: Path) -> ScaleInTwoVictims:
    """The alarm's scale-in picked the two idle nodes; its first terminate was throttled (the change is
    kept as the group's intent); then a job protected both victims."""
    world = ScaleInTwoVictims(tmp, NOW)
    with on_call({"TerminateInstanceInAutoScalingGroup"}, throttled), pytest.raises(ActionFailed, match="Throttling"):
        world.deliver(NOW)  # an alarm's delivery fails: Lambda delivers it again
    assert StateStore(world.clients.dynamodb, TABLE).load(["asg:train-spot"])["asg:train-spot"].intent is not None
    world.clients.autoscaling.set_instance_protection(
        InstanceIds=world.idle, AutoScalingGroupName="train-spot", ProtectedFromScaleIn=True
    )
    return world


def later_decision(world: ScaleInTwoVictims) -> Decision:
    """What the later tick recorded for the group (audited under the change's own event id when it finished
    it): the one decision that did not fail."""
    [d] = [
        d
        for d in AuditLog(world.clients.dynamodb, TABLE).recent("asg:train-spot", 50)
        if d.outcome is not Outcome.FAILED
    ]
    return d


def test_a_retry_within_the_tick_keeps_victims_protected_since(aws: str, tmp_path: Path) -> None:
    world = failed_scale_in(tmp_path)
    world.later(NOW + timedelta(seconds=30))
    assert world.instances() == sorted(world.busy + world.idle) and world.desired() == 4
    d = later_decision(world)
    assert "last look kept 2 victim(s)" in d.reason and "scale-in protected now" in d.reason, d.reason


def test_a_change_older_than_a_tick_is_decided_again_not_replayed(aws: str, tmp_path: Path) -> None:
    world = failed_scale_in(tmp_path)
    world.later(NOW + timedelta(minutes=6))
    assert world.instances() == sorted(world.busy + world.idle) and world.desired() == 4
    state = StateStore(world.clients.dynamodb, TABLE).load(["asg:train-spot"])["asg:train-spot"]
    assert state.intent is None  # the stale change is gone, not left to replay later
    d = later_decision(world)
    assert d.detail.startswith("decided again, not replayed (the change begun by "), d.detail
