"""Pods in the API's own JSON -> the GPU work that waits, and the nodes that run GPU pods."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpufleet.kubernetes.pods import (
    WaitingPod,
    gpu_request,
    nodes_running_gpu_pods,
    nodes_running_work,
    waiting_pod,
    waiting_pods,
)

PODS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "kubernetes" / "pods-pending-gpu.json").read_text()
)["items"]


def test_only_unschedulable_gpu_pods_wait() -> None:
    """Left out: a DaemonSet's pod, one with a nominated node, a CPU-only one, a running, a finished and a
    scheduling-gated pod (it waits for its gate, not for capacity)."""
    found = waiting_pods(PODS)
    assert [(p.key, p.gpus) for p in found] == [("team-a/train-llm-0", 8.0), ("team-b/serve-7d9f-abcde", 4.0)]
    train = found[0]
    assert train.since == datetime(2026, 11, 23, 9, 0, 1, tzinfo=UTC)
    assert train.node_selector == (("eks.amazonaws.com/nodegroup", "train-gpu"),)
    assert [t.key for t in train.tolerations] == ["nvidia.com/gpu", "node.kubernetes.io/not-ready"]


@pytest.mark.parametrize(
    ("containers", "init", "expected"),
    [
        ([{"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"}], [], 3.0),  # app containers add up
        ([{"nvidia.com/gpu": "1"}], [{"nvidia.com/gpu": "4"}], 4.0),  # a larger init container wins
        ([{"nvidia.com/gpu": "4"}], [{"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}], 4.0),  # init run one by one
        ([{"cpu": "4"}], [], 0.0),
        ([{"nvidia.com/gpu": "lots"}], [], 0.0),  # garbage is no demand, not a crash
        ([{"nvidia.com/gpu": "-3"}], [], 0.0),
    ],
)
def test_effective_request(containers: list[dict[str, str]], init: list[dict[str, str]], expected: float) -> None:
    spec = {
        "containers": [{"name": f"c{i}", "resources": {"limits": r}} for i, r in enumerate(containers)],
        "initContainers": [{"name": f"i{i}", "resources": {"requests": r}} for i, r in enumerate(init)],
    }
    assert gpu_request(spec) == expected


def test_shared_gpu_resources_count_in_gpus() -> None:
    """vGPU units and MIG slices are converted by the cluster's table (units per GPU)."""
    spec = {"containers": [{"name": "c", "resources": {"limits": {"k8s.amazonaws.com/vgpu": "5"}}}]}
    assert gpu_request(spec) == 0.0
    assert gpu_request(spec, {"nvidia.com/gpu": 1, "k8s.amazonaws.com/vgpu": 10}) == 0.5
    mig = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "7"}}}]}
    assert gpu_request(mig, {"nvidia.com/mig-1g.10gb": 7}) == 1.0


def test_nodes_running_gpu_pods_are_named_whatever_their_metrics() -> None:
    assert nodes_running_gpu_pods(PODS) == {"ip-10-0-1-7.ec2.internal"}  # the finished pod's node is free
    assert nodes_running_work(PODS) == {"ip-10-0-1-7.ec2.internal"}  # the others are unbound


_JSON = st.recursive(
    st.none() | st.booleans() | st.text() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
)


@given(_JSON)
def test_any_document_is_demand_or_nothing(doc: Any) -> None:
    """A malformed pod is never a crash: it is waiting demand with GPUs > 0, or nothing."""
    for pod in (doc if isinstance(doc, dict) else {}, {"spec": doc, "status": doc, "metadata": doc}):
        found = waiting_pod(pod)
        assert found is None or found.gpus > 0
        assert isinstance(nodes_running_gpu_pods([pod]), set)


def _waiting_since(at: str) -> dict[str, Any]:
    """The fixture's first waiting pod with its PodScheduled=False turned at `at`."""
    pod = json.loads(json.dumps(PODS[0]))
    pod["status"]["conditions"][0]["lastTransitionTime"] = at
    return pod


@pytest.mark.parametrize(
    "at",
    [
        "9999-12-31T23:59:59Z",  # the fuzzer's find
        "2100-01-01T00:00:00Z",  # the first instant past the range
        "1969-12-31T23:59:59Z",
        "0001-01-01T00:00:00+01:00",  # out of range, and would overflow if moved to UTC
        "9999-12-31T23:59:59-01:00",
    ],
)
def test_a_transition_time_out_of_range_is_unknown_and_the_pod_still_waits(at: str) -> None:
    """Out of 1970-2100 (the rule every timestamp follows, gpufleet.domain.values) the time is unknown, as an
    unparsable one is: the pod's GPU demand stands, and the rest of the cluster is read."""
    found = waiting_pods([_waiting_since(at), PODS[1]])
    assert [(p.key, p.gpus, p.since) for p in found][:1] == [("team-a/train-llm-0", 8.0, None)]
    assert [p.key for p in found] == ["team-a/train-llm-0", "team-b/serve-7d9f-abcde"]


def test_a_transition_time_with_an_offset_is_read_in_utc() -> None:
    found = waiting_pod(_waiting_since("2026-11-23T10:00:01+01:00"))
    assert found is not None
    assert (found.since, found.since.utcoffset() if found.since else None) == (
        datetime(2026, 11, 23, 9, 0, 1, tzinfo=UTC),
        timedelta(0),
    )


def test_a_waiting_pod_holds_only_sane_times() -> None:
    with pytest.raises(ValidationError, match="timestamp outside 1970-2100"):
        WaitingPod(namespace="a", name="p", gpus=1, since=datetime(9999, 12, 31, tzinfo=UTC))
    with pytest.raises(ValidationError, match="timezone"):
        WaitingPod(namespace="a", name="p", gpus=1, since=datetime(2026, 11, 23))  # naive on purpose
