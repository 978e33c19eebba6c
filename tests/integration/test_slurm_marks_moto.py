"""The Slurm marks round trip on moto server: SlurmMarker writes the drains gpufleet asks for into the state
table, two groups of one cluster without overwriting each other; the controller's publisher
(ami/slurm_pending_gpus.py read_marks) reads exactly that item; HyperPodFleet's observation of a group that
consolidates by attrition carries them; a reopened node leaves the item, and so does a node that is gone."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import boto3
import pytest

from gpufleet.aws.hyperpod import HyperPodFleet
from gpufleet.aws.slurm_marks import SlurmMarker
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, MarkChannel, NodeMark
from rehearsal import fleet, moto_hyperpod
from tests.integration.conftest import TABLE

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 27, 0, 40, tzinfo=UTC)
A = GroupRef(kind=GroupKind.HYPERPOD, cluster="slurm-a", name="gpu-a")
B = GroupRef(kind=GroupKind.HYPERPOD, cluster="slurm-a", name="gpu-b")
SCRIPT = Path(__file__).resolve().parents[2] / "ami" / "slurm_pending_gpus.py"


def _publisher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slurm_pending_gpus_moto", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["slurm_pending_gpus_moto"] = module
    spec.loader.exec_module(module)
    return module


def _obs(ref: GroupRef) -> GroupObservation:
    return GroupObservation(ref=ref, min_size=0, max_size=4, desired=2, marks=MarkChannel.SLURM)


def test_marker_round_trip_two_groups_of_one_cluster_and_the_publisher_reads_it(aws: str) -> None:
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    clock = [T0]
    marker = SlurmMarker(clients.dynamodb, TABLE, now=lambda: clock[0])
    marker.close(_obs(A), ["i-a1", "i-a2"], "emptiest nodes of gpu-a")
    marker.close(_obs(B), ["i-b1"], "emptiest node of gpu-b")  # the other group: adds, never overwrites
    clock[0] = T0 + timedelta(minutes=5)
    marker.close(_obs(A), ["i-a1"], "asked again")  # already asked: keeps its first reason and time
    drains = marker.read("slurm-a")
    assert sorted(drains) == ["i-a1", "i-a2", "i-b1"]
    assert (drains["i-a1"].reason, drains["i-a1"].at) == ("emptiest nodes of gpu-a", T0)

    marker.reopen(_obs(A), ["i-a2", "i-never-closed"])
    assert sorted(marker.read("slurm-a")) == ["i-a1", "i-b1"]
    publisher = _publisher()  # what the controller node reads, with its own code
    assert publisher.read_marks(boto3.client("dynamodb"), TABLE, "slurm-a") == {
        "i-a1": "emptiest nodes of gpu-a",
        "i-b1": "emptiest node of gpu-b",
    }
    assert publisher.read_marks(boto3.client("dynamodb"), TABLE, "no-such-cluster") == {}


def test_an_attrition_groups_observation_carries_the_marks(aws: str) -> None:
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    sagemaker = boto3.client("sagemaker")
    moto_hyperpod.create_cluster(sagemaker, "slurm-a", "gpu-a", count=2, tags=fleet.MANAGED_TAG)
    marker = SlurmMarker(clients.dynamodb, TABLE, now=lambda: T0)
    hyperpod = HyperPodFleet(sagemaker, clients.cloudwatch, now=lambda: T0, marker=marker)
    [obs] = hyperpod.observe([A], attrition={A.key})
    assert obs.marks is MarkChannel.SLURM and all(i.mark is NodeMark.NONE for i in obs.instances)
    first = obs.instances[0].instance_id
    marker.close(obs, [first, "i-0deleted00000000"], "attrition")  # a node deleted since (its forget lost)
    [obs] = hyperpod.observe([A], attrition={A.key})
    assert {i.instance_id for i in obs.instances if i.mark is NodeMark.GPUFLEET} == {first}
    assert sorted(marker.read("slurm-a")) == [first]  # the whole cluster was listed: the gone node's mark left


def test_a_missing_table_gives_no_marks_channel(aws: str) -> None:
    clients = fleet.Clients.create()
    sagemaker = boto3.client("sagemaker")
    moto_hyperpod.create_cluster(sagemaker, "slurm-a", "gpu-a", count=1, tags=fleet.MANAGED_TAG)
    told: list[str] = []
    marker = SlurmMarker(clients.dynamodb, "no-such-table")
    hyperpod = HyperPodFleet(sagemaker, clients.cloudwatch, marker=marker, warn=told.append)
    [obs] = hyperpod.observe([A], attrition={A.key})
    assert obs.marks is None and len(told) == 1 and "ResourceNotFoundException" in told[0]
