"""A partial launch is given back only when it was made for a gang that waited before it.

The defect it reproduced: `gangs.partial_launch` says "a gang's launch came in part" whenever ANY gang waits
now and desired > listed 10 min after the last scale-out - whatever that scale-out was for. A scale-out for
pods on their own that EC2 only half filled (p5 InsufficientInstanceCapacity: the ASG keeps retrying, which
is what those pods want) is cancelled, and idle nodes removed, the moment any gang shows up - even one that
arrived a minute ago, or a 1-member Volcano PodGroup (every pod with schedulerName volcano gets one). Then
gangs rest 10 min, singles re-launch, and it repeats: flapping desired every ~10 min. Correct: give back
only the launch that was made FOR a gang (record the gang keys / count in the state at scale-out), and never
for a gang that started waiting after that scale-out. (Found by the independent review of issue 32, queued
jobs and gangs: reproduced on the first version, passing since its fix.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Demand,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    TriggerKind,
    WaitingWork,
)
from gpufleet.policy.fleet import GroupSettings, TargetBand
from gpufleet.scaling.core import decide_reconcile

NOW = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="p5")


def test_singles_launch_is_not_given_back_for_a_gang_that_came_later() -> None:
    singles = tuple(WaitingWork(name=f"solo-{i}", gpus=8, since=NOW - timedelta(minutes=25)) for i in range(3))
    late_gang = tuple(
        WaitingWork(name=f"pg[{i}]", gpus=8, since=NOW - timedelta(minutes=1), gang="volcano:ml/pg") for i in range(2)
    )
    # 20 min ago: 6 nodes asked for 6 single pods; EC2 gave 3 (all now running 3 of the singles)
    instances = tuple(
        InstanceObservation(instance_id=f"i-{i}", gpu_utilization=95.0, gpu_memory_percent=80.0, runs_work=True)
        for i in range(3)
    )
    obs = GroupObservation(
        ref=REF,
        min_size=0,
        max_size=10,
        desired=6,
        instances=instances,
        instance_metrics_loaded=True,
        demand=Demand(source="cluster ml", waiting=singles + late_gang, gpus_per_node=8, knows_nodes=True),
    )
    state = GroupState(last_scale_out_at=NOW - timedelta(minutes=20), last_scale_out_added=6)
    s = GroupSettings(min=0, max=10, target=TargetBand(low=30, high=80))
    d = decide_reconcile(obs, s, state, NOW, event_id="tick")
    assert d.trigger.kind is not TriggerKind.GANG_PARTIAL, d.reason
    assert not (d.action is Action.SCALE_IN and d.desired < 6), d.reason
