"""HyperPod's node states through the real scaler on moto server (issue 42; node states set by the emulation,
rehearsal.moto_hyperpod.set_node_status): the Slurm backlog scales the group 0 -> 2, and while those two
nodes run their deep health checks (DeepHealthCheckInProgress) the same backlog, read again after the
cooldown and the warm-up, asks for nothing more; a node in Failure (HyperPod's automatic node recovery
replaces it within the same count) is not replaced by a count increase. Before, TargetCount went 2 -> 4."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import boto3
import pytest

from gpufleet.domain import defaults
from rehearsal import fleet
from tests.integration.conftest import Fleet
from tests.integration.test_hyperpod_moto import DIMS, T0, _group, _nodes, _own, _put, _tick, hyperpod_fleet

pytestmark = pytest.mark.integration


@pytest.fixture
def hyperpod(aws: str, tmp_path: Path) -> Fleet:
    """test_hyperpod_moto's cluster and policy: gpu-workers at 0 of max 4, sized by Slurm's backlog."""
    return hyperpod_fleet(aws, tmp_path)


def _set_status(f: Fleet, nodes: list[str], status: str) -> None:
    """What HyperPod would say of the nodes."""
    assert fleet.set_hyperpod_node_status(f.endpoint, "slurm-a", nodes, status) == len(nodes)


def _grown_to_two(f: Fleet) -> list[str]:
    sm, cw = boto3.client("sagemaker"), f.clients.cloudwatch
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 16, T0 - timedelta(minutes=1), _own(sm))
    out = _tick(f, T0, 1)
    assert out["action"] == "scale-out" and out["outcome"] == "applied", out
    assert _group(sm)["TargetCount"] == 2
    return _nodes(sm)


@pytest.mark.parametrize("status", ["DeepHealthCheckInProgress", "SystemUpdating"])
def test_nodes_in_their_checks_are_not_asked_for_again(hyperpod: Fleet, status: str) -> None:
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    nodes = _grown_to_two(hyperpod)
    _set_status(hyperpod, nodes, status)
    t1 = T0 + timedelta(minutes=10)  # past the cooldown and the warm-up
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 16, t1 - timedelta(minutes=1), _own(sm))
    out = _tick(hyperpod, t1, 2)
    assert out["action"] == "hold" and "2 node(s) booting will take them" in out["reason"], out
    assert _group(sm)["TargetCount"] == 2


def test_a_failure_node_is_not_replaced_by_a_count_increase(hyperpod: Fleet) -> None:
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    nodes = _grown_to_two(hyperpod)
    _set_status(hyperpod, nodes[:1], "Failure")
    t1 = T0 + timedelta(minutes=10)
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 8, t1 - timedelta(minutes=1), _own(sm))  # its job, requeued
    out = _tick(hyperpod, t1, 2)
    assert out["action"] == "hold" and "1 node(s) booting will take them" in out["reason"], out
    assert _group(sm)["TargetCount"] == 2
