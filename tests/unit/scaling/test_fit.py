"""Kubernetes fit as the scheduler decides it, and which group owns each waiting pod (issue 28, item 3).
Pods come from a PodList in the API's own JSON (tests/fixtures/kubernetes/pods-fit.json)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.nodes import NodeShape
from gpufleet.kubernetes.pods import SelectorTerm, Toleration, WaitingPod, cluster_pods, waiting_pods
from gpufleet.scaling.fit import assign, fits, misfit, usable
from tests.profiles import examples

PODS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "kubernetes" / "pods-fit.json").read_text()
)["items"]
GIB = 2**30
GPU_TAINT = (("nvidia.com/gpu", "true", "NoSchedule"),)


class Machine(NamedTuple):
    """An instance type as the EKS shape adapter describes it from DescribeInstanceTypes (gpufleet.aws.eks_shape:
    its labels, and its allocatable with a 20 GiB disk); tests/adapters/scaling/test_fit_shapes.py holds
    these equal to what the adapter computes."""

    name: str
    gpus: int
    labels: dict[str, str]
    allocatable: dict[str, float]


A10G_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.memory": "22888",
    "nvidia.com/gpu.product": "NVIDIA-A10G",
}
G5_XLARGE = Machine(
    "g5.xlarge",
    1,
    {"nvidia.com/gpu.count": "1", **A10G_LABELS},
    {"cpu": 3.92, "memory": 15623237140.48, "pods": 58.0, "ephemeral-storage": 18253611008.0, "nvidia.com/gpu": 1.0},
)
G5_12XLARGE = Machine(
    "g5.12xlarge",
    4,
    {"nvidia.com/gpu.count": "4", **A10G_LABELS},
    {"cpu": 47.81, "memory": 196902398197.76, "pods": 234.0, "ephemeral-storage": 18253611008.0, "nvidia.com/gpu": 4.0},
)


def shape(t: Machine = G5_XLARGE, group: str = "gpu-infer", zones: tuple[str, ...] = ("us-east-1a",)) -> NodeShape:
    labels = {
        "eks.amazonaws.com/nodegroup": group,
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": t.name,
        "topology.kubernetes.io/region": "us-east-1",
        **t.labels,
        **({"topology.kubernetes.io/zone": zones[0]} if len(zones) == 1 else {}),
    }
    return NodeShape(
        gpus=t.gpus,
        labels=tuple(sorted(labels.items())),
        taints=GPU_TAINT,
        allocatable=t.allocatable,
        zones=zones,
        name=t.name,
    )


WAITING = {p.key: p for p in waiting_pods(PODS)}


def test_pods_too_big_for_every_node_ask_for_nothing_and_are_told_once_per_set_with_the_numbers() -> None:
    """cpu 4 / memory 16Gi on a g5.xlarge (3.92 CPU, ~14.5 GiB allocatable): the old fit looked at GPUs
    only and launched a node the pods never used. Three replicas are one notice, under one stable key."""
    got = assign(WAITING.values(), {"eks:ml/gpu-infer": shape()}, {"eks:ml/gpu-infer": 4})
    infer = [u for u in got.unfit if u.key.startswith("serving/infer ")]
    assert [(u.count, u.text) for u in infer] == [
        (
            3,
            "3 pods of serving/infer (cpu 4, memory 16Gi, 1 GPU) fit no group: "
            "eks:ml/gpu-infer's g5.xlarge has 3.92 CPU and 14.5 GiB allocatable",
        )
    ]
    owned = {w.name for w in got.owners["eks:ml/gpu-infer"]}
    assert not any(name.startswith("serving/infer-") for name in owned)
    again = assign(reversed(list(WAITING.values())), {"eks:ml/gpu-infer": shape()}, {"eks:ml/gpu-infer": 4})
    assert [u.key for u in again.unfit] == [u.key for u in got.unfit]  # stable: told once, not every tick


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        ("lab/big-cpu-0", "cpu 200 > 3.92 allocatable"),
        ("lab/big-mem-0", "memory 1Ti > 14.5Gi allocatable"),
        ("lab/big-disk-0", "ephemeral-storage 20Ti > 17Gi allocatable"),
        ("serving/infer-7d9f8c-abcde", "cpu 4 > 3.92 allocatable, memory 16Gi > 14.5Gi allocatable"),
        ("lab/fits-0", None),
    ],
)
def test_every_requested_resource_is_checked_against_allocatable(pod: str, why: str | None) -> None:
    assert misfit(WAITING[pod], shape()) == why


def test_pods_below_the_expendable_cut_off_ask_for_nothing() -> None:
    """priority -11 (an overprovisioning placeholder): Cluster Autoscaler's default cut-off is -10."""
    got = assign(WAITING.values(), {"g": shape()}, {"g": 4})
    names = {w.name for ws in got.owners.values() for w in ws}
    assert "overprov/filler-0" not in names and not any("overprov" in u.key for u in got.unfit)
    assert got.expendable == 1
    kept = assign(WAITING.values(), {"g": shape()}, {"g": 4}, expendable_priority=-20)
    assert "overprov/filler-0" in {w.name for ws in kept.owners.values() for w in ws}


