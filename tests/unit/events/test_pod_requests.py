"""What a waiting pod asks of a node: every resource, as the scheduler sums it (sidecars included), its
priority, whether it needs a node of its own, its set; and the DaemonSets a node will also run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.quantity import parse_quantity, show
from gpufleet.kubernetes.pods import PodTally, cluster_pods, pod_requests, waiting_pod, waiting_pods

PODS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "kubernetes" / "pods-fit.json").read_text()
)["items"]
GIB = 2**30


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", 0.5),
        ("4", 4.0),
        ("16Gi", 16 * GIB),
        ("1Ki", 1024.0),
        ("2.5k", 2500.0),
        ("1M", 1e6),
        ("1E", 1e18),  # exa, not an exponent
        ("1e3", 1000.0),
        ("1E3", 1000.0),
        ("100u", 1e-4),
        (".5", 0.5),
        ("1e-320", 1e-320),  # tiny, never an OverflowError
        ("1e400", math.inf),  # too big for a float: it fits no node
        ("lots", 0.0),
        ("-3", 0.0),
        ("", 0.0),
        (None, 0.0),
        ("9" * 80, 0.0),  # not a quantity the API would store
    ],
)
def test_quantities(text: Any, value: float) -> None:
    assert parse_quantity(text) == value


@given(
    st.text(max_size=40) | st.from_regex(r"[+-]?\d{0,5}(\.\d{0,5})?([eE][+-]?\d{1,6}|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?")
)
def test_any_quantity_is_a_number_never_a_crash(text: str) -> None:
    value = parse_quantity(text)
    assert value >= 0 and not math.isnan(value)
    assert isinstance(show("memory", value), str) and isinstance(show("cpu", value, down=True), str)


def _spec(containers: list[dict[str, str]], init: list[tuple[dict[str, str], bool]]) -> dict[str, Any]:
    return {
        "containers": [{"name": f"c{i}", "resources": {"requests": r}} for i, r in enumerate(containers)],
        "initContainers": [
            {"name": f"i{i}", "resources": {"requests": r}, **({"restartPolicy": "Always"} if side else {})}
            for i, (r, side) in enumerate(init)
        ],
    }


@pytest.mark.parametrize(
    ("containers", "init", "cpu"),
    [
        ([{"cpu": "2"}], [({"cpu": "1"}, True)], 3.0),  # a sidecar runs beside the app: it adds up
        ([{"cpu": "2"}], [({"cpu": "1"}, False)], 2.0),  # a regular init container runs before: the larger
        ([{"cpu": "2"}], [({"cpu": "1"}, True), ({"cpu": "3"}, False)], 4.0),  # init 3 + the sidecar before it
        ([{"cpu": "2"}], [({"cpu": "3"}, False), ({"cpu": "1"}, True)], 3.0),  # the sidecar starts after it
        ([{"cpu": "1"}, {"cpu": "1"}], [({"cpu": "1"}, True), ({"cpu": "1"}, True)], 4.0),
    ],
)
def test_sidecars_count_in_the_effective_request(
    containers: list[dict[str, str]], init: list[tuple[dict[str, str], bool]], cpu: float
) -> None:
    """k8s.io/component-helpers/resource AggregateContainerRequests (KEP-753): before, a sidecar counted
    as a regular init container (max, not sum)."""
    assert pod_requests(_spec(containers, init))["cpu"] == cpu


def test_pod_overhead_and_pod_level_requests() -> None:
    spec = {**_spec([{"cpu": "1", "memory": "1Gi"}], []), "overhead": {"cpu": "250m"}}
    assert pod_requests(spec) == {"cpu": 1.25, "memory": GIB}
    spec["resources"] = {"requests": {"cpu": "4"}}
    assert pod_requests(spec)["cpu"] == 4.25


def test_a_waiting_pod_carries_every_request_its_priority_and_its_set() -> None:
    found = {p.key: p for p in waiting_pods(PODS)}
    infer = found["serving/infer-7d9f8c-abcde"]
    assert dict(infer.requests) == {"cpu": 4.0, "memory": 16 * GIB} and infer.gpus == 1
    assert infer.pod_set == "serving/infer"  # the ReplicaSet's name less the pod-template hash
    assert found["lab/big-cpu-0"].pod_set == "lab/big-cpu"
    assert found["overprov/filler-0"].priority == -11
    side = found["lab/sidecar-0"]
    assert dict(side.requests) == {"cpu": 4.0, "memory": 5 * GIB}  # max(2+1, 3+1) cpu; max(4+1, 2+1) memory


def test_required_self_anti_affinity_or_a_host_port_need_a_node_each() -> None:
    found = {p.key: p for p in waiting_pods(PODS)}
    assert [found[f"serving/solo-0{i}"].one_per_node for i in range(4)] == [True] * 4
    assert not found["lab/fits-0"].one_per_node
    pod = json.loads(json.dumps(next(p for p in PODS if p["metadata"]["name"] == "fits-0")))
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 8080}]
    assert waiting_pod(pod).one_per_node  # type: ignore[union-attr]
    other = json.loads(json.dumps(next(p for p in PODS if p["metadata"]["name"] == "solo-00")))
    other["metadata"]["labels"] = {"app": "not-solo"}  # repels other pods, not its own kind
    assert not waiting_pod(other).one_per_node  # type: ignore[union-attr]


def test_daemonsets_are_kept_one_pod_each_with_their_placement() -> None:
    tally = PodTally("ml")
    tally.add(PODS)
    tally.add(PODS)  # the same pages again: nothing twice
    found = tally.result(2)
    assert len(found.waiting) == len(waiting_pods(PODS))
    plugin, logger = sorted(found.daemonsets, key=lambda d: d.name, reverse=True)
    assert (plugin.name, dict(plugin.requests)) == ("nvidia-device-plugin", {"cpu": 0.5, "memory": 512 * 2**20})
    assert plugin.affinity == ()  # the controller's per-node pin says nothing about a new node
    assert [t.key for t in plugin.tolerations] == ["nvidia.com/gpu"] and logger.tolerations == ()
    assert cluster_pods("ml", PODS, 1).daemonsets == found.daemonsets


def test_absurd_gpu_quantities_are_bounded() -> None:
    """1e-320 GPUs is one unit (extended resources are whole numbers): never an unbounded share."""
    spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1e-320"}}}]}
    assert pod_requests(spec) == {"nvidia.com/gpu": 1.0}
    spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1e400"}}}]}
    assert pod_requests(spec) == {"nvidia.com/gpu": math.inf}
