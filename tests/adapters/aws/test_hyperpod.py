"""The HyperPod adapter against fakes: what moto cannot show (node states other than Running, refused
deletes, an unreadable idle report) is shown here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpufleet.aws.hyperpod import (
    DETAILS_SHAPE,
    SPEC_RENAMED,
    SPEC_SHAPE,
    CountNotLowered,
    DeleteRefused,
    HyperPodFleet,
    update_spec,
)
from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import Action, Decision, Direction, GroupRef, GroupState, Trigger, TriggerKind
from gpufleet.policy.fleet import GroupSettings, IdleThreshold
from gpufleet.scaling.core import decide_request, skip_reason

NOW = datetime(2026, 11, 23, 8, 12, 30, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.HYPERPOD, cluster="slurm-a", name="gpu-workers")
ARN = "arn:aws:sagemaker:us-east-1:123456789012:cluster/abc123def456"
GROUP = {
    "InstanceGroupName": "gpu-workers",
    "InstanceType": "ml.p5.48xlarge",
    "CurrentCount": 3,
    "TargetCount": 3,
    "MinCount": 1,
    "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lcs/", "OnCreate": "on_create.sh"},
    "ExecutionRole": "arn:aws:iam::123456789012:role/hp",
    "ThreadsPerCore": 1,
    "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": 500}}],
    "Status": "InService",
    "DesiredImageId": "ami-0123",
}


# Slurm's controller group (DescribeCluster's SlurmConfig says so) and its one node: the report is read
# from its own namespace only (issue 41).
# A role of its own: a role shared with the workers gives them the controller's aws:userid (<role id>:SageMaker).
CONTROLLER = {**GROUP, "InstanceGroupName": "controller-machine", "InstanceType": "ml.c5.xlarge",
              "ExecutionRole": "arn:aws:iam::123456789012:role/hp-controller",
              "SlurmConfig": {"NodeType": "Controller"}}  # fmt: skip
CONTROLLER_NODE = "i-0c0c0c0c0c0c0c0c0"
ROLE_ID = "AROAHP"


def _node(iid: str, status: str, group: str = "gpu-workers") -> dict[str, Any]:
    return {
        "InstanceId": iid,
        "InstanceGroupName": group,
        "InstanceType": "ml.p5.48xlarge",
        "InstanceStatus": {"Status": status},
    }


class FakeSageMaker:
    """Answers as the API reference says: two pages of nodes, a substring filter, refused deletes."""

    def __init__(self, nodes: list[dict[str, Any]], refuse: dict[str, str] | None = None, orchestrator: Any = None):
        self.nodes = nodes
        self.refuse = refuse or {}
        self.orchestrator = orchestrator
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def describe_cluster(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("DescribeCluster", kw))
        if kw["ClusterName"] != "slurm-a":
            raise ClientError({"Error": {"Code": "ResourceNotFound", "Message": "no"}}, "DescribeCluster")
        other = {**GROUP, "InstanceGroupName": "gpu-workers-2"}
        out = {"ClusterArn": ARN, "ClusterName": "slurm-a", "InstanceGroups": [dict(GROUP), other, dict(CONTROLLER)]}
        if self.orchestrator:
            out["Orchestrator"] = self.orchestrator
        return out

    def list_tags(self, **kw: Any) -> dict[str, Any]:
        return {"Tags": [{"Key": defaults.TAG_MANAGED, "Value": defaults.TAG_MANAGED_VALUE}]}

    def list_cluster_nodes(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("ListClusterNodes", kw))
        everything = [*self.nodes, _node(CONTROLLER_NODE, "Running", CONTROLLER["InstanceGroupName"])]
        found = [n for n in everything if kw.get("InstanceGroupNameContains", "") in n["InstanceGroupName"]]
        start = int(kw.get("NextToken", 0))
        page: dict[str, Any] = {"ClusterNodeSummaries": found[start : start + 2]}
        if start + 2 < len(found):
            page["NextToken"] = str(start + 2)
        return page

    def get_role(self, **kw: Any) -> dict[str, Any]:
        """IAM's GetRole [fake]: the execution role's unique id (the controller's aws:userid begins with it)."""
        self.calls.append(("GetRole", kw))
        return {"Role": {"RoleName": kw["RoleName"], "RoleId": ROLE_ID}}

    def update_cluster(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("UpdateCluster", kw))
        return {"ClusterArn": ARN}

    def batch_delete_cluster_nodes(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("BatchDeleteClusterNodes", kw))
        ok = [i for i in kw["NodeIds"] if i not in self.refuse]
        failed = [{"NodeId": i, "Code": self.refuse[i], "Message": "m"} for i in kw["NodeIds"] if i in self.refuse]
        return {"Successful": ok, "Failed": failed}


# The minutes (offsets from NOW's minute) in which the group's report (its PendingGPUs datum) landed: by
# default every whole minute of the window, not yet the current one.
LANDED = tuple(range(-defaults.HYPERPOD_IDLE_MINUTES - 1, 0))


class FakeCloudWatch:
    """Per instance: the IdleNode minutes Slurm's publisher put, oldest first, the last one the newest whole
    minute before NOW (None: no datum that minute); `current`: a datum in the current, partial minute;
    `reports`: the minutes the group's PendingGPUs landed (its SampleCount is 1 there); `drained`: per
    instance its DrainedNode minutes, as `minutes` (none by default). It answers as
    GetMetricData does: only the minutes in [StartTime, EndTime), newest first, each with its timestamp."""

    def __init__(
        self,
        minutes: dict[str, list[float | None]],
        error: str | None = None,
        current: dict[str, float] | None = None,
        reports: tuple[int, ...] = LANDED,
        drained: dict[str, list[float | None]] | None = None,
    ):
        self.minutes = minutes
        self.drained = drained or {}
        self.current = current or {}
        self.error = error
        self.reports = reports
        self.requests: list[dict[str, Any]] = []

    def report(self) -> dict[datetime, float]:
        end = NOW.replace(second=0)
        return {end + timedelta(minutes=k): 1.0 for k in self.reports}

    def series(self, iid: str, metric: str = defaults.HYPERPOD_IDLE_METRIC) -> dict[datetime, float]:
        end = NOW.replace(second=0)
        values = (self.drained if metric == defaults.HYPERPOD_DRAINED_METRIC else self.minutes).get(iid, [])
        out = {end - timedelta(minutes=len(values) - i): v for i, v in enumerate(values) if v is not None}
        if metric == defaults.HYPERPOD_IDLE_METRIC and iid in self.current:
            out[end] = self.current[iid]
        return out

    def get_metric_data(self, **kw: Any) -> dict[str, Any]:
        self.requests.append(kw)
        if self.error:
            raise ClientError({"Error": {"Code": self.error, "Message": "no"}}, "GetMetricData")
        results = []
        for q in kw["MetricDataQueries"]:
            dims = {d["Name"]: d["Value"] for d in q["MetricStat"]["Metric"]["Dimensions"]}
            if q["MetricStat"]["Metric"]["MetricName"] == defaults.HYPERPOD_PENDING_METRIC:
                assert q["MetricStat"]["Stat"] == "SampleCount" and "InstanceId" not in dims
                found = self.report()
            else:
                found = self.series(dims["InstanceId"], q["MetricStat"]["Metric"]["MetricName"])
            stamps = sorted((t for t in found if kw["StartTime"] <= t < kw["EndTime"]), reverse=True)
            values = [found[t] for t in stamps]
            results.append({"Id": q["Id"], "Values": values, "Timestamps": stamps, "StatusCode": "Complete"})
        return {"MetricDataResults": results}


def _fleet(
    nodes: list[dict[str, Any]], minutes: dict[str, list[float | None]], **kw: Any
) -> tuple[HyperPodFleet, FakeSageMaker]:
    sm = FakeSageMaker(nodes, **{k: v for k, v in kw.items() if k in ("refuse", "orchestrator")})
    cw = FakeCloudWatch(minutes, kw.get("error"), kw.get("current"), kw.get("reports", LANDED))
    return HyperPodFleet(sm, cw, now=lambda: NOW, iam=sm), sm


IDLE: list[float | None] = [1.0] * defaults.HYPERPOD_IDLE_MINUTES

# status, Slurm's minutes -> (lifecycle, healthy, runs work, may be a victim)
STATES = [
    ("Running", IDLE, ("InService", True, False, True)),
    ("Running", IDLE[1:], ("InService", True, False, True)),  # one missing minute forgiven
    ("Running", [1.0, 1.0, None, 1.0, 1.0], ("InService", True, False, True)),  # an older gap too
    ("Running", [1.0, 1.0, 1.0, 1.0, None], ("InService", True, True, False)),  # the newest: a job started
    ("Running", IDLE[2:], ("InService", True, True, False)),  # two missing: not idle long enough
    ("Running", [], ("InService", True, True, False)),  # a job holds it: Slurm said nothing
    ("Running", [1.0, 1.0, 0.0, 1.0, 1.0], ("InService", True, True, False)),  # a datum that is not idle
    ("Pending", IDLE, ("Pending", True, True, False)),
    ("ShuttingDown", IDLE, ("Terminating", True, True, False)),
    # On their way (issue 42): HyperPod checks, patches or (NodeRecovery Automatic) repairs them in the same count.
    ("Failure", IDLE, ("Pending:Failure", False, True, False)),
    ("SystemUpdating", IDLE, ("Pending:SystemUpdating", True, True, False)),
    ("DeepHealthCheckInProgress", IDLE, ("Pending:DeepHealthCheckInProgress", True, True, False)),
    ("SomethingNew", IDLE, ("SomethingNew", False, True, False)),
]


@pytest.mark.parametrize(("status", "minutes", "want"), STATES)
def test_each_node_state_reads_as_capacity_or_not_and_victim_or_not(
    status: str, minutes: list[float | None], want: tuple[str, bool, bool, bool]
) -> None:
    fleet, _ = _fleet([_node("i-0aaaaaaaaaaaaaaaa", status)], {"i-0aaaaaaaaaaaaaaaa": minutes})
    [obs] = fleet.marked(fleet.observe([REF]), NOW)
    [inst] = obs.instances
    assert (inst.lifecycle_state, inst.healthy, inst.runs_work) == want[:3]
    idle_gpus = inst.model_copy(update={"gpu_utilization": 0.0, "gpu_memory_percent": 0.0})
    assert (skip_reason(idle_gpus, IdleThreshold()) is None) is want[3]


def test_observation_reads_every_page_and_keeps_only_the_exact_group() -> None:
    nodes = [_node(f"i-0{i:016x}", "Running") for i in range(5)] + [
        _node("i-0ffffffffffffffff", "Running", "gpu-workers-2")
    ]
    fleet, sm = _fleet(nodes, {})
    [obs] = fleet.observe([REF, GroupRef(kind=GroupKind.HYPERPOD, cluster="gone", name="x")])
    assert [i.instance_id for i in obs.instances] == [n["InstanceId"] for n in nodes[:5]]
    assert (obs.desired, obs.min_size, obs.instance_types) == (3, 1, ("p5.48xlarge",))
    assert obs.tags[defaults.TAG_MANAGED] == defaults.TAG_MANAGED_VALUE
    assert sum(1 for c, _ in sm.calls if c == "ListClusterNodes") == 3  # 6 nodes, pages of 2


def test_the_idle_read_is_one_call_over_whole_minutes_and_only_for_running_nodes() -> None:
    nodes = [_node("i-0aaaaaaaaaaaaaaaa", "Running"), _node("i-0bbbbbbbbbbbbbbbb", "Pending")]
    fleet, _ = _fleet(nodes, {})
    fleet.marked(fleet.observe([REF]), NOW)
    [request] = fleet.cloudwatch.requests
    assert len(request["MetricDataQueries"]) == 2  # the group's report marker, then the one Running node
    report, stat = (q["MetricStat"] for q in request["MetricDataQueries"])
    assert (report["Metric"]["MetricName"], report["Stat"], report["Period"]) == ("PendingGPUs", "SampleCount", 60)
    assert {d["Name"] for d in report["Metric"]["Dimensions"]} == {"ClusterName", "InstanceGroupName"}
    assert stat["Metric"]["Namespace"] == f"Slurm/{ROLE_ID}:SageMaker" and stat["Metric"]["MetricName"] == "IdleNode"
    assert {d["Name"] for d in stat["Metric"]["Dimensions"]} == {"ClusterName", "InstanceGroupName", "InstanceId"}
    end = NOW.replace(second=0)  # the window: 5 whole minutes, and the current one read to its end
    assert (request["StartTime"], request["EndTime"]) == (end - timedelta(minutes=5), end + timedelta(minutes=1))


def test_an_unreadable_idle_report_closes_the_group_for_scale_in() -> None:
    fleet, _ = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {"i-0aaaaaaaaaaaaaaaa": IDLE}, error="Throttling")
    [obs] = fleet.marked(fleet.observe([REF]), NOW)
    assert obs.scale_in_closed is not None and "Throttling" in obs.scale_in_closed
    assert all(i.runs_work for i in obs.instances)