def test_common_selectors_fit_a_group_whose_shape_carries_their_labels() -> None:
    """GPU feature discovery's product and memory and the zone: 3 of 7 common selectors fit no group
    before (the shape had none of these labels), so such pods waited forever at 0 nodes."""
    selecting = [p for p in WAITING.values() if p.namespace == "sel"]
    assert len(selecting) == 7
    assert {p.name: misfit(p, shape()) for p in selecting} == {p.name: None for p in selecting}


def test_a_zone_the_shape_cannot_tell_is_told_not_guessed() -> None:
    spread = shape(zones=("us-east-1a", "us-east-1b"))
    assert misfit(WAITING["sel/by-zone-0"], spread) == (
        "selects topology.kubernetes.io/zone=us-east-1a, which a new node's labels cannot tell in advance"
    )
    got = assign([WAITING["sel/by-zone-0"]], {"eks:ml/spread": spread}, {"eks:ml/spread": 3})
    assert got.owners == {}
    assert [u.text for u in got.unfit] == [
        "1 pod of sel/by-zone (cpu 1, memory 4Gi, 1 GPU) fit no group: eks:ml/spread: selects "
        "topology.kubernetes.io/zone=us-east-1a, which a new node's labels cannot tell in advance"
    ]
    other_zone = shape(zones=("us-east-1b",))
    assert (
        misfit(WAITING["sel/by-zone-0"], other_zone)
        == "nodeSelector topology.kubernetes.io/zone=us-east-1a does not match"
    )


def test_a_pod_goes_to_a_group_that_can_still_grow() -> None:
    """It fits the small group (at its max) and a bigger one at 0 of 4: before, the small one took it
    ("already at max", forever)."""
    shapes = {"eks:ml/small": shape(), "eks:ml/big": shape(G5_12XLARGE, "big")}
    got = assign([WAITING["lab/fits-0"]], shapes, {"eks:ml/small": 0, "eks:ml/big": 4})
    assert list(got.owners) == ["eks:ml/big"]
    both = assign([WAITING["lab/fits-0"]], shapes, {"eks:ml/small": 1, "eks:ml/big": 4})
    assert list(both.owners) == ["eks:ml/small"]  # with room, the fewest GPUs per node still wins
    full = assign([WAITING["lab/fits-0"]], shapes, {"eks:ml/small": 0, "eks:ml/big": 0})
    assert list(full.owners) == ["eks:ml/small"]  # nobody can grow: it asks where it fits best


