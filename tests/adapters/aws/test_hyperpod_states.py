"""HyperPod's node states against a Slurm backlog (issue 42): a node in its deep health checks
(DeepHealthCheckInProgress), being patched (SystemUpdating) or failed under automatic node recovery
(Failure) is capacity on its way, so the backlog it was asked for does not ask for it again. Before, such a
node was neither capacity nor on its way: for 16 pending GPUs TargetCount went 2 -> 4 -> 6 -> 8 in 20
minutes, and a Failure node got a second one beside HyperPod's own replacement. Read through the adapter
(fake SageMaker) and decided by the real core."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpufleet.aws.hyperpod import HyperPodFleet
from gpufleet.domain.models import Action, Demand, GroupState, WaitingWork
from gpufleet.policy.fleet import GroupSettings
from gpufleet.scaling.core import decide_reconcile
from tests.adapters.aws import test_hyperpod as base

SETTINGS = GroupSettings(min=0, max=8)
NODES = ["i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb", "i-0cccccccccccccccc"]  # GROUP's TargetCount is 3


class Recovering(base.FakeSageMaker):
    """DescribeCluster with the cluster's NodeRecovery (Automatic is HyperPod's default; None: nothing
    repairs a failed node)."""

    def __init__(self, nodes: list[dict[str, Any]], recovery: str | None) -> None:
        super().__init__(nodes)
        self.recovery = recovery

    def describe_cluster(self, **kw: Any) -> dict[str, Any]:
        out = super().describe_cluster(**kw)
        if self.recovery is not None:
            out["NodeRecovery"] = self.recovery
        return out


def _decide(statuses: list[str], pending_gpus: int, recovery: str | None = None) -> Any:
    """The group (TargetCount 3) with its nodes in `statuses`, `pending_gpus` GPUs of Slurm jobs waiting (8
    per node), its last scale-out long past the warm-up: the core's decision on a reconcile tick."""
    sm = Recovering([base._node(iid, s) for iid, s in zip(NODES, statuses, strict=True)], recovery)
    fleet = HyperPodFleet(sm, base.FakeCloudWatch({}), now=lambda: base.NOW, iam=sm)
    [obs] = fleet.observe([base.REF])
    waiting = (WaitingWork(name="metric Slurm/PendingGPUs", gpus=1, count=pending_gpus),) if pending_gpus else ()
    demand = Demand(source="metric Slurm/PendingGPUs", noun="GPU", waiting=waiting, gpus_per_node=8)
    obs = obs.model_copy(update={"demand": demand})
    state = GroupState(last_scale_out_at=base.NOW - timedelta(minutes=20), last_scale_out_added=2)
    return decide_reconcile(obs, SETTINGS, state, base.NOW, event_id="tick")


@pytest.mark.parametrize("status", ["DeepHealthCheckInProgress", "SystemUpdating"])
def test_nodes_hyperpod_is_checking_or_patching_are_not_asked_for_again(status: str) -> None:
    """16 GPUs wait; the two nodes asked for them are in their deep health checks: TargetCount stays."""
    d = _decide(["Running", status, status], 16)
    assert d.action is not Action.SCALE_OUT, d.reason
    assert d.desired == 3


def test_only_what_the_checked_nodes_do_not_cover_is_asked_for() -> None:
    """24 GPUs wait, two nodes (16 GPUs) are in their checks: one more node, not three."""
    d = _decide(["Running", "DeepHealthCheckInProgress", "DeepHealthCheckInProgress"], 24)
    assert (d.action, d.desired) == (Action.SCALE_OUT, 4), d.reason


def test_a_failure_node_is_not_replaced_by_a_count_increase() -> None:
    """HyperPod's automatic node recovery (the default: NodeRecovery absent or Automatic) reboots or
    replaces a Failure node within the same count: the job it held waits for it, not for a new node."""
    for recovery in (None, "Automatic"):
        d = _decide(["Running", "Running", "Failure"], 8, recovery)
        assert d.action is not Action.SCALE_OUT and d.desired == 3, (recovery, d.reason)


def test_without_node_recovery_a_failure_node_is_not_on_its_way() -> None:
    """NodeRecovery None: HyperPod repairs nothing ('cluster administrators will need to manually manage
    any faulty cluster instances'): the failed node is neither capacity nor coming, and the work gets a node."""
    d = _decide(["Running", "Running", "Failure"], 8, "None")
    assert (d.action, d.desired) == (Action.SCALE_OUT, 4), d.reason
    sm = Recovering([base._node(NODES[0], "Failure")], "None")
    [obs] = HyperPodFleet(sm, base.FakeCloudWatch({}), now=lambda: base.NOW, iam=sm).observe([base.REF])
    assert [(i.lifecycle_state, i.healthy, i.in_service) for i in obs.instances] == [("Failure", False, False)]
