"""A PodGroup's minResources is not spread evenly over minMember: a CPU launcher and 4 x 8-GPU workers need 4
nodes, not 5.

The defect it reproduced: a PodGroup not owned by a Volcano Job (Kubeflow MPIJob / PyTorchJob with Volcano
gang scheduling: a CPU launcher + 4 x 8-GPU workers; or a 403 on batch.volcano.sh jobs, which is silently
optional) is read from minResources spread EVENLY over minMember: 32 GPUs / 5 pods -> 5 pods of 7 GPUs (6.4
rounded up). On 8-GPU nodes that is 5 nodes, not 4: one p5 over-launched, and at max 4 the gang is refused
forever ("needs 5 nodes, its max is 4") although it fits. (Found by the independent review of issue 32,
queued jobs and gangs: reproduced on the first version, passing since its fix.)"""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.domain.nodes import NodeShape
from gpufleet.kubernetes.volcano import VolcanoObjects, volcano_demand
from gpufleet.scaling.fit import assign
from tests.unit.events.test_volcano import podgroup

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def _mpijob_pg():
    # training-operator's calcPGMinResources: sum of all replicas' requests; minMember = launcher + workers
    return podgroup("mpi-llm", "ml", min_member=5, min_resources={"nvidia.com/gpu": "32", "cpu": "130"})


def test_cpu_launcher_plus_4x8_workers_needs_4_nodes_not_5() -> None:
    found = volcano_demand(VolcanoObjects(podgroups=[_mpijob_pg()], jobs=None), NOW)
    gpus = sorted(p.gpus for p in found.waiting)
    # total GPUs asked must not exceed what the gang said (32), and it must fit 4 nodes of 8 GPUs
    assert sum(gpus) <= 32, f"gang inflated to {sum(gpus)} GPUs: {gpus}"


def test_gang_fits_a_group_of_max_4_p5() -> None:
    found = volcano_demand(VolcanoObjects(podgroups=[_mpijob_pg()], jobs=None), NOW)
    shape = NodeShape(name="p5.48xlarge", gpus=8, allocatable={"cpu": 190, "memory": 2e12, "pods": 100})
    a = assign(found.waiting, {"eks:ml/p5": shape}, {"eks:ml/p5": 4}, (), -10, {"eks:ml/p5": 4})
    assert a.unfit == [], a.unfit[0].text if a.unfit else ""