def test_pods_spill_to_the_next_group_when_one_runs_out_of_room() -> None:
    pods = [WAITING["lab/fits-0"].model_copy(update={"name": f"fits-{i}"}) for i in range(5)]
    shapes = {"eks:ml/small": shape(), "eks:ml/big": shape(G5_12XLARGE, "big")}
    got = assign(pods, shapes, {"eks:ml/small": 2, "eks:ml/big": 4})
    assert {k: len(v) for k, v in got.owners.items()} == {"eks:ml/small": 2, "eks:ml/big": 3}


def test_pods_that_need_a_node_each_are_whole_node_work() -> None:
    """Four replicas with required anti-affinity to themselves per hostname: one node each, asked for in
    one change (the packing reads `whole_node`)."""
    solo = [p for p in WAITING.values() if p.owner == "solo"]
    assert len(solo) == 4 and all(p.one_per_node for p in solo)
    got = assign(solo, {"eks:ml/big": shape(G5_12XLARGE, "big")}, {"eks:ml/big": 4})
    assert [(w.name, w.whole_node) for w in got.owners["eks:ml/big"]] == [(p.key, True) for p in solo]
    fits_two = assign([WAITING["lab/fits-0"]], {"eks:ml/big": shape(G5_12XLARGE, "big")}, {})
    assert [w.whole_node for w in fits_two.owners["eks:ml/big"]] == [False]


def test_daemonsets_that_would_run_on_the_node_take_their_share() -> None:
    """The device plugin tolerates the GPU taint (it runs there); the logger does not (it does not)."""
    daemonsets = cluster_pods("ml", PODS, pages=1).daemonsets
    assert sorted(d.name for d in daemonsets) == ["logger", "nvidia-device-plugin"]
    left = usable(shape(), daemonsets)
    assert left["cpu"] == pytest.approx(3.42) and left["pods"] == 57
    pod = WAITING["lab/fits-0"].model_copy(update={"requests": (("cpu", 3.5),)})
    assert misfit(pod, shape()) is None
    assert misfit(pod, shape(), daemonsets) == "cpu 3.5 > 3.42 allocatable"


def test_extended_resources_a_node_does_not_offer_do_not_fit() -> None:
    efa = WAITING["lab/fits-0"].model_copy(update={"requests": (("vpc.amazonaws.com/efa", 1.0),)})
    assert misfit(efa, shape()) == "vpc.amazonaws.com/efa 1 > 0 allocatable"
    assert fits(efa, shape().model_copy(update={"allocatable": {**shape().allocatable, "vpc.amazonaws.com/efa": 4.0}}))
    assert fits(efa, NodeShape(gpus=1))  # a shape without allocatable (a plain ASG) checks GPUs only


def test_absurd_quantities_are_unfit_never_a_crash() -> None:
    for requests in ((("cpu", math.inf),), (("memory", 1e-320),), (("cpu", 1e308),)):
        pod = WAITING["lab/fits-0"].model_copy(update={"requests": requests})
        assign([pod], {"g": shape()}, {"g": 1})  # no OverflowError
    huge = WAITING["lab/fits-0"].model_copy(update={"gpus": math.inf})
    assert misfit(huge, shape()) == "inf GPUs > 1 per node"


# ---- properties ----

