"""HyperPod + attrition: a node gpufleet asked Slurm to drain is removable only on Slurm's word (DrainedNode in
the newest landed report, made after the ask), never because time passed; it holds no GPU while idle, drained
or not; the marks of deleted or gone nodes leave the cluster's item."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.aws.hyperpod import HyperPodFleet
from gpufleet.aws.slurm_marks import RequestedDrain
from gpufleet.domain.models import Action, Demand, MarkChannel
from tests.adapters.aws.test_hyperpod import IDLE, NOW, REF, FakeCloudWatch, FakeSageMaker, _decision, _node

LONG_AGO = NOW - timedelta(hours=1)
NODES = [_node("i-1", "Running"), _node("i-2", "Running"), _node("i-3", "Running", "controller")]


class FakeMarker:
    """The marks item of one cluster [fake]: read, and forget (REMOVE), which may fail."""

    def __init__(self, drains: dict[str, RequestedDrain], error: str | None = None) -> None:
        self.drains = dict(drains)
        self.error = error
        self.forgotten: list[set[str]] = []

    def read(self, cluster: str) -> dict[str, RequestedDrain]:
        return dict(self.drains)

    def forget(self, cluster: str, ids: Any) -> None:
        if self.error:
            raise ClientError({"Error": {"Code": self.error, "Message": "no"}}, "UpdateItem")
        self.forgotten.append(set(ids))
        for iid in ids:
            self.drains.pop(iid, None)


def _fleet(
    marker: FakeMarker, drained: dict[str, list[float | None]] | None = None, told: list[str] | None = None
) -> tuple[HyperPodFleet, FakeSageMaker, FakeCloudWatch]:
    sm = FakeSageMaker(list(NODES))
    cw = FakeCloudWatch({"i-1": IDLE, "i-2": IDLE}, drained=drained)
    warn = told.append if told is not None else (lambda _: None)
    fleet = HyperPodFleet(sm, cw, now=lambda: NOW, marker=marker, warn=warn, iam=sm)  # type: ignore[arg-type]
    return fleet, sm, cw


def _marked(fleet: HyperPodFleet) -> dict[str, tuple[bool, float | None]]:
    [obs] = fleet.observe([REF], attrition={REF.key})
    obs = obs.model_copy(update={"demand": Demand(source="metric Slurm/PendingGPUs", gpus_per_node=8)})
    [marked] = fleet.marked([obs], NOW)
    return {i.instance_id: (i.runs_work, i.gpus_held) for i in marked.instances}


def test_a_drain_slurm_never_shows_keeps_the_node_open_however_long_ago_it_was_asked() -> None:
    """scontrol failing every minute: Slurm calls the node plainly idle (IdleNode 1), never drained. It is
    open (a job may land on it any time): not removable, though it holds no GPU."""
    fleet, _, cw = _fleet(FakeMarker({"i-1": RequestedDrain("surplus", LONG_AGO)}))
    assert _marked(fleet) == {"i-1": (True, 0.0), "i-2": (False, 0.0)}
    [request] = cw.requests  # one strict read: IdleNode for both, DrainedNode for the marked one only
    asked = sorted(
        (
            q["MetricStat"]["Metric"]["MetricName"],
            {d["Name"]: d["Value"] for d in q["MetricStat"]["Metric"]["Dimensions"]}.get("InstanceId"),
        )
        for q in request["MetricDataQueries"]
    )
    assert asked == [("DrainedNode", "i-1"), ("IdleNode", "i-1"), ("IdleNode", "i-2"), ("PendingGPUs", None)]


def test_a_drain_slurm_shows_in_the_newest_landed_minute_makes_the_node_removable() -> None:
    fleet, _, _ = _fleet(FakeMarker({"i-1": RequestedDrain("surplus", LONG_AGO)}), drained={"i-1": [1.0, 1.0]})
    assert _marked(fleet)["i-1"] == (False, 0.0)


def test_a_drained_word_missing_from_the_newest_minute_or_older_than_the_ask_does_not_count() -> None:
    resumed = {"i-1": [1.0, 1.0, None]}  # drained two minutes ago, not in the newest report: resumed since
    fleet, _, _ = _fleet(FakeMarker({"i-1": RequestedDrain("surplus", LONG_AGO)}), drained=resumed)
    assert _marked(fleet)["i-1"] == (True, 0.0)
    asked_again = NOW - timedelta(seconds=40)  # after the newest report's minute began: it cannot show it
    fleet, _, _ = _fleet(FakeMarker({"i-1": RequestedDrain("surplus", asked_again)}), drained={"i-1": [1.0]})
    assert _marked(fleet)["i-1"] == (True, 0.0)


def test_the_deleted_nodes_marks_are_removed_and_a_failed_removal_never_fails_the_delete() -> None:
    for error in (None, "ProvisionedThroughputExceededException"):
        told: list[str] = []
        marker = FakeMarker({"i-1": RequestedDrain("surplus", LONG_AGO)}, error)
        fleet, sm, _ = _fleet(marker, drained={"i-1": [1.0]}, told=told)
        [obs] = fleet.observe([REF], attrition={REF.key})
        [obs] = fleet.marked([obs], NOW)
        decision = _decision(Action.SCALE_IN, 2, ("i-1",))
        assert "BatchDeleteClusterNodes" in fleet.delete_nodes(decision, obs)
        assert ("BatchDeleteClusterNodes", {"ClusterName": "slurm-a", "NodeIds": ["i-1"]}) in sm.calls
        assert marker.forgotten == ([{"i-1"}] if error is None else [])
        assert bool(told) is bool(error) and all(error in t for t in told if error)


def test_an_observation_lists_the_whole_cluster_once_and_prunes_the_marks_of_gone_nodes() -> None:
    marker = FakeMarker({"i-1": RequestedDrain("surplus", LONG_AGO), "i-gone": RequestedDrain("x", LONG_AGO)})
    fleet, sm, _ = _fleet(marker)
    [obs] = fleet.observe([REF], attrition={REF.key})
    assert marker.forgotten == [{"i-gone"}]  # i-3, of a group no rule names, is listed: its mark would stay
    assert [i.instance_id for i in obs.instances] == ["i-1", "i-2"] and obs.marks is MarkChannel.SLURM
    lists = [kw for op, kw in sm.calls if op == "ListClusterNodes"]
    assert lists and all("InstanceGroupNameContains" not in kw for kw in lists)


def test_without_marks_each_group_is_listed_by_its_name_and_nothing_is_pruned() -> None:
    marker = FakeMarker({})
    fleet, sm, _ = _fleet(marker)
    fleet.observe([REF], attrition={REF.key})
    assert marker.forgotten == []
    lists = [kw for op, kw in sm.calls if op == "ListClusterNodes"]
    assert lists and all(kw["InstanceGroupNameContains"] == "gpu-workers" for kw in lists)


def test_a_failed_prune_is_said_and_the_observation_goes_on() -> None:
    told: list[str] = []
    marker = FakeMarker({"i-gone": RequestedDrain("x", LONG_AGO)}, error="InternalServerError")
    fleet, _, _ = _fleet(marker, told=told)
    [obs] = fleet.observe([REF], attrition={REF.key})
    assert obs.marks is MarkChannel.SLURM and len(told) == 1 and "i-gone" in told[0]