def test_a_result_getmetricdata_did_not_complete_closes_the_group_too() -> None:
    """A strict read: an InternalError result is no "no data" (which would read as busy here, but as
    nothing waiting elsewhere): the group is closed and says why."""
    fleet, _ = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {"i-0aaaaaaaaaaaaaaaa": IDLE})
    answer = fleet.cloudwatch.get_metric_data

    def failing(**kw: Any) -> dict[str, Any]:
        page = answer(**kw)
        page["MetricDataResults"][-1]["StatusCode"] = "InternalError"
        return page

    fleet.cloudwatch.get_metric_data = failing  # type: ignore[method-assign]
    [obs] = fleet.marked(fleet.observe([REF]), NOW)
    assert obs.scale_in_closed is not None and "InternalError" in obs.scale_in_closed
    assert all(i.runs_work for i in obs.instances)


def test_an_eks_orchestrated_cluster_is_not_this_adapters() -> None:
    fleet, _ = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {}, orchestrator={"Eks": {"ClusterArn": "x"}})
    assert fleet.observe([REF]) == []


def test_a_job_started_in_the_latest_minute_keeps_the_node() -> None:
    """The probe's case: Slurm said idle at -5..-2 and a job took the node during -1 (the publisher put
    nothing for it): the old rule forgave the newest gap and called it idle."""
    fleet, _ = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {"i-0aaaaaaaaaaaaaaaa": [1.0, 1.0, 1.0, 1.0, None]})
    [obs] = fleet.marked(fleet.observe([REF]), NOW)
    assert [i.runs_work for i in obs.instances] == [True]


