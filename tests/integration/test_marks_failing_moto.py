"""Node marks that fail (a cordon refused with 403: the RBAC binding not applied yet, the usual first-day
mistake) must not hold the group hostage: the capacity change in the same decision is still made, the
failure is recorded and told (outcome failed), no intent is kept to be replayed over fresh decisions, and
for MARKS_REST_S the core neither drains nor counts a drained node's room (waiting work gets a launch)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from aws_lambda_powertools import Logger, Metrics

from gpufleet.aws.audit import AuditLog
from gpufleet.aws.fleet import FleetActuator
from gpufleet.aws.marks import NodeMarker
from gpufleet.aws.state import StateStore
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Decision,
    Demand,
    GroupObservation,
    GroupRef,
    InstanceObservation,
    MarkChannel,
    NodeMark,
    Outcome,
    Trigger,
    TriggerKind,
)
from gpufleet.scaling.execution import Executor
from rehearsal import fleet

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
TABLE = "marks-state"


class Refusing:
    """A cluster whose API refuses every node patch (the binding was never applied)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    def close(self, obs: GroupObservation, instance_ids: Sequence[str], reason: str) -> str:
        self.asked.append(("close", tuple(instance_ids)))
        raise RuntimeError("cluster ml: nodes could not be cordoned (HTTP 403 Forbidden)")

    def reopen(self, obs: GroupObservation, instance_ids: Sequence[str]) -> str:
        self.asked.append(("reopen", tuple(instance_ids)))
        raise RuntimeError("cluster ml: nodes could not be uncordoned (HTTP 403 Forbidden)")


def _decision(**kw: object) -> Decision:
    base: dict[str, object] = {
        "group": "asg:gpu-selfmanaged",
        "action": Action.HOLD,
        "current": 2,
        "desired": 2,
        "reason": "test",
        "trigger": Trigger(kind=TriggerKind.DEMAND, name="cluster ml"),
        "event_id": "e1",
        "at": NOW,
    }
    return Decision(**(base | kw))  # type: ignore[arg-type]


def _world(marker: NodeMarker) -> tuple[fleet.Clients, FleetActuator, StateStore, Executor]:
    """A managed self-managed ASG of 2 nodes, the state table, and the executor with `marker` for cordons."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_asg(clients, "gpu-selfmanaged", min_size=0, max_size=6, desired=2, tags=fleet.MANAGED_TAG)
    actuator = FleetActuator.of(clients.autoscaling, clients.eks, markers={MarkChannel.KUBERNETES: marker})
    store = StateStore(clients.dynamodb, TABLE)
    executor = Executor(actuator, store, AuditLog(clients.dynamodb, TABLE), Logger(service="t"), Metrics(namespace="T"))
    return clients, actuator, store, executor


def test_a_refused_cordon_is_told_once_kept_nowhere_and_never_holds_back_a_launch(aws: str) -> None:
    marker = Refusing()
    clients, _, store, executor = _world(marker)
    ids = [
        i["InstanceId"] for i in clients.autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"]
    ]
    obs = GroupObservation(
        ref=GroupRef(kind=GroupKind.ASG, name="gpu-selfmanaged"),
        min_size=0,
        max_size=6,
        desired=2,
        instances=tuple(InstanceObservation(instance_id=i, node_name=f"n-{i}", mark=NodeMark.GPUFLEET) for i in ids),
        tags=dict(fleet.MANAGED_TAG),
        demand=Demand(source="cluster ml", gpus_per_node=8, knows_nodes=True),
        marks=MarkChannel.KUBERNETES,
    )
    state = store.load([obs.ref.key])[obs.ref.key]

    drained = executor.execute(_decision(drain=(ids[0],)), obs, state)
    assert drained.outcome is Outcome.FAILED and "403 Forbidden" in drained.detail
    after = store.load([obs.ref.key])[obs.ref.key]
    assert after.intent is None and after.marks_failed_at == NOW  # told, kept nowhere, rests a while
    assert after.last_scale_in_at is None and after.last_scale_out_at is None  # marks start no cooldown

    later = NOW + timedelta(minutes=1)
    grow = _decision(action=Action.SCALE_OUT, desired=3, undrain=(ids[1],), event_id="e2", at=later)
    grown = executor.execute(grow, obs, after)
    assert grown.outcome is Outcome.FAILED and "reopen failed" in grown.detail
    assert fleet_desired(clients) == 3  # the launch went ahead although the reopen was refused
    final = store.load([obs.ref.key])[obs.ref.key]
    assert final.intent is None and final.last_scale_out_at == later and final.marks_failed_at == later
    assert marker.asked == [("close", (ids[0],)), ("reopen", (ids[1],))]


def fleet_desired(clients: fleet.Clients) -> int:
    group = clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu-selfmanaged"])
    return int(group["AutoScalingGroups"][0]["DesiredCapacity"])


class Recording:
    """A cluster that accepts every patch; what was asked is kept (idempotent, like the real marker)."""

    def __init__(self) -> None:
        self.closed: set[str] = set()
        self.calls = 0

    def close(self, obs: GroupObservation, instance_ids: Sequence[str], reason: str) -> str:
        self.calls += 1
        self.closed |= set(instance_ids)
        return f"cordoned {', '.join(instance_ids)}"

    def reopen(self, obs: GroupObservation, instance_ids: Sequence[str]) -> str:
        self.calls += 1
        self.closed -= set(instance_ids)
        return f"uncordoned {', '.join(instance_ids)}"


def test_an_invocation_that_dies_after_the_cordon_is_finished_by_the_next_never_left_half_done(aws: str) -> None:
    """The intent (with its drain list) is written under the lease before the patch; the invocation dies
    after the patch, before the commit. The next invocation finishes it (the patch again: idempotent) and
    commits; the node is then gpufleet's by its annotation and removed once idle, or reopened."""
    marker = Recording()
    _, actuator, store, executor = _world(marker)
    obs = GroupObservation(
        ref=GroupRef(kind=GroupKind.ASG, name="gpu-selfmanaged"),
        min_size=0,
        max_size=6,
        desired=2,
        instances=(InstanceObservation(instance_id="i-a", node_name="n-a"),),
        tags=dict(fleet.MANAGED_TAG),
        marks=MarkChannel.KUBERNETES,
    )
    drain = _decision(drain=("i-a",))
    assert store.begin(drain, "e1#dead", 0)  # what execute() writes first
    actuator.apply(drain, obs, "token")  # the patch lands; the invocation dies before its commit
    assert marker.closed == {"i-a"}
    state = store.load([obs.ref.key])[obs.ref.key]
    assert state.intent is not None and state.intent.drain == ("i-a",)
    finished = executor.resume(obs, state, "e1", NOW + timedelta(minutes=1))  # Lambda's retry
    assert finished is not None and finished.outcome is Outcome.APPLIED
    assert marker.closed == {"i-a"} and marker.calls == 2
    assert store.load([obs.ref.key])[obs.ref.key].intent is None
