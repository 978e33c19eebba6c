"""Issue 42: a shared queue's in-flight messages are held by the nodes that hold them (a protected or
busy-marked node holds one; only the rest hold unprotected nodes), and a FIFO queue asks only for the
waiting messages that can start (one message of a message group at a time)."""

from __future__ import annotations

import pytest

from gpufleet.scaling.demand_share import Sharer, fifo_startable, split_backlog, unaccounted_units


def group(key: str, in_service: int, protected: int, *, fallback: bool = False, per_node: int = 1) -> Sharer:
    return Sharer(
        key=key,
        fallback=fallback,
        per_node=per_node,
        nodes_per_unit=1,
        ready=in_service,
        in_service=in_service,
        protected=protected,
    )


@pytest.mark.parametrize(
    ("spot", "fallback", "in_flight", "held"),
    [
        # 7 protected runners hold all 7 messages: the finished runners (spot's 8th, the fallback's) go
        ((8, 7), (1, 0), 7, {"spot": 7, "od": 0}),
        # nobody marks: every in-flight message may be on any node of either group (as before)
        ((8, 0), (1, 0), 7, {"spot": 7, "od": 1}),
        # 5 of 7 accounted for: the 2 nobody places may be on any unprotected node
        ((8, 5), (3, 0), 7, {"spot": 7, "od": 2}),
        # protection beyond the messages (someone else's) keeps its nodes, but holds only what runs
        ((4, 3), (2, 0), 1, {"spot": 1, "od": 0}),
        # no message in flight: nothing is held (protection alone keeps a node from being a victim)
        ((2, 1), (1, 0), 0, {"spot": 0, "od": 0}),
    ],
)
def test_in_flight_messages_are_held_by_the_nodes_that_hold_them(
    spot: tuple[int, int], fallback: tuple[int, int], in_flight: int, held: dict[str, int]
) -> None:
    sharers = [group("spot", *spot), group("od", *fallback, fallback=True)]
    shares = split_backlog(sharers, visible=0, in_flight=in_flight)
    assert {k: s.held_nodes for k, s in shares.items()} == held


def test_protection_never_holds_more_than_without_it() -> None:
    """Fail closed and no wider: the same groups without protection hold at least as many nodes."""
    for protected in range(0, 6):
        for in_flight in range(0, 8):
            marked = [group("a", 5, protected), group("b", 3, 0, fallback=True)]
            plain = [group("a", 5, 0), group("b", 3, 0, fallback=True)]
            with_marks, without = split_backlog(marked, 2, in_flight), split_backlog(plain, 2, in_flight)
            assert all(with_marks[k].held_nodes <= without[k].held_nodes for k in without)


def test_a_protected_node_accounts_for_one_message_however_many_fit() -> None:
    """Fail closed: 2 messages per node, 2 protected nodes, 4 in flight: 2 may be on unprotected nodes."""
    sharers = [group("a", 5, 2, per_node=2)]
    assert unaccounted_units(sharers, 4) == 2
    assert split_backlog(sharers, 0, 4)["a"].held_nodes == 4


def test_a_unit_bigger_than_a_node_is_accounted_for_only_by_all_its_nodes() -> None:
    """A 2-node message whose leader alone marks: its other node stays held."""
    big = Sharer(key="a", per_node=0, nodes_per_unit=2, ready=3, in_service=3, protected=1)
    assert unaccounted_units([big], 1) == 1
    assert split_backlog([big], 0, 1)["a"].held_nodes == 3


@pytest.mark.parametrize(
    ("visible", "in_flight", "groups", "startable"),
    [
        (10, 1, None, 1),  # one group, one in flight: not 10 (the issue); at most one beyond the runners
        (10, 1, 1, 0),  # one group known, its message in flight: nothing can start
        (10, 1, 4, 3),  # 4 groups, 1 in flight: 3 can start
        (2, 0, 4, 2),  # bounded by the messages
        (0, 3, None, 0),  # nothing waits
        (10, 6, 4, 0),  # more in flight than groups (a consumer took a batch of one group): none asked
    ],
)
def test_a_fifo_queue_asks_only_for_what_can_start(
    visible: int, in_flight: int, groups: int | None, startable: int
) -> None:
    assert fifo_startable(visible, in_flight, groups) == startable