def test_the_delete_reads_slurms_word_again_and_keeps_a_node_that_got_a_job() -> None:
    ids = ["i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb"]
    fleet, sm = _fleet([_node(i, "Running") for i in ids], dict.fromkeys(ids, IDLE))
    obs = fleet.marked(fleet.observe([REF]), NOW)[0]
    fleet.cloudwatch.current = {ids[1]: 0.0}  # the publisher, after the observation: a job holds it now
    text = fleet.apply(_decision(Action.SCALE_IN, 1, tuple(ids)), obs)
    assert [kw["NodeIds"] for c, kw in sm.calls if c == "BatchDeleteClusterNodes"] == [[ids[0]]]
    assert f"kept {ids[1]}" in text
    fleet.cloudwatch.error = "Throttling"  # unreadable at the delete: nothing is deleted
    assert "kept" in fleet.apply(_decision(Action.SCALE_IN, 1, (ids[0],)), obs)
    assert len([c for c, _ in sm.calls if c == "BatchDeleteClusterNodes"]) == 1


def _decision(action: Action, desired: int, victims: tuple[str, ...] = ()) -> Decision:
    return Decision(
        group=REF.key,
        trigger=Trigger(kind=TriggerKind.DEMAND, name="metric Slurm/PendingGPUs"),
        action=action,
        current=3,
        desired=desired,
        victims=victims,
        reason="test",
        event_id="e1",
        at=NOW,
    )


