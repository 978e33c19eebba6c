"""A gang that never starts on its idle nodes stops being counted and its nodes are given back.

The defect it reproduced: a counted gang that does NOT start although all its nodes are up and idle
(Volcano: the PodGroup's Queue `capability` is used up - documented as a known limit, Queues are not read; a
Queue closed; Kueue: a Workload held by a namespaceSelector the reader does not model) keeps its nodes
forever: the give-back only fires when desired > listed (EC2 did not start some), and with work waiting
`demand_release` never runs. Two idle p5 nodes billed with no end, and nothing told. Correct: a gang still
waiting GANG_LAUNCH_TIMEOUT_S after all the nodes it was launched for are up and idle is not node-bound:
stop counting it (tell why) and give the idle nodes back. (Found by the independent review of issue 32,
queued jobs and gangs: reproduced on the first version, passing since its fix.)"""

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
    WaitingWork,
)
from gpufleet.policy.fleet import GroupSettings, TargetBand
from gpufleet.scaling.core import decide_reconcile

NOW = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="p5")


def test_idle_nodes_of_a_gang_that_never_starts_are_given_back() -> None:
    gang = tuple(
        WaitingWork(name=f"pg[{i}]", gpus=8, since=NOW - timedelta(hours=3), gang="volcano:ml/pg") for i in range(2)
    )
    idle = tuple(
        InstanceObservation(instance_id=f"i-{i}", gpu_utilization=0.0, gpu_memory_percent=0.0, runs_work=False)
        for i in range(2)
    )
    obs = GroupObservation(
        ref=REF,
        min_size=0,
        max_size=10,
        desired=2,
        instances=idle,
        instance_metrics_loaded=True,
        demand=Demand(source="cluster ml", waiting=gang, gpus_per_node=8, knows_nodes=True, free_gpus=(8.0, 8.0)),
    )
    state = GroupState(last_scale_out_at=NOW - timedelta(hours=2, minutes=50), last_scale_out_added=2)
    d = decide_reconcile(obs, GroupSettings(min=0, max=10, target=TargetBand(low=30, high=80)), state, NOW,
                         event_id="tick")  # fmt: skip
    assert d.action is Action.SCALE_IN, f"{d.action}: {d.reason}"
