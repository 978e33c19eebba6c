"""The pure rules of a group's demand (scaling.demand_rules) on their own: a backlog datum is a count or
one reason, groups read together stay in the order first seen, and a group whose node shape cannot be
told is named as its kind names it."""

from __future__ import annotations

import math

import pytest

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef
from gpufleet.policy.fleet import DemandSource, GroupSettings, QueueDemand
from gpufleet.scaling.demand_rules import Member, backlog_problem, keys, shape_source, units


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "no datum in the last 5 minutes: is its publisher running?"),
        (math.nan, "the latest datum is nan, not a count of GPUs"),
        (-1.0, "the latest datum is -1, not a count of GPUs"),
        (0.0, None),
        (12.0, None),
    ],
)
def test_a_backlog_datum_is_a_count_or_one_reason(value: float | None, problem: str | None) -> None:
    assert backlog_problem(value) == problem


def _member(name: str, queue: str) -> Member:
    obs = GroupObservation(ref=GroupRef(kind=GroupKind.ASG, name=name), min_size=0, max_size=4, desired=0)
    demand = DemandSource(sqs=QueueDemand(queue_url=f"https://sqs/{queue}"), gpus_per_node=8)
    return obs, GroupSettings(demand=demand), demand


def test_groups_read_together_keep_the_order_they_were_first_seen_in() -> None:
    members = [_member("a", "q2"), _member("b", "q1"), _member("c", "q2")]
    found = units(members, lambda obs, d: d.sqs.queue_url if d.sqs else None)
    assert [keys(u) for u in found] == [["asg:a", "asg:c"], ["asg:b"]]


def test_a_group_named_in_its_cluster_is_a_node_group_of_it() -> None:
    node_group = GroupObservation(
        ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="g"), min_size=0, max_size=1, desired=0
    )
    asg = GroupObservation(ref=GroupRef(kind=GroupKind.ASG, name="g"), min_size=0, max_size=1, desired=0)
    assert shape_source(node_group) == "node group eks:ml/g"
    assert shape_source(asg) == "group asg:g"