def test_scale_out_sends_the_groups_whole_spec_with_the_new_count_and_only_that_group() -> None:
    fleet, sm = _fleet([], {})
    obs = fleet.marked(fleet.observe([REF]), NOW)[0]
    assert fleet.apply(_decision(Action.SCALE_OUT, 5), obs) == f"UpdateCluster {REF.key} InstanceCount = 5"
    [(_, sent)] = [c for c in sm.calls if c[0] == "UpdateCluster"]
    [spec] = sent["InstanceGroups"]
    assert spec == update_spec(GROUP, 5)
    assert spec["InstanceCount"] == 5 and spec["MinInstanceCount"] == 1 and spec["ImageId"] == "ami-0123"
    assert spec["LifeCycleConfig"] == GROUP["LifeCycleConfig"] and "Status" not in spec and "TargetCount" not in spec


def test_a_count_already_reached_is_not_asked_again() -> None:
    fleet, sm = _fleet([], {})
    obs = fleet.marked(fleet.observe([REF]), NOW)[0]
    assert "already 3" in fleet.apply(_decision(Action.SET_DESIRED, 3), obs)
    assert not [c for c in sm.calls if c[0] == "UpdateCluster"]


def test_scale_in_deletes_only_victims_still_idle_in_calls_of_99() -> None:
    ids = [f"i-0{i:016x}" for i in range(120)]
    busy = ids[5]
    fleet, sm = _fleet([_node(i, "Running") for i in ids], {i: IDLE for i in ids if i != busy})
    obs = fleet.marked(fleet.observe([REF]), NOW)[0]
    text = fleet.apply(_decision(Action.SCALE_IN, 0, tuple(ids)), obs)
    deletes = [kw["NodeIds"] for c, kw in sm.calls if c == "BatchDeleteClusterNodes"]
    assert [len(d) for d in deletes] == [99, 20]
    assert busy not in {i for d in deletes for i in d}
    assert f"kept {busy}" in text


