"""A node whose only pod is a CPU-only batch Job runs work: from the pod listing to the decision, it is never
a victim, with consolidation by attrition or without, whatever its GPU metrics say.

The defect it reproduces (measured): only pods asking for GPUs counted as work, so attrition cordoned a node
whose one pod was another team's CPU-only Job and terminated it on the next tick with the pod Running."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, GroupState, InstanceObservation, NodeMark
from gpufleet.domain.nodes import NodeShape
from gpufleet.kubernetes.pods import ClusterPods, NodeState, PodTally
from gpufleet.policy.fleet import Consolidation, DemandSource, GroupSettings, KubernetesDemand, TargetBand
from gpufleet.scaling.core import decide_reconcile
from gpufleet.scaling.demand_rules import Tick, cluster_demand

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="gpu")
SOURCE = DemandSource(kubernetes=KubernetesDemand())
EC2 = {"n-cpu": "i-cpu", "n-idle": "i-idle"}  # what DescribeInstances maps the node names to


def cpu_job(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "etl-x7", "namespace": "other-team", "uid": "u1",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "etl", "uid": "j"}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def daemon(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"dcgm-{node}", "namespace": "kube-system", "uid": f"d-{node}",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm", "uid": "ds"}]},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def listing(cpu_node_closed: bool) -> ClusterPods:
    tally = PodTally("ml")
    tally.add([cpu_job("n-cpu"), daemon("n-cpu"), daemon("n-idle")])
    nodes = {
        "n-cpu": NodeState(name="n-cpu", unschedulable=cpu_node_closed, ours=cpu_node_closed, instance_id="i-cpu"),
        "n-idle": NodeState(name="n-idle", instance_id="i-idle"),
    }
    return tally.result(pages=1).model_copy(update={"nodes": nodes})


def observed(pods: ClusterPods, settings: GroupSettings) -> GroupObservation:
    """The group as the Kubernetes reader hands it to the core: its instances marked from the listing."""
    instances = tuple(
        InstanceObservation(instance_id=i, gpu_utilization=0.0, gpu_memory_percent=0.0) for i in ("i-cpu", "i-idle")
    )
    obs = GroupObservation(
        ref=REF, min_size=0, max_size=4, desired=2, instances=instances, instance_metrics_loaded=True
    )
    named = {n: EC2[n] for n in pods.never_victims}  # KubernetesReader.running, EC2 mapping every name
    found, _ = cluster_demand(
        [(obs, settings, SOURCE)],
        "ml",
        pods,
        {REF.key: NodeShape(gpus=8)},
        (named, None, 0),
        Tick(NOW, frozenset(), {}),
    )
    return found[REF.key]


@pytest.mark.parametrize("consolidate", [Consolidation.OFF, Consolidation.ATTRITION])
def test_a_node_whose_only_pod_is_a_cpu_job_is_never_a_victim(consolidate: Consolidation) -> None:
    settings = GroupSettings(min=0, max=4, target=TargetBand(low=30, high=80), consolidate=consolidate, demand=SOURCE)
    # With attrition the measured case: gpufleet had already cordoned the CPU Job's node.
    obs = observed(listing(cpu_node_closed=consolidate is Consolidation.ATTRITION), settings)
    by_id = {i.instance_id: i for i in obs.instances}
    assert by_id["i-cpu"].runs_work and not by_id["i-idle"].runs_work
    assert (by_id["i-cpu"].gpus_held, by_id["i-idle"].gpus_held) == (0.0, 0.0)  # GPUs held are still GPUs
    d = decide_reconcile(obs, settings, GroupState(), NOW, event_id="t")
    assert "i-cpu" not in d.victims  # every GPU reads idle: only the work keeps it


def test_with_attrition_the_cpu_jobs_open_node_is_not_closed_as_if_idle() -> None:
    """An idle node is closed whatever drain_max_share says (it goes next tick); a node running a CPU-only
    Job holds no GPUs, but it is not idle: it does not go next tick, so it is not closed as one."""
    settings = GroupSettings(
        min=0, max=4, target=TargetBand(low=30, high=80), consolidate=Consolidation.ATTRITION, demand=SOURCE,
        drain_max_share=1,
    )  # fmt: skip
    obs = observed(listing(cpu_node_closed=False), settings)
    d = decide_reconcile(obs, settings, GroupState(), NOW, event_id="t")
    assert "i-cpu" not in d.victims and "i-cpu" not in d.drain
    assert {i.instance_id: i.mark for i in obs.instances} == {"i-cpu": NodeMark.NONE, "i-idle": NodeMark.NONE}
