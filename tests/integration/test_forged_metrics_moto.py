"""Issue 29: a node of another group writes on group `infer`'s GPU series (any node may write anything in
the GPUFleet namespace: IAM has no condition key for dimensions). On moto server: `infer` has 2 InService
g5.12xlarge nodes (4 GPUs each) truly 5 % busy, publishing through the real publisher in its default
`adaptive` mode; then one datum written as `train`'s node would write it, Values=[100], Counts=[large].

Before the check (the HEAD metrics.py/service.py of 2026-11-26) the group Average read ~99.9 %: the tick
scaled `infer` out 2 -> 4 and the alarm on the series scaled it out. Now the group series fails the
sample bound, the members' own series say 5 %, and the group holds and says why. A forger that stays
under the bound moves the mean by its share of the slack only: inside the band.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet.domain import defaults
from gpufleet.domain.notification import Notification
from gpufleet_node import schema
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender
from rehearsal import fleet
from tests.integration.conftest import NOW, TABLE, Fleet, decisions, queued, sample, tick

GROUP = "infer"
GPUS = 4  # g5.12xlarge, rehearsal.fleet's instance type
LOOKBACK_S = 300
POLICY = "defaults: {target: {low: 1, high: 80}, scale_out_step: 2, scale_out_cooldown_s: 300}\n"
BAND_30_80 = "defaults: {target: {low: 30, high: 80}, scale_out_step: 2, scale_out_cooldown_s: 300}\n"
DIMS = [{"Name": schema.DIM_ASG_NAME, "Value": GROUP}]


def publish(aws: str, tmp_path: Path, utils: list[float], policy: str = POLICY) -> tuple[Fleet, list[str]]:
    """`infer` (one node per entry of `utils`, max 8, tagged), each node publishing its utilization through
    the real publisher for the lookback, and an alarm on its group series (out above 50 %)."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_asg(clients, GROUP, min_size=1, max_size=8, desired=len(utils), tags=fleet.MANAGED_TAG)
    fleet.put_gpu_alarm(
        clients.cloudwatch, "gpufleet-infer-gpu-high", {schema.DIM_ASG_NAME: GROUP}, direction="out", threshold=50,
        evaluation_periods=1,
    )  # fmt: skip
    groups = clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    ids = sorted(i["InstanceId"] for i in groups[0]["Instances"])
    for iid, util in zip(ids, utils, strict=True):
        backend = SimulatedBackend(gpus=GPUS, memory_total_mib=23028.0)
        for g in range(GPUS):
            backend.set(g, util, 20)
        identity = Identity(iid, "us-east-1", asg_name=GROUP)
        pub = Publisher(backend, identity, Sender(clients.cloudwatch), detail=schema.DETAIL_ADAPTIVE)
        pub.start(xid_thread=False)
        simulate(pub, NOW - timedelta(seconds=LOOKBACK_S), LOOKBACK_S, every_s=1.0)  # 1 Hz, as deployed
        pub.close_windows(NOW)
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(policy)
    return Fleet(clients, policy_path, aws, ""), ids


@pytest.fixture
def infer(aws: str, tmp_path: Path) -> Fleet:
    """`infer` with two nodes truly 5 % busy."""
    return publish(aws, tmp_path, [5, 5])[0]


def forge(
    infer: Fleet,
    count: float,
    minutes: int = LOOKBACK_S // 60,
    dims: list[dict[str, str]] = DIMS,
    metric: schema.Metric = schema.GPU_UTILIZATION,
    first: int = 1,
) -> None:
    """One datum a minute on a series of `infer` (its group series unless `dims` say another), as a node of
    another group can write it: `count` samples of 100 % in all, spread over `minutes` minutes from `first`
    minute(s) ago."""
    data = [
        {"MetricName": metric.name, "Dimensions": dims, "Timestamp": NOW - timedelta(minutes=m + first)}
        | {"Values": [100.0], "Counts": [count / minutes], "Unit": "Percent"}
        for m in range(minutes)
    ]
    infer.clients.cloudwatch.put_metric_data(Namespace=schema.NAMESPACE, MetricData=data)


