"""What each node holds and whether it is closed, as the pure reading of the API's JSON says: GPUs of the
unfinished pods bound to it, summed per node across pages; a NodeList's cordons and gpufleet's annotation."""

from __future__ import annotations

from typing import Any

from gpufleet.domain.defaults import DRAIN_ANNOTATION
from gpufleet.kubernetes.pods import PodTally, node_states


def bound(name: str, node: str, gpus: int, phase: str = "Running", uid: str | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"name": name, "namespace": "a", "uid": uid or name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


def test_the_tally_sums_gpus_per_node_across_pages_counting_each_pod_once() -> None:
    tally = PodTally("ml")
    tally.add([bound("p1", "n1", 2), bound("p2", "n1", 1), bound("cpu", "n2", 0)])
    tally.add([bound("p1", "n1", 2), bound("p3", "n3", 4), bound("done", "n4", 8, "Succeeded")])  # p1 again
    found = tally.result(pages=2)
    assert found.gpus_held == {"n1": 3.0, "n3": 4.0}  # the CPU pod's and the finished pod's nodes hold none
    assert found.gpu_nodes == {"n1", "n3"}  # the existing callers' view is unchanged


def test_a_node_list_says_whose_cordon_it_is_and_which_instance() -> None:
    items = [
        {"metadata": {"name": "n1", "annotations": {DRAIN_ANNOTATION: "{}"}}, "spec": {"unschedulable": True,
         "providerID": "aws:///us-east-1a/i-0123456789abcdef0"}},
        {"metadata": {"name": "n2"}, "spec": {"unschedulable": True, "providerID": "aws:///us-east-1b/i-02"}},
        {"metadata": {"name": "n3", "annotations": {DRAIN_ANNOTATION: "{}"}}, "spec": {}},  # uncordoned by hand
        {"metadata": {"name": "n4"}, "spec": {"providerID": "kind://docker/kind/n4"}},
        {"metadata": {}},
        "not a node",
    ]  # fmt: skip
    states = node_states(items)
    assert {n: (s.unschedulable, s.ours, s.instance_id) for n, s in states.items()} == {
        "n1": (True, True, "i-0123456789abcdef0"),
        "n2": (True, False, "i-02"),
        "n3": (False, True, None),
        "n4": (False, False, None),
    }
