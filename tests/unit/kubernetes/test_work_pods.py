"""Which pods are work on the node they are bound to (kubernetes.pods.pod_work): any bound, unfinished pod,
GPU or not, but a DaemonSet's, a mirror (static) pod, or one its owner marks safe to lose. A node that runs
work is never a victim, whatever its GPU metrics say.

The defect it reproduces: only pods that ask for GPUs counted, so consolidation by attrition cordoned a node
whose one pod was another team's CPU-only batch Job and terminated it the next tick with the pod Running."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.kubernetes.pods import ClusterPods, PodTally, PodWork, nodes_running_work, pod_work

MIRROR = "kubernetes.io/config.mirror"
SAFE = "cluster-autoscaler.kubernetes.io/safe-to-evict"
KEEP = "karpenter.sh/do-not-disrupt"


def pod(
    node: str | None = "n1",
    phase: str = "Running",
    owner: str | None = "Job",
    annotations: dict[str, str] | None = None,
    gpus: int = 0,
    deleting: bool = False,
    name: str = "p",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "batch", "uid": f"u-{name}"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": owner, "name": "o", "uid": "u-o", "controller": True}]
    if annotations:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T09:00:00Z"
    limits = {"cpu": "2", "memory": "4Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("cpu-only Job pod", pod(), "work"),
    ("gpu pod", pod(gpus=8), "work"),
    ("bare pod (no owner)", pod(owner=None), "work"),
    ("bound, still Pending (pulling its image)", pod(phase="Pending"), "work"),
    ("phase Unknown (node lost contact)", pod(phase="Unknown"), "work"),
    ("terminating (deletionTimestamp): runs until it exits", pod(deleting=True), "work"),
    ("safe-to-evict false", pod(annotations={SAFE: "false"}), "work"),
    ("safe-to-evict True: only the exact 'true' counts", pod(annotations={SAFE: "True"}), "work"),
    ("do-not-disrupt beats safe-to-evict", pod(annotations={SAFE: "true", KEEP: "true"}), "work"),
    ("do-not-disrupt as a duration", pod(annotations={SAFE: "true", KEEP: "5m"}), "work"),
    ("DaemonSet pod", pod(owner="DaemonSet"), "daemonset"),
    ("DaemonSet pod asking for a GPU", pod(owner="DaemonSet", gpus=1), "daemonset"),
    ("DaemonSet pod with do-not-disrupt", pod(owner="DaemonSet", annotations={KEEP: "true"}), "daemonset"),
    ("mirror pod (static pod)", pod(owner=None, annotations={MIRROR: "0f3c9a"}), "mirror"),
    ("mirror pod owned by its Node", pod(owner="Node"), "mirror"),
    ("safe-to-evict true", pod(annotations={SAFE: "true"}), "safe_to_evict"),
    ("safe-to-evict true on a GPU pod", pod(gpus=4, annotations={SAFE: "true"}), "safe_to_evict"),
    ("Succeeded", pod(phase="Succeeded"), "finished"),
    ("Failed", pod(phase="Failed"), "finished"),
    ("unbound (no nodeName)", pod(node=None, phase="Pending"), "unbound"),
    ("empty nodeName", pod(node=""), "unbound"),
]


@pytest.mark.parametrize(("what", "doc", "expected"), CASES, ids=[c[0] for c in CASES])
def test_which_pods_are_work(what: str, doc: dict[str, Any], expected: str) -> None:
    assert pod_work(doc) is PodWork(expected)
    assert nodes_running_work([doc]) == ({"n1"} if expected == "work" else set())


def test_a_node_whose_only_pod_is_a_cpu_job_runs_work_in_the_listing() -> None:
    """Through the tally the reader reduces each page with: the CPU Job's node runs work, the node with only
    a DaemonSet's and a mirror pod does not; GPUs held are still GPUs (the CPU Job holds none)."""
    items = [
        pod("n-cpu", name="etl"),
        pod("n-gpu", owner=None, gpus=2, name="train"),
        pod("n-idle", owner="DaemonSet", name="dcgm"),
        pod("n-idle", owner=None, annotations={MIRROR: "x"}, name="kube-proxy-n-idle"),
    ]
    tally = PodTally("ml")
    tally.add(items)
    found = tally.result(pages=1)
    assert found.work_nodes == {"n-cpu", "n-gpu"}
    assert found.gpu_nodes == {"n-gpu"} and found.gpus_held == {"n-gpu": 2.0}
    assert found.never_victims == {"n-cpu", "n-gpu"}


def test_a_source_that_names_only_gpu_nodes_still_protects_them() -> None:
    """A ClusterPods built with gpu_nodes alone (a source or a fake that names only those): never victims."""
    named = ClusterPods(cluster="ml", gpu_nodes=frozenset({"n1"}))
    assert named.never_victims == {"n1"}


_JSON = st.recursive(
    st.none() | st.booleans() | st.text() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
)


@given(_JSON)
def test_any_document_is_work_or_a_reason_not(doc: Any) -> None:
    """A malformed pod is never a crash: it is work on a named node, or a reason it is not."""
    for p in (doc if isinstance(doc, dict) else {}, {"spec": doc, "status": doc, "metadata": doc}):
        assert isinstance(pod_work(p), PodWork)
        assert all(isinstance(n, str) and n for n in nodes_running_work([p]))