def test_a_node_already_gone_is_done_and_a_refused_one_raises_for_a_retry() -> None:
    ids = ["i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb", "i-0cccccccccccccccc"]
    refuse = {ids[0]: "NodeIdNotFound", ids[1]: "NodeIdInUse"}
    fleet, _ = _fleet([_node(i, "Running") for i in ids], dict.fromkeys(ids, IDLE), refuse=refuse)
    obs = fleet.marked(fleet.observe([REF]), NOW)[0]
    with pytest.raises(DeleteRefused, match=r"refused i-0bbbbbbbbbbbbbbbb \(NodeIdInUse"):
        fleet.apply(_decision(Action.SCALE_IN, 1, tuple(ids)), obs)
    fleet.sagemaker.refuse = {ids[0]: "NodeIdNotFound", ids[2]: "NodeIdNotFound"}
    assert "i-0bbbbbbbbbbbbbbbb" in fleet.apply(_decision(Action.SCALE_IN, 1, tuple(ids)), obs)


def test_a_closed_group_deletes_nothing_even_on_a_retry() -> None:
    fleet, sm = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {}, error="AccessDenied")
    obs = fleet.marked(fleet.observe([REF]), NOW)[0]
    text = fleet.apply(_decision(Action.SCALE_IN, 2, ("i-0aaaaaaaaaaaaaaaa",)), obs)
    assert not [c for c in sm.calls if c[0] == "BatchDeleteClusterNodes"] and "kept i-0aaaaaaaaaaaaaaaa" in text


def test_the_core_holds_a_closed_group_and_says_why() -> None:
    """The observation's own `scale_in_closed` takes the same path as a demand source's (fail closed)."""
    fleet, _ = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {}, error="Throttling")
    obs = fleet.marked(fleet.observe([REF]), NOW)[0].model_copy(update={"instance_metrics_loaded": True})
    trigger = Trigger(kind=TriggerKind.REQUEST)
    settings = GroupSettings(min=0, max=4)
    d = decide_request(obs, settings, GroupState(), NOW, event_id="e", direction=Direction.IN, trigger=trigger, why="x")
    assert d.action is Action.HOLD and "no node may be removed: GetMetricData failed (Throttling)" in d.reason


def test_an_alarm_on_an_instance_groups_series_targets_that_group() -> None:
    """The dimensions the publisher puts on a HyperPod node's group series name the group (not 'no group')."""
    from gpufleet.domain.models import MetricRef
    from gpufleet.policy.fleet import FleetPolicy
    from gpufleet.scaling.targets import resolve_alarm_target
    from tests.unit.events.test_alarms import trigger

    metric = MetricRef(namespace="GPUFleet", name="GPUUtilization", dimensions=REF.metric_dimensions)
    target = resolve_alarm_target(trigger("a", metric), {"gpufleet:direction": "in"}, FleetPolicy())
    assert (target.group, target.direction) == (REF, Direction.IN)


def _sagemaker_shape(name: str) -> set[str]:
    import botocore.session

    return set(botocore.session.get_session().get_service_model("sagemaker").shape_for(name).members)


