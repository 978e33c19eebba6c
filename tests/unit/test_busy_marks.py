"""Busy marks and the protection the scaler keeps for them (domain/busy.py, issue 41): table tests of the
rules and properties that hold for any table and fleet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.busy import OWNED_PREFIX, BusyTable, plan_protection, read_table, with_marks
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, InstanceObservation

NOW = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
ROLE = "AROAWORKERROLEID"


def group(name: str, *instances: tuple[str, bool, str]) -> GroupObservation:
    """An ASG-backed group: (instance id, protected, lifecycle state) each."""
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.ASG, name=name),
        min_size=0,
        max_size=10,
        desired=len(instances),
        asg_name=name,
        instances=tuple(
            InstanceObservation(instance_id=i, protected_from_scale_in=p, lifecycle_state=s) for i, p, s in instances
        ),
    )


def mark(iid: str, asg: str = "jobs", since: str = "2026-12-04T02:00:00Z") -> dict[str, str]:
    return {"node": f"{ROLE}:{iid}", "instance": iid, "asg": asg, "since": since}


def owned(iid: str, asg: str = "jobs") -> dict[str, str]:
    return {"node": OWNED_PREFIX + iid, "asg": asg}


def test_a_mark_is_taken_from_its_key_only() -> None:
    """The item's own `instance` attribute may name any node: only the writer's aws:userid counts."""
    table = read_table([{"node": f"{ROLE}:i-aaa", "instance": "i-victim", "asg": "jobs"}])
    assert dict(table.marked) == {"i-aaa": f"{ROLE}:i-aaa"}


@pytest.mark.parametrize("key", ["i-aaa", "AROA:i-a:b", ":i-aaa", "AROA:", "AROA/x:i-aaa", "AROA:botocore-session"])
def test_keys_no_instance_profile_writes_are_never_marks(key: str) -> None:
    table = read_table([{"node": key}])
    assert table.marked == {} and table.foreign == (key,)


def test_the_scalers_records_and_times() -> None:
    table = read_table([owned("i-aaa"), mark("i-bbb"), mark("i-ccc", since="yesterday")])
    assert dict(table.owned) == {"i-aaa": "jobs"}
    assert dict(table.marked_since) == {"i-bbb": datetime(2026, 12, 4, 2, 0, tzinfo=UTC)}  # a bad time: none


# (instance protected?, marked?, ours?) -> what the plan does with it
CASES = [
    ((False, True, False), "protect"),
    ((False, True, True), "protect"),  # someone cleared what we set while the job runs: set again
    ((True, True, False), "none"),  # protected by someone else and marked: left alone, never ours to clear
    ((True, True, True), "none"),
    ((True, False, True), "clear"),  # the job ended: clear what we set
    ((True, False, False), "unexplained"),  # nobody explains it: kept, told
    ((False, False, True), "forget"),  # our record of protection that is gone
    ((False, False, False), "none"),
]


@pytest.mark.parametrize(("state", "expected"), CASES)
def test_each_instance_by_the_rules(state: tuple[bool, bool, bool], expected: str) -> None:
    is_protected, is_marked, is_ours = state
    items = ([mark("i-aaa")] if is_marked else []) + ([owned("i-aaa")] if is_ours else [])
    plan = plan_protection([group("jobs", ("i-aaa", is_protected, "InService"))], read_table(items), NOW)
    got = {
        "protect": plan.protect == {"jobs": ("i-aaa",)},
        "clear": plan.clear == {"jobs": ("i-aaa",)},
        "unexplained": plan.unexplained == {"asg:jobs": ("i-aaa",)},
        "forget": plan.forget == ("i-aaa",),
    }
    assert [k for k, v in got.items() if v] == ([] if expected == "none" else [expected])


def test_a_node_not_in_service_is_not_touched() -> None:
    plan = plan_protection([group("jobs", ("i-aaa", False, "Pending:Wait"))], read_table([mark("i-aaa")]), NOW)
    assert plan.protect == {} and not plan.changes


def test_a_record_of_a_group_not_read_now_is_kept() -> None:
    """Its group left management (or was not read this tick): forgetting it would leave our protection
    with nobody to clear it."""
    plan = plan_protection([group("other", ("i-bbb", False, "InService"))], read_table([owned("i-aaa")]), NOW)
    assert plan.forget == ()


def test_marks_of_nodes_gone_from_their_group_and_old_marks() -> None:
    items = [mark("i-gone"), mark("i-old", since="2026-12-02T00:00:00Z"), mark("i-elsewhere", asg="unmanaged")]
    plan = plan_protection([group("jobs", ("i-old", True, "InService"))], read_table(items), NOW)
    assert plan.gone == ("i-gone",)  # i-elsewhere names a group not read: left alone
    assert dict(plan.stale) == {"asg:jobs": ("i-old",)}


def test_a_marked_node_counts_as_protected() -> None:
    obs = with_marks(group("jobs", ("i-aaa", False, "InService"), ("i-bbb", False, "InService")), {"i-aaa"})
    assert [i.protected_from_scale_in for i in obs.instances] == [True, False]


ids = st.sampled_from([f"i-{n:03d}" for n in range(6)])


@given(
    st.lists(st.tuples(ids, st.booleans()), unique_by=lambda t: t[0], max_size=6),
    st.sets(ids),
    st.sets(ids),
)
def test_never_clears_what_a_mark_explains_or_someone_else_set(
    instances: list[tuple[str, bool]], marked: set[str], ours: set[str]
) -> None:
    items = [mark(i) for i in marked] + [owned(i) for i in ours]
    obs = group("jobs", *((i, p, "InService") for i, p in instances))
    plan = plan_protection([obs], read_table(items), NOW)
    cleared = set(plan.clear.get("jobs", ()))
    assert not cleared & marked and cleared <= ours
    assert set(plan.protect.get("jobs", ())) <= marked
    assert not set(plan.forget) & marked
    told = set(plan.unexplained.get("asg:jobs", ()))
    assert told == {i for i, p in instances if p and i not in marked and i not in ours}


def test_an_empty_table_changes_nothing() -> None:
    plan = plan_protection([group("jobs", ("i-aaa", False, "InService"))], BusyTable(), NOW - timedelta(days=1))
    assert not plan.changes and plan.unexplained == {}
