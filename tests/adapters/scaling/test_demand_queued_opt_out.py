"""A group with `queued: []` gets no queued gang's pods, whatever the cluster's other groups read.

The defect it reproduced: `demand.kubernetes.queued` is per group ("[] reads pods alone", policy/fleet.py),
but demand_source unions it over the cluster's groups and assigns the queued gangs' pods to ANY group they
fit - the opted-out one included (the smallest fitting group wins). A team that set `queued: []` on its
group (it does not want Volcano/Kueue to grow it) still gets nodes for queued jobs as soon as one other
group of the cluster keeps the default. Correct: a queued gang's pods are offered only to groups whose
`queued` names that system. (Found by the independent review of issue 32, queued jobs and gangs: reproduced
on the first version, passing since its fix.)"""

from __future__ import annotations

from datetime import UTC, datetime

from aws_lambda_powertools import Logger

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, QueuedSource
from gpufleet.kubernetes.pods import ClusterPods, WaitingPod
from gpufleet.policy.fleet import DemandSource, GroupSettings, KubernetesDemand
from gpufleet.scaling.demand import NodeShape
from gpufleet.scaling.demand_source import DemandReader
from tests.adapters.scaling.wiring import Pods, shapes

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SHAPES = {"big": NodeShape(gpus=8), "small": NodeShape(gpus=4)}


def group(name: str) -> GroupObservation:
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name=name), min_size=0, max_size=10, desired=0
    )


def test_a_group_with_queued_off_gets_no_queued_gang() -> None:
    key = "volcano:ml/pg"
    pods = ClusterPods(  # as the reader returns them when any group of the cluster reads Volcano
        cluster="ml",
        waiting=tuple(WaitingPod(namespace="ml", name=f"pg[{i}]", gpus=4, gang=key) for i in range(2)),
        queued_gangs=frozenset({key}),
    )
    seen: list[object] = []

    def cluster_pods(cluster, resources, nodes=None, **kw):
        seen.append(kw.get("queued"))
        return pods

    r = DemandReader(sqs=None, cloudwatch=None, cluster_pods=Pods(cluster_pods),
                     groups=shapes(lambda c, ng: SHAPES[ng]), instances_of=lambda names: {},
                     logger=Logger(service="t", level="CRITICAL"))  # fmt: skip
    off = GroupSettings(demand=DemandSource(kubernetes=KubernetesDemand(queued=())))
    on = GroupSettings(demand=DemandSource(kubernetes=KubernetesDemand(queued=(QueuedSource.VOLCANO,))))
    found = {o.ref.name: o for o, _ in r.attach([(group("small"), off), (group("big"), on)], NOW)}
    small = found["small"].demand
    assert small is not None
    assert [w.name for w in small.waiting] == [], "the group that set queued: [] got the queued gang"