def test_every_spec_member_describecluster_holds_is_sent_back() -> None:
    """A field left out of UpdateCluster's spec is a field changed (ImageReleaseVersion left out is 'the
    latest available version'): every member of ClusterInstanceGroupSpecification that DescribeCluster
    answers, under its name or a known rename, is carried; the probe found AutoPatchConfig and
    DesiredImageReleaseVersion dropped. Every member at every depth, against botocore's model:
    test_hyperpod_update_spec.py."""
    spec_members, details = _sagemaker_shape(SPEC_SHAPE), _sagemaker_shape(DETAILS_SHAPE)
    assert set(SPEC_RENAMED) <= details and set(SPEC_RENAMED.values()) <= spec_members
    fed = {m for m in spec_members if m in details or f"Desired{m}" in details or f"Current{m}" in details}
    never_said = spec_members - fed - set(SPEC_RENAMED.values()) - {"InstanceCount"}
    assert not never_said, "a spec member DescribeCluster never says"
    patch = {"PatchingStrategy": "WhenIdle"}
    with_patch = update_spec({**GROUP, "AutoPatchConfig": patch, "DesiredImageReleaseVersion": "1.2.3"}, 3)
    assert with_patch["AutoPatchConfig"] == patch and with_patch["ImageReleaseVersion"] == "1.2.3"


def test_observing_reads_no_idle_report_until_a_scale_in_is_weighed() -> None:
    """A steady tick, the OOM guard and spot_watch observe HyperPod groups too: they read no metric per
    node. Slurm's word is read by `marked`, which with_instance_metrics calls when victims are chosen."""
    fleet, _ = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {"i-0aaaaaaaaaaaaaaaa": IDLE})
    [obs] = fleet.observe([REF])
    assert fleet.cloudwatch.requests == [] and obs.instance_metrics_loaded is False
    [marked] = fleet.marked([obs], NOW)
    assert len(fleet.cloudwatch.requests) == 1 and marked.instances[0].runs_work is False


def test_a_node_the_current_minutes_landed_report_left_out_is_busy() -> None:
    """The probe's regression: the publisher sends nothing for a node a job holds. The current minute's
    report landed (the group's PendingGPUs in it) with IdleNode for one node only: the other one is busy
    now, however idle its older minutes read; the delete's re-read keeps it by the same rule."""
    ids = ["i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb"]
    fleet, sm = _fleet([_node(i, "Running") for i in ids], dict.fromkeys(ids, IDLE), current={ids[0]: 1.0})
    fleet.cloudwatch.reports = (*LANDED, 0)
    [obs] = fleet.marked(fleet.observe([REF]), NOW)
    assert [i.runs_work for i in obs.instances] == [False, True] and obs.scale_in_closed is None
    unmarked = fleet.observe([REF])[0]  # a resumed intent on an observation not marked: the re-read decides
    text = fleet.apply(_decision(Action.SCALE_IN, 1, tuple(ids)), unmarked)
    assert [kw["NodeIds"] for c, kw in sm.calls if c == "BatchDeleteClusterNodes"] == [[ids[0]]]
    assert f"kept {ids[1]}" in text


def test_a_stale_report_keeps_every_node_and_says_why() -> None:
    """No report of the group landed in the current or the previous minute (the controller's timer
    stopped): older minutes that said idle are not Slurm's word now."""
    fleet, sm = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {"i-0aaaaaaaaaaaaaaaa": IDLE}, reports=(-6, -5, -4))
    [obs] = fleet.marked(fleet.observe([REF]), NOW)
    assert obs.instances[0].runs_work is True
    assert obs.scale_in_closed is not None and "stale" in obs.scale_in_closed and "08:11" in obs.scale_in_closed
    fleet.apply(_decision(Action.SCALE_IN, 2, ("i-0aaaaaaaaaaaaaaaa",)), fleet.observe([REF])[0])
    assert not [c for c in sm.calls if c[0] == "BatchDeleteClusterNodes"]


