"""Waiting GPU work packed onto a group's node shape: how many nodes, which groups can host a pod, and a
reason that names what waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.models import WaitingWork
from gpufleet.kubernetes.pods import SelectorTerm, Toleration, WaitingPod
from gpufleet.scaling.demand import NodeShape, as_work, describe_waiting, fits, pack

NOW = datetime(2026, 11, 23, 9, 4, tzinfo=UTC)


def pod(gpus: float, name: str = "p", waited_min: int = 1, **kw: object) -> WaitingPod:
    return WaitingPod(namespace="ns", name=name, gpus=gpus, since=NOW - timedelta(minutes=waited_min), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sizes", "per_node", "free", "booting", "new", "on_existing"),
    [
        ([8, 8, 4], 8, [], 0, 3, 0),  # the example: 2x8 + 1x4 on 8-GPU nodes from zero
        ([8, 8, 4], 8, [4], 0, 2, 1),  # the 4-GPU pod reuses an existing node's room
        ([8, 8, 4], 8, [], 2, 1, 0),  # two nodes already booting for it
        ([1] * 16, 8, [], 0, 2, 0),
        ([3, 3, 3, 3, 2, 2], 8, [], 0, 2, 0),  # first-fit decreasing: 3+3+2, 3+3+2
        ([], 8, [], 0, 0, 0),
        ([0.5, 0.5], 1, [], 0, 1, 0),  # shared GPUs
    ],
)
def test_pack(sizes: list[float], per_node: float, free: list[float], booting: int, new: int, on_existing: int) -> None:
    p = pack(sizes, per_node, free, booting)
    assert (p.new_nodes, p.placed_on_existing, p.unplaceable) == (new, on_existing, 0)


def test_an_item_larger_than_a_node_is_named_not_packed() -> None:
    assert pack([16, 2], 8).unplaceable == 1
    assert pack([16, 2], 8).new_nodes == 1


@given(st.lists(st.integers(1, 8), max_size=40), st.sampled_from([1, 2, 4, 8]))
def test_packing_is_enough_and_never_more_than_one_node_per_item(sizes: list[int], per_node: int) -> None:
    p = pack(sizes, per_node)
    fitting = [s for s in sizes if s <= per_node]
    assert p.new_nodes * per_node >= sum(fitting)
    assert p.new_nodes <= len(fitting)
    assert p.unplaceable == len(sizes) - len(fitting)


SHAPE = NodeShape(
    gpus=8,
    labels=(("eks.amazonaws.com/nodegroup", "train-gpu"), ("node.kubernetes.io/instance-type", "p4d.24xlarge")),
    taints=(("nvidia.com/gpu", "true", "NoSchedule"),),
)
GPU_TOLERATION = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


@pytest.mark.parametrize(
    ("waiting", "expected"),
    [
        (pod(8, tolerations=(GPU_TOLERATION,)), True),
        (pod(8), False),  # the GPU taint is not tolerated
        (pod(16, tolerations=(GPU_TOLERATION,)), False),  # larger than a node
        (pod(1, tolerations=(Toleration(operator="Exists"),)), True),  # tolerates everything
        (pod(1, tolerations=(Toleration(key="nvidia.com/gpu", value="true"),)), True),  # Equal, any effect
        (pod(1, tolerations=(GPU_TOLERATION,), node_selector=(("eks.amazonaws.com/nodegroup", "other"),)), False),
        (
            pod(
                1,
                tolerations=(GPU_TOLERATION,),
                affinity=(
                    SelectorTerm(expressions=(("node.kubernetes.io/instance-type", "In", ("g5.48xlarge",)),)),
                    SelectorTerm(expressions=(("node.kubernetes.io/instance-type", "In", ("p4d.24xlarge",)),)),
                ),
            ),
            True,  # terms are ORed
        ),
        (
            pod(
                1,
                tolerations=(GPU_TOLERATION,),
                affinity=(SelectorTerm(expressions=(("karpenter.sh/nodepool", "Exists", ()),)),),
            ),
            False,
        ),
        (
            pod(1, tolerations=(GPU_TOLERATION,), affinity=(SelectorTerm(expressions=(("gpus", "Gt", ("4",)),)),)),
            False,  # no such label: Gt does not hold
        ),
    ],
)
def test_fits(waiting: WaitingPod, expected: bool) -> None:
    """Also: a term pinned to a node by matchFields, and an empty term, match no new node."""
    assert fits(waiting, SHAPE) is expected


def test_the_reason_names_what_waits() -> None:
    pods = [as_work(pod(8, "a", 4)), as_work(pod(8, "b", 2)), as_work(pod(4, "c", 1))]
    assert describe_waiting(pods, NOW) == "3 pods (2x8 GPUs, 1x4) unschedulable for 4 min"
    assert describe_waiting([as_work(pod(0.5, "d", 0))], NOW) == "1 pod (1x0.5 GPUs) unschedulable for 0 min"
    assert describe_waiting([], NOW) == "no pods waiting"
    jobs = [as_work(pod(4, "j1", 9)), as_work(pod(4, "j2", 3))]
    assert describe_waiting(jobs, NOW, "job") == "2 jobs (2x4 GPUs) waiting for 9 min"
    queued = [WaitingWork(name="queue jobs", gpus=8, count=12)]
    assert describe_waiting(queued, NOW, "message") == "12 messages (12x8 GPUs) waiting"


def _one_by_one(sizes: list[float], per_node: float, free: list[float], booting: int) -> tuple[int, int]:
    """First-fit decreasing, item by item: the reference the batched pack() must equal."""
    bins, new, existing = [*free, *([per_node] * booting)], 0, 0
    for size in sorted((s for s in sizes if s <= per_node), reverse=True):
        slot = next((i for i, room in enumerate(bins) if room + 1e-9 >= size), None)
        if slot is None:
            bins.append(per_node)
            slot, new = len(bins) - 1, new + 1
        bins[slot] -= size
        existing += slot < len(free)
    return new, existing


@given(
    st.lists(st.sampled_from([0.25, 0.5, 1, 2, 3, 4, 8, 16]), max_size=60),
    st.sampled_from([4, 8]),
    st.lists(st.sampled_from([0, 0.5, 1, 2, 4]), max_size=5),
    st.integers(0, 3),
)
def test_batched_packing_equals_first_fit_one_by_one(
    sizes: list[float], per_node: int, free: list[float], booting: int
) -> None:
    p = pack(sizes, per_node, free, booting)
    assert (p.new_nodes, p.placed_on_existing) == _one_by_one(sizes, per_node, free, booting)


def test_a_pod_pinned_to_a_node_or_with_an_empty_term_fits_no_group() -> None:
    pinned = pod(1, tolerations=(GPU_TOLERATION,), affinity=(SelectorTerm(fields=True),))
    empty = pod(1, tolerations=(GPU_TOLERATION,), affinity=(SelectorTerm(),))
    assert not fits(pinned, SHAPE) and not fits(empty, SHAPE)