def group_samples(infer: Fleet) -> float:
    query: dict[str, Any] = {"Namespace": schema.NAMESPACE, "MetricName": schema.GPU_UTILIZATION.name}
    query["Dimensions"] = DIMS
    stat = {"Id": "n", "MetricStat": {"Metric": query, "Period": 60, "Stat": "SampleCount"}}
    got = infer.clients.cloudwatch.get_metric_data(
        MetricDataQueries=[stat], StartTime=NOW - timedelta(seconds=LOOKBACK_S), EndTime=NOW
    )
    return float(sum(got["MetricDataResults"][0]["Values"]))


def alarm_event(name: str = "gpufleet-infer-gpu-high", stat: str = "Average", metric: str = "") -> dict[str, Any]:
    """The EventBridge state change AWS sends for an alarm of `infer` (taken as delivered: aws.* source)."""
    body = sample("scaler/eventbridge-alarm-asg-high.json")
    body["detail"]["alarmName"] = name
    body["resources"] = [f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{name}"]
    read = body["detail"]["configuration"]["metrics"][0]["metricStat"]
    read["metric"]["dimensions"] = {"AutoScalingGroupName": GROUP}
    read["metric"]["name"] = metric or schema.GPU_UTILIZATION.name
    read["stat"] = stat
    return body


def forged_notes(queue_url: str) -> list[Notification]:
    return [n for n in queued(queue_url) if n.incident_key == f"forged-series:asg:{GROUP}"]


def test_a_forged_sample_count_on_another_groups_series_does_not_scale_it(infer: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    forge(infer, 5e4)
    (d,) = decisions(infer.scaler(notify_queue=stack.queue_url).handle(tick("forged", NOW), NOW))
    # Before: "GPU utilization 99.9% is above the band's high 80%" and scale-out 2 -> 4.
    assert (d["action"], d["current"], d["desired"]) == ("hold", 2, 2), d["reason"]
    assert "5.0% is inside the band" in d["reason"] or "5% is inside the band" in d["reason"]
    assert "decided on the members' own series" in d["reason"] and "more than the 2,880" in d["reason"]
    assert infer.desired(GROUP) == 2
    # More samples than even the group's max size (8 nodes) could publish: no member that left explains
    # it, so on-call is told (a smaller excess is not paged: test_an_honest_member_that_left_is_no_forgery).
    (told,) = forged_notes(stack.queue_url)
    assert "samples, more than the 2,880 its publishers can write" in told.facts["seen"], told.facts
    assert "2 of 2 InService members' own series" in told.facts["used"]


def test_an_alarm_on_a_forged_series_holds_and_says_why(infer: Fleet) -> None:
    forge(infer, 5e4)
    infer.alarm_state("gpufleet-infer-gpu-high", "ALARM")  # what CloudWatch would do on the forged Average
    (d,) = decisions(infer.scaler().handle(alarm_event(), NOW))
    # Before: "alarm gpufleet-infer-gpu-high in ALARM" and scale-out 2 -> 4.
    assert (d["action"], d["desired"]) == ("hold", 2), d["reason"]
    assert "decided on the members' own series" in d["reason"] and "2,880" in d["reason"]
    assert "their mean 5.0% is not GreaterThanThreshold 50" in d["reason"]
    # The tick re-raises the firing alarm: it holds the same way.
    later = NOW + timedelta(seconds=30)
    (again,) = decisions(infer.scaler().handle(tick("forged-later", later), later))
    assert again["action"] == "hold" and "their mean 5.0% is not" in again["reason"], again["reason"]
    assert infer.desired(GROUP) == 2


def test_a_forger_under_the_bound_moves_the_mean_only_by_the_slack(infer: Fleet) -> None:
    honest = group_samples(infer)
    room = 2 * GPUS * (LOOKBACK_S + 60) - honest  # the bound less what the members wrote
    forge(infer, room)
    (d,) = decisions(infer.scaler().handle(tick("under", NOW), NOW))
    # The forger's weight: the bound's slack (1/6) plus what the members did not write yet (the lookback's
    # newest half minute): a quarter here, far from the 80 % edge.
    assert room / (honest + room) <= 0.25
    assert d["action"] == "hold" and "inside the band" in d["reason"], d["reason"]
    assert infer.desired(GROUP) == 2


def test_a_forger_cannot_pick_which_members_count(aws: str, tmp_path: Path) -> None:
    """Probe: 95/95/5 % is 65 %, inside the band. The forger overflows the group series (the members'
    own are read) and the idle member's own series: before, that member was dropped and the two busy ones,
    a majority, read 95 %: scale-out 3 -> 5. Now any member's own series failing holds the group, told."""
    infer, ids = publish(aws, tmp_path, [95, 95, 5], policy=BAND_30_80)
    stack = fleet.create_notification_stack(slack_secret=None)
    forge(infer, 5e4)
    forge(infer, 3000, minutes=1, dims=[{"Name": schema.DIM_INSTANCE_ID, "Value": ids[2]}])
    (d,) = decisions(infer.scaler(notify_queue=stack.queue_url).handle(tick("pick", NOW), NOW))
    assert (d["action"], d["current"], d["desired"]) == ("hold", 3, 3), d["reason"]
    assert f"instance {ids[2]} GPUUtilization" in d["reason"], d["reason"]
    (told,) = forged_notes(stack.queue_url)
    assert "no member could publish" in told.title and ids[2] in told.facts["seen"]


def test_a_forger_cannot_put_its_slack_into_one_minute(infer: Fleet) -> None:
    """Probe: the bound over the lookback let a forger put the whole slack (one window per member) into
    the one minute an alarm evaluates: that minute of a 5 % group read ~52 % and the alarm (out above
    50 %, one period) scaled out 2 -> 4 on a series that passed. Now each minute is bounded too: the
    group series fails, the members' own mean (5 %) is weighed against the alarm's threshold: held."""
    honest = group_samples(infer)
    room = 2 * GPUS * (LOOKBACK_S + 60) - honest
    forge(infer, room, minutes=1, first=2)  # a minute both members published in full
    infer.alarm_state("gpufleet-infer-gpu-high", "ALARM")
    (d,) = decisions(infer.scaler().handle(alarm_event(), NOW))
    assert (d["action"], d["desired"]) == ("hold", 2), d["reason"]
    assert "samples in one minute, more than the 490" in d["reason"], d["reason"]
    assert infer.desired(GROUP) == 2


def test_an_alarm_whose_statistic_one_datum_sets_is_held(infer: Fleet) -> None:
    """Probe: an alarm on the group's GPUMemoryUsedPercent Maximum fired on one forged sample of 100
    (inside every bound) and scaled out 2 -> 4. Now an alarm on a GPUFleet series acts on Average only."""
    name = "gpufleet-infer-mem-high"
    infer.clients.cloudwatch.put_metric_alarm(
        AlarmName=name, Namespace=schema.NAMESPACE, MetricName=schema.GPU_MEMORY_USED_PERCENT.name,
        Dimensions=DIMS, Statistic="Maximum", Period=60, EvaluationPeriods=1, Threshold=95,
        ComparisonOperator="GreaterThanThreshold", Tags=[{"Key": defaults.TAG_ALARM_DIRECTION, "Value": "out"}],
    )  # fmt: skip
    forge(infer, 1, minutes=1, metric=schema.GPU_MEMORY_USED_PERCENT)
    infer.alarm_state(name, "ALARM")
    (d,) = decisions(infer.scaler().handle(alarm_event(name, "Maximum", schema.GPU_MEMORY_USED_PERCENT.name), NOW))
    assert (d["action"], d["desired"]) == ("hold", 2), d["reason"]
    assert "its statistic Maximum (on GPUMemoryUsedPercent) can be set by one datum any node may write" in d["reason"]
    later = NOW + timedelta(seconds=30)  # the tick re-raises it (DescribeAlarms says the statistic): held too
    (again,) = decisions(infer.scaler().handle(tick("max-later", later), later))
    assert again["action"] == "hold" and "its statistic Maximum" in again["reason"], again["reason"]


@pytest.fixture
def one_left(aws: str, tmp_path: Path) -> Fleet:
    """Three honest nodes 95 % busy for the lookback; one just terminated (spot reclaim, scale-in): its
    samples stay in the group series, over the two remaining members' bound."""
    infer, ids = publish(aws, tmp_path, [95, 95, 95], policy=BAND_30_80)
    infer.clients.autoscaling.terminate_instance_in_auto_scaling_group(
        InstanceId=ids[0], ShouldDecrementDesiredCapacity=True
    )
    return infer


def test_an_honest_member_that_left_is_no_forgery(one_left: Fleet) -> None:
    """Probe: before, on-call got a forged-series WARNING for honest data. Now the members' own series
    decide, the reason says why, nobody is paged."""
    stack = fleet.create_notification_stack(slack_secret=None)
    (d,) = decisions(one_left.scaler(notify_queue=stack.queue_url).handle(tick("left", NOW), NOW))
    assert (d["action"], d["current"], d["desired"]) == ("scale-out", 2, 4), d["reason"]
    assert "a member left, or a node wrote on it" in d["reason"]
    assert forged_notes(stack.queue_url) == []


def test_an_honest_member_that_left_does_not_hold_an_alarm(one_left: Fleet) -> None:
    """Probe: before, the alarm's scale-out was held (~6 minutes, the lookback) as if forged. Now the
    members' own mean (95 %) is weighed against the alarm's threshold (50 %): it acts."""
    one_left.alarm_state("gpufleet-infer-gpu-high", "ALARM")
    (d,) = decisions(one_left.scaler().handle(alarm_event(), NOW))
    assert (d["action"], d["current"], d["desired"]) == ("scale-out", 2, 4), d["reason"]
    assert "their mean 95.0% is GreaterThanThreshold 50" in d["reason"], d["reason"]


def test_an_alarm_is_checked_over_all_it_read_not_only_the_lookback(aws: str, tmp_path: Path) -> None:
    """Second probe: an Average alarm reading 10 one-minute periods fired on a flood 6-8 minutes ago,
    outside the 300 s lookback the check read, and the group (truly 50 %) scaled out 2 -> 4. The check now
    reads the alarm's own range (Period x EvaluationPeriods, from DescribeAlarms)."""
    infer, _ = publish(aws, tmp_path, [50, 50])
    infer.clients.cloudwatch.put_metric_alarm(
        AlarmName="gpufleet-infer-gpu-high", Namespace=schema.NAMESPACE, MetricName=schema.GPU_UTILIZATION.name,
        Dimensions=DIMS, Statistic="Average", Period=60, EvaluationPeriods=10, DatapointsToAlarm=3, Threshold=85,
        ComparisonOperator="GreaterThanThreshold", Tags=[{"Key": defaults.TAG_ALARM_DIRECTION, "Value": "out"}],
    )  # fmt: skip
    forge(infer, 3e4, minutes=3, first=6)  # 5x what its members can write in the range
    infer.alarm_state("gpufleet-infer-gpu-high", "ALARM")
    (d,) = decisions(infer.scaler().handle(alarm_event(), NOW))
    assert (d["action"], d["desired"]) == ("hold", 2), d["reason"]
    assert infer.desired(GROUP) == 2


def test_a_flood_that_holds_a_group_in_the_band_is_found_and_told(
    aws: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Second probe: 95/95 % (band 30-80: scale out) flooded with 50 % samples reads ~65 %: an in-band
    hold, so the acting-tick check never ran and nobody was told. An in-band hold is now checked every
    SERIES_AUDIT_EVERY_MIN minutes (here every minute): the members' own series decide and the group
    scales out. (A flood this small could be a member that left, so it is not paged: docs/security.md.)"""
    monkeypatch.setattr(defaults, "SERIES_AUDIT_EVERY_MIN", 1)
    infer, _ = publish(aws, tmp_path, [95, 95], BAND_30_80)
    stack = fleet.create_notification_stack(slack_secret=None)
    data = [
        {"MetricName": schema.GPU_UTILIZATION.name, "Dimensions": DIMS, "Timestamp": NOW - timedelta(minutes=m + 1)}
        | {"Values": [50.0], "Counts": [1000.0], "Unit": "Percent"}
        for m in range(5)
    ]
    infer.clients.cloudwatch.put_metric_data(Namespace=schema.NAMESPACE, MetricData=data)
    (d,) = decisions(infer.scaler(notify_queue=stack.queue_url).handle(tick("audit", NOW), NOW))
    assert d["action"] == "scale-out", d["reason"]
    assert "decided on the members' own series" in d["reason"]
    assert infer.desired(GROUP) == 4