def test_only_candidates_are_read_and_every_other_node_runs_work() -> None:
    ids = ["i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb", "i-0cccccccccccccccc"]
    fleet, _ = _fleet([_node(i, "Running") for i in ids], dict.fromkeys(ids, IDLE))
    [obs] = fleet.marked(fleet.observe([REF]), NOW, {REF.key: {ids[1]}})
    [request] = fleet.cloudwatch.requests
    asked = [
        {d["Name"]: d["Value"] for d in q["MetricStat"]["Metric"]["Dimensions"]}.get("InstanceId")
        for q in request["MetricDataQueries"]
    ]
    assert asked == [None, ids[1]]  # the group's report marker and the one candidate
    assert [i.runs_work for i in obs.instances] == [True, False, True]
    [none] = fleet.marked(fleet.observe([REF]), NOW, {REF.key: set()})
    assert len(fleet.cloudwatch.requests) == 1 and all(i.runs_work for i in none.instances)


def test_the_observation_says_the_group_shrinks_by_victims_only() -> None:
    fleet, _ = _fleet([_node("i-0aaaaaaaaaaaaaaaa", "Running")], {})
    assert fleet.observe([REF])[0].shrinks_by_victims_only is True


def test_a_count_below_target_count_is_never_sent() -> None:
    """Defense in depth under the core: a lower InstanceCount lets HyperPod choose which nodes go. A
    scale-out the group has reached or passed (a resumed intent) is done; a lower SET_DESIRED is refused."""
    fleet, sm = _fleet([_node(f"i-{k}", "Running") for k in range(3)], {})  # TargetCount 3
    [obs] = fleet.observe([REF])
    assert fleet.apply(_decision(Action.SCALE_OUT, 2), obs) == f"UpdateCluster {REF.key}: InstanceCount already 3"
    assert "already 3" in fleet.apply(_decision(Action.SCALE_OUT, 3), obs)
    with pytest.raises(CountNotLowered, match=r"InstanceCount 3 -> 2 refused"):
        fleet.apply(_decision(Action.SET_DESIRED, 2), obs)
    assert not [c for c in sm.calls if c[0] == "UpdateCluster"]
    assert fleet.apply(_decision(Action.SET_DESIRED, 4), obs) == f"UpdateCluster {REF.key} InstanceCount = 4"


class FakeGpuMetrics:
    """The nodes' GPU figures (utilization, memory %) as the instance metrics reader answers them."""

    def __init__(self, figures: dict[str, tuple[float | None, float | None]]):
        self.figures = figures

    def instance_gpu(self, ids: Any, now: datetime, lookback_s: int) -> dict[str, tuple[float | None, float | None]]:
        return {i: self.figures.get(i, (None, None)) for i in ids}


def test_a_busy_cluster_reads_no_idle_report_and_an_idle_gpu_only_its_own() -> None:
    """Cost, measured: a tick that weighs a scale-in on a group whose nodes' GPUs all read busy (or
    unknown) makes no GetMetricData query for Slurm's report; one node whose GPUs read idle by the group's
    own thresholds costs two (the group's report marker and that node). The others run work."""
    from gpufleet.aws.fleet import FleetReader, GroupRegistry
    from gpufleet.aws.groups.hyperpod import HyperPodGroups
    from gpufleet.policy.fleet import FleetPolicy
    from gpufleet.scaling.service import with_instance_metrics

    ids = ["i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb", "i-0cccccccccccccccc"]
    fleet, _ = _fleet([_node(i, "Running") for i in ids], dict.fromkeys(ids, IDLE))
    reader = FleetReader(GroupRegistry([HyperPodGroups(fleet)]))
    policy = FleetPolicy.model_validate(
        {"groups": [{"kind": "hyperpod", "cluster": "slurm-a", "name": "gpu-workers", "max": 4,
                     "idle": {"gpu_utilization": 20, "memory_percent": 10}}]}
    )  # fmt: skip
    busy = FakeGpuMetrics({ids[0]: (95.0, 80.0), ids[1]: (60.0, 5.0)})  # ids[2]: no figures
    [obs] = with_instance_metrics(busy, fleet.observe([REF]), NOW, policy, reader)  # type: ignore[arg-type]
    assert fleet.cloudwatch.requests == [] and all(i.runs_work for i in obs.instances)
    one = FakeGpuMetrics({ids[0]: (95.0, 80.0), ids[1]: (15.0, 5.0)})  # idle by the group's 20 %, not 5 %
    [obs] = with_instance_metrics(one, fleet.observe([REF]), NOW, policy, reader)  # type: ignore[arg-type]
    [request] = fleet.cloudwatch.requests
    assert len(request["MetricDataQueries"]) == 2
    assert [i.runs_work for i in obs.instances] == [True, False, True]
