"""The extra replicas of a Running Volcano gang are pods on their own, not all-or-nothing.

The defect it reproduced: every waiting pod with Volcano's `scheduling.k8s.io/group-name` annotation keeps
its gang key even when its PodGroup is NOT counted (Running: minMember already met; Unknown). Volcano starts
a Running gang's extra replicas (replicas > minMember, elastic) one by one - they are not all-or-nothing -
but gpufleet treats them as a gang: at max they are refused whole ("none launched for it") instead of
getting the room there is, and their waiting makes `partial_launch` give back unrelated launches. Correct:
only a COUNTED gang's pods are a gang; the pods of a PodGroup that is Running are pods on their own. (Found
by the independent review of issue 32, queued jobs and gangs: reproduced on the first version, passing since
its fix.)"""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.domain.models import WaitingWork
from gpufleet.kubernetes.pods import ClusterPods, waiting_pod
from gpufleet.kubernetes.queued import merged
from gpufleet.kubernetes.volcano import VolcanoObjects, volcano_demand
from gpufleet.scaling import gangs
from rehearsal.volcano_objects import gang_pod, podgroup

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def test_extra_replicas_of_a_running_gang_get_the_room_there_is() -> None:
    pg = podgroup("elastic", "ml", min_member=2, min_resources={"nvidia.com/gpu": "16"}, phase="Running", running=2)
    extras = [waiting_pod(gang_pod(f"elastic-worker-{i}", "ml", "elastic")) for i in (2, 3, 4)]
    pods = ClusterPods(cluster="ml", waiting=tuple(p for p in extras if p is not None))
    out = merged(pods, [volcano_demand(VolcanoObjects(podgroups=[pg]), NOW)])
    assert len(out.waiting) == 3 and out.queued_gangs == frozenset()
    work = [WaitingWork(name=p.key, gpus=p.gpus, since=p.since, gang=p.gang) for p in out.waiting]
    p = gangs.plan(work, gpus_per_node=8, free=[], booting=0, room=2)
    assert p.new_nodes == 2 and not p.refused, (p.new_nodes, [r.gang for r in p.refused])