_SELECTORS = [(), (("eks.amazonaws.com/nodegroup", "a"),), (("topology.kubernetes.io/zone", "z1"),)]
_pods = st.builds(
    lambda i, gpus, cpu, mem, prio, sel, one, tol: WaitingPod(
        namespace="ns",
        name=f"p{i}",
        gpus=gpus,
        requests=tuple(sorted({"cpu": cpu, "memory": mem}.items())),
        priority=prio,
        node_selector=sel,
        one_per_node=one,
        tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),) if tol else (),
        affinity=(SelectorTerm(expressions=(("kubernetes.io/arch", "In", ("amd64",)),)),) if i % 5 == 0 else (),
    ),
    st.integers(0, 10_000),
    st.sampled_from([0.5, 1, 2, 4, 8, math.inf]),
    st.sampled_from([0.1, 1, 4, 47, 200, 1e-320, math.inf]),
    st.sampled_from([GIB, 16 * GIB, 1e12, 1e400]),
    st.integers(-20, 5),
    st.sampled_from(_SELECTORS),
    st.booleans(),
    st.booleans(),
)
_shapes = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.builds(
        lambda t, zones, group: shape(t, group, zones),
        st.sampled_from([G5_XLARGE, G5_12XLARGE]),
        st.sampled_from([("z1",), ("z2",), ("z1", "z2")]),
        st.sampled_from(["a", "b"]),
    ),
    max_size=3,
)


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(_pods, max_size=25, unique_by=lambda p: p.name),
    _shapes,
    st.dictionaries(st.sampled_from("abc"), st.integers(0, 5)),
)
def test_assignment_invariants(pods: list[WaitingPod], shapes: dict[str, NodeShape], room: dict[str, int]) -> None:
    """A pod owned by a group fits it; each pod counts once (owned, told, expendable, or another
    autoscaler's: its selectors match no managed group); a told pod is never owned; expendable pods are
    neither."""
    got = assign(pods, shapes, room)
    by_name = {p.key: p for p in pods}
    owned = [(key, w) for key, ws in got.owners.items() for w in ws]
    for key, w in owned:
        assert fits(by_name[w.name], shapes[key])
        assert w.whole_node or not by_name[w.name].one_per_node
    names = [w.name for _, w in owned]
    assert len(names) == len(set(names))
    assert len(names) + sum(u.count for u in got.unfit) + got.expendable + got.elsewhere == len(pods)
    assert got.expendable == sum(1 for p in pods if p.priority < -10)
    for p in pods:
        if p.key not in names and p.priority >= -10:
            assert all(not fits(p, s) for s in shapes.values())


def test_a_daemonset_kept_off_gpu_nodes_is_not_charged_to_them() -> None:
    """Found by the probe of issue 28: a DaemonSet's pods carry only the controller's pin to their node
    (their template's node affinity is replaced), so one kept off GPU nodes looked like it ran there and
    a pod that fits (cpu 3 on a g5.xlarge's 3.92) was told it fits no group. The DaemonSets' own templates
    say where they run."""
    from gpufleet.kubernetes.pods import daemonsets_of

    template = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "node-type", "operator": "In", "values": ["cpu"]}]}
                    ]
                }
            }
        },
        "containers": [{"name": "agent", "resources": {"requests": {"cpu": "1"}}}],
        "tolerations": [{"operator": "Exists"}],  # node agents tolerate every taint
    }
    ds = {"metadata": {"namespace": "ops", "name": "cpu-agent"}, "spec": {"template": {"spec": template}}}
    pinned = {  # one of its pods as the API lists it
        "metadata": {
            "namespace": "ops",
            "name": "cpu-agent-x1",
            "uid": "u1",
            "ownerReferences": [{"kind": "DaemonSet", "name": "cpu-agent", "uid": "d1"}],
        },
        "spec": {
            "nodeName": "ip-10-0-0-1.ec2.internal",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ip-10-0-0-1"]}]}
                        ]
                    }
                }
            },
            "containers": template["containers"],
            "tolerations": template["tolerations"],
        },
        "status": {"phase": "Running"},
    }
    pod = WaitingPod(
        namespace="serving",
        name="infer-0",
        gpus=1,
        requests=(("cpu", 3.0), ("nvidia.com/gpu", 1.0)),
        tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),),
    )
    assert misfit(pod, shape()) is None
    from_pods = cluster_pods("ml", [pinned], 1).daemonsets
    assert "cpu 3 > 2.92" in str(misfit(pod, shape(), from_pods))  # the pods' view charges it (the probe's case)
    assert misfit(pod, shape(), daemonsets_of([ds])) is None
