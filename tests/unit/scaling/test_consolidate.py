"""Consolidation by attrition in the decision core: which nodes drain, which reopen before a launch, and the
properties the issue asks for (nothing removed while it runs work, a drained node that waiting work fits is
reopened before any launch, never more than the policy's share drains)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Demand,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    MarkChannel,
    NodeMark,
    SkipReason,
    WaitingWork,
)
from gpufleet.policy.fleet import Consolidation, GroupSettings, Owner, TargetBand
from gpufleet.scaling.consolidate import plan_marks
from gpufleet.scaling.core import decide_reconcile
from gpufleet.scaling.demand import pack, waiting_sizes
from tests.profiles import examples

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="gpu")
ON = GroupSettings(min=0, max=40, target=TargetBand(low=30, high=80), consolidate=Consolidation.ATTRITION)


def node(i: int, held: float, mark: NodeMark = NodeMark.NONE, util: float | None = None) -> InstanceObservation:
    busy = 60.0 if held else 0.0
    return InstanceObservation(
        instance_id=f"i-{i:02d}",
        node_name=f"ip-10-0-0-{i}.ec2.internal",
        gpus_held=held,
        runs_work=held > 0,
        mark=mark,
        gpu_utilization=busy if util is None else util,
        gpu_memory_percent=busy,
    )


def group(nodes: list[InstanceObservation], waiting: tuple[WaitingWork, ...] = (), **kw: object) -> GroupObservation:
    free = tuple(8.0 for n in nodes if n.in_service and not n.gpus_held and n.mark is NodeMark.NONE)
    demand = Demand(source="cluster ml", waiting=waiting, gpus_per_node=8, free_gpus=free, knows_nodes=True)
    fields: dict[str, object] = {
        "ref": REF,
        "min_size": 0,
        "max_size": 40,
        "desired": len(nodes),
        "instances": tuple(nodes),
        "instance_metrics_loaded": True,
        "demand": demand,
        "marks": MarkChannel.KUBERNETES,
    }
    fields.update(kw)
    return GroupObservation(**fields)  # type: ignore[arg-type]


def decide(obs: GroupObservation, s: GroupSettings = ON, state: GroupState | None = None):  # type: ignore[no-untyped-def]
    return decide_reconcile(obs, s, state or GroupState(), NOW, event_id="e1")


def test_spread_nodes_each_holding_a_little_drain_the_emptiest_first() -> None:
    # 6 nodes hold 2+1+1+3+2+1 = 10 GPUs: 2 nodes hold that packed; the share (50 %) caps it at 3.
    obs = group([node(1, 2), node(2, 1), node(3, 1), node(4, 3), node(5, 2), node(6, 1)])
    d = decide(obs)
    assert d.drain == ("i-02", "i-03", "i-06")
    assert d.action is Action.HOLD and not d.victims
    assert "draining i-02, i-03, i-06 by attrition" in d.reason and "nothing evicted" in d.reason


def test_a_drained_node_that_empties_is_removed_and_an_open_idle_one_is_drained_first() -> None:
    obs = group([node(1, 8), node(2, 0, NodeMark.GPUFLEET), node(3, 0), node(4, 4)])
    d = decide(obs)
    assert d.victims == ("i-02",)  # drained and idle: removed
    assert "i-03" in d.drain  # idle but open: closed first, removed once closed
    assert d.skipped.get(SkipReason.NOT_DRAINED) == 1


def test_waiting_work_reopens_a_drained_node_it_fits_instead_of_launching() -> None:
    obs = group(
        [node(1, 8), node(2, 5, NodeMark.GPUFLEET), node(3, 7, NodeMark.GPUFLEET)], (WaitingWork(name="p", gpus=2),)
    )
    d = decide(obs)
    assert d.undrain == ("i-02",)  # 3 GPUs free there; i-03 has 1
    assert d.action is Action.HOLD and d.desired == 3
    assert "reopening i-02 before any launch" in d.reason


def test_work_no_drained_node_fits_launches_and_leaves_them_drained() -> None:
    obs = group([node(1, 8), node(2, 5, NodeMark.GPUFLEET)], (WaitingWork(name="p", gpus=8),))
    d = decide(obs)
    assert d.action is Action.SCALE_OUT and d.undrain == () and d.drain == ()


def test_a_node_someone_else_cordoned_is_never_counted_drained_nor_reopened() -> None:
    obs = group([node(1, 8), node(2, 1, NodeMark.OTHER), node(3, 1)], (WaitingWork(name="p", gpus=4),))
    d = decide(obs)
    assert "i-02" not in d.undrain and "i-02" not in d.drain


def test_consolidation_off_reopens_every_node_gpufleet_drained() -> None:
    obs = group([node(1, 2, NodeMark.GPUFLEET), node(2, 1, NodeMark.OTHER), node(3, 1)])
    d = decide(obs, ON.model_copy(update={"consolidate": Consolidation.OFF}))
    assert d.undrain == ("i-01",) and "consolidation is off" in d.reason


def test_owner_external_only_advises_the_drain() -> None:
    obs = group([node(1, 2), node(2, 1), node(3, 1), node(4, 3)])
    d = decide(obs, ON.model_copy(update={"owner": Owner.EXTERNAL}))
    assert d.drain == () and d.undrain == ()
    assert d.reason.startswith("advice only (owner: external") and "would drain 2 node(s)" in d.reason


def test_nothing_drains_below_min_nor_when_the_source_cannot_say_what_runs() -> None:
    nodes = [node(1, 1), node(2, 1), node(3, 1), node(4, 1)]
    assert decide(group(nodes), ON.model_copy(update={"min": 4})).drain == ()
    closed = group(nodes)
    assert closed.demand is not None
    closed = closed.model_copy(update={"demand": closed.demand.model_copy(update={"scale_in_closed": "unmapped"})})
    assert decide(closed).drain == ()
    assert decide(group(nodes, marks=None)).drain == ()


def test_min_raised_above_what_stays_open_reopens_the_fullest_drained_node() -> None:
    obs = group([node(1, 8), node(2, 6, NodeMark.GPUFLEET), node(3, 1, NodeMark.GPUFLEET)])
    plan = plan_marks(obs, ON, keep=2)  # 3 nodes, 2 must stay: one drained node too many
    assert plan.undrain == ("i-02",) and "must keep more nodes" in plan.note


def test_a_lone_idle_node_drains_then_goes_so_a_group_reaches_zero() -> None:
    first = decide(group([node(1, 0)]))
    assert first.drain == ("i-01",) and not first.victims  # idle surplus: closed whatever the share
    second = decide(group([node(1, 0, NodeMark.GPUFLEET)]))
    assert second.victims == ("i-01",) and second.desired == 0


def test_after_marks_fail_nothing_drains_and_waiting_work_gets_a_launch() -> None:
    failed = GroupState(marks_failed_at=NOW - timedelta(minutes=3))
    waiting = group([node(1, 8), node(2, 2, NodeMark.GPUFLEET)], (WaitingWork(name="p", gpus=4),))
    d = decide(waiting, state=failed)
    assert d.action is Action.SCALE_OUT and d.undrain == ()  # the drained node's room is not counted
    idle = decide(group([node(1, 8), node(2, 0), node(3, 0)]), state=failed)
    assert idle.drain == () and not idle.victims and "node marks failed at" in idle.reason
    later = GroupState(marks_failed_at=NOW - timedelta(minutes=11))
    assert decide(group([node(1, 8), node(2, 0), node(3, 0)]), state=later).drain == ("i-02", "i-03")


def test_a_node_not_registered_yet_is_never_chosen_to_drain() -> None:
    unnamed = node(2, 0).model_copy(update={"node_name": None})
    d = decide(group([node(1, 8), unnamed, node(3, 0)]))
    assert "i-02" not in d.drain and "i-03" in d.drain


def test_owner_external_still_reopens_the_nodes_gpufleet_closed() -> None:
    obs = group([node(1, 2, NodeMark.GPUFLEET), node(2, 1)])
    off = ON.model_copy(update={"owner": Owner.EXTERNAL, "consolidate": Consolidation.OFF})
    assert decide(obs, off).undrain == ("i-01",)


# ---- properties ----

HELD = st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 7.0, 8.0])
MARKS = st.sampled_from([NodeMark.NONE, NodeMark.NONE, NodeMark.GPUFLEET, NodeMark.OTHER])
NODES = st.lists(st.tuples(HELD, MARKS), min_size=1, max_size=14)
WAITING = st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0]), max_size=6)
SHARE = st.sampled_from([10.0, 25.0, 50.0, 100.0])


def _observed(nodes: list[tuple[float, NodeMark]], waiting: list[float]) -> GroupObservation:
    items = tuple(WaitingWork(name=f"p{k}", gpus=g, since=NOW - timedelta(minutes=2)) for k, g in enumerate(waiting))
    return group([node(k, h, m) for k, (h, m) in enumerate(nodes)], items)


@settings(max_examples=examples(150), deadline=None)
@given(NODES, WAITING, SHARE)
def test_nothing_is_removed_while_it_runs_work(
    nodes: list[tuple[float, NodeMark]], waiting: list[float], share: float
) -> None:
    obs = _observed(nodes, waiting)
    d = decide(obs, ON.model_copy(update={"drain_max_share": share}))
    by_id = {i.instance_id: i for i in obs.instances}
    for victim in d.victims:
        assert not by_id[victim].runs_work and not by_id[victim].gpus_held
        assert by_id[victim].mark is NodeMark.GPUFLEET  # closed to new work before it goes
    assert not set(d.victims) & set(d.drain)


@settings(max_examples=examples(150), deadline=None)
@given(NODES, WAITING, SHARE)
def test_never_more_than_the_share_of_nodes_with_work_drains(
    nodes: list[tuple[float, NodeMark]], waiting: list[float], share: float
) -> None:
    obs = _observed(nodes, waiting)
    d = decide(obs, ON.model_copy(update={"drain_max_share": share}))
    serving = [i for i in obs.instances if i.mark is not NodeMark.OTHER]
    closed = {i.instance_id for i in serving if i.mark is NodeMark.GPUFLEET}
    after = (closed - set(d.undrain) - set(d.victims)) | set(d.drain)
    busy = {i.instance_id for i in serving if i.gpus_held}
    cap = math.floor(len(serving) * share / 100 + 1e-9)
    assert len(after & busy) <= max(cap, len(closed & busy))  # no drain raises it above the share
    assert all(i.instance_id not in busy for i in obs.instances if i.instance_id in d.drain) or len(after & busy) <= cap
    assert not d.drain or not waiting  # nothing new drains while work waits
    assert not set(d.drain) & {i.instance_id for i in obs.instances if i.mark is NodeMark.OTHER}


@settings(max_examples=examples(150), deadline=None)
@given(NODES, WAITING.filter(bool))
def test_a_drained_node_waiting_work_fits_is_reopened_before_any_launch(
    nodes: list[tuple[float, NodeMark]], waiting: list[float]
) -> None:
    obs = _observed(nodes, waiting)
    d = decide(obs)
    if d.action is not Action.SCALE_OUT:
        return
    assert obs.demand is not None
    opened = [i for i in obs.instances if i.instance_id in d.undrain]
    still = [
        i for i in obs.instances if i.mark is NodeMark.GPUFLEET and i.instance_id not in d.undrain and i.in_service
    ]
    rooms = sorted(opened + still, key=lambda i: (-(8 - (i.gpus_held or 0)), i.instance_id))
    every_room = (*obs.demand.free_gpus, *(8 - (i.gpus_held or 0) for i in rooms))
    # Even with every drained node reopened, the waiting work would still need a new node.
    assert pack(waiting_sizes(obs.demand.waiting, 8), 8, every_room).new_nodes >= 1


def test_what_on_call_is_told_of_a_drain_says_what_was_done() -> None:
    from gpufleet.domain.models import Outcome
    from gpufleet.policy.notify import NotificationPolicy
    from gpufleet.scaling.notes import decision_notes

    obs = group([node(1, 2), node(2, 1), node(3, 1), node(4, 3)])
    done = decide(obs).model_copy(update={"outcome": Outcome.APPLIED})
    [told] = decision_notes([done], "us-east-1", NotificationPolicy())
    assert told.title == "eks:ml/gpu: drained 2 node(s) by attrition"
    assert told.facts["nodes drained (no new work; removed once idle)"] == "i-02, i-03"
    dry = decide(obs).model_copy(update={"outcome": Outcome.DRY_RUN})
    assert decision_notes([dry], "us-east-1", NotificationPolicy())[0].title.endswith(
        "would drain 2 node(s) (dry-run) by attrition"
    )


def test_a_drained_node_whose_work_runs_on_swaps_with_an_idle_node_that_can_go() -> None:
    obs = group([node(1, 1, NodeMark.GPUFLEET), node(2, 0)])
    d = decide(obs, ON.model_copy(update={"min": 1}))  # one node may go: the drained one holds it
    assert d.drain == ("i-02",) and d.undrain == ("i-01",)
    assert "reopening i-01 instead (still busy, while an idle node can go now)" in d.reason


def test_a_dry_run_shows_the_removal_that_would_follow_the_drain() -> None:
    obs = group([node(1, 8), node(2, 0), node(3, 0)])
    d = decide(obs, ON.model_copy(update={"dry_run": True}))
    assert d.action is Action.SCALE_IN and set(d.victims) == {"i-02", "i-03"}


def test_a_lowered_max_removes_closed_idle_nodes_by_id_never_a_bare_count() -> None:
    obs = group([node(1, 8), node(2, 8), node(3, 0, NodeMark.GPUFLEET), node(4, 0)])
    d = decide(obs, ON.model_copy(update={"max": 2}))
    assert d.action is Action.SCALE_IN and d.victims == ("i-03",)  # by id; i-04 is closed first, then goes
    assert "i-04" in d.drain


def test_a_holding_that_is_not_a_number_counts_as_a_full_node() -> None:
    from gpufleet.scaling.consolidate import held

    for odd in (float("nan"), float("inf"), 1e300):
        assert held(node(1, 0).model_copy(update={"gpus_held": odd}), 8.0) == 8.0
