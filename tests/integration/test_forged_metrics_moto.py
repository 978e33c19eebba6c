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
DIMS = [{"Name": schema.DIM_ASG_NAME, "Value": GROUP}]


@pytest.fixture
def infer(aws: str, tmp_path: Path) -> Fleet:
    """`infer` (2 of max 8, tagged), its two nodes publishing 5 % through the real publisher for the
    lookback, and an alarm on its group series (out above 50 %)."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_asg(clients, GROUP, min_size=1, max_size=8, desired=2, tags=fleet.MANAGED_TAG)
    fleet.put_gpu_alarm(
        clients.cloudwatch, "gpufleet-infer-gpu-high", {schema.DIM_ASG_NAME: GROUP}, direction="out", threshold=50,
        evaluation_periods=1,
    )  # fmt: skip
    groups = clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    for iid in sorted(i["InstanceId"] for i in groups[0]["Instances"]):
        backend = SimulatedBackend(gpus=GPUS, memory_total_mib=23028.0)
        for g in range(GPUS):
            backend.set(g, 5, 20)
        identity = Identity(iid, "us-east-1", asg_name=GROUP)
        pub = Publisher(backend, identity, Sender(clients.cloudwatch), detail=schema.DETAIL_ADAPTIVE)
        pub.start(xid_thread=False)
        simulate(pub, NOW - timedelta(seconds=LOOKBACK_S), LOOKBACK_S, every_s=1.0)  # 1 Hz, as deployed
        pub.close_windows(NOW)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Fleet(clients, policy, aws, "")


def forge(infer: Fleet, count: float, minutes: int = LOOKBACK_S // 60) -> None:
    """One datum a minute on infer's group series, as a node of another group can write it: `count`
    samples of 100 % in all, spread over the lookback's minutes."""
    data = [
        {"MetricName": schema.GPU_UTILIZATION.name, "Dimensions": DIMS, "Timestamp": NOW - timedelta(minutes=m + 1)}
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


def test_a_forged_sample_count_on_another_groups_series_does_not_scale_it(infer: Fleet) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    forge(infer, 5e4)
    (d,) = decisions(infer.scaler(notify_queue=stack.queue_url).handle(tick("forged", NOW), NOW))
    # Before: "GPU utilization 99.9% is above the band's high 80%" and scale-out 2 -> 4.
    assert (d["action"], d["current"], d["desired"]) == ("hold", 2, 2), d["reason"]
    assert "5.0% is inside the band" in d["reason"] or "5% is inside the band" in d["reason"]
    assert infer.desired(GROUP) == 2
    told = [n for n in queued(stack.queue_url) if n.incident_key == f"forged-series:asg:{GROUP}"]
    assert len(told) == 1
    facts = told[0].facts
    assert "samples, more than the 2,880 its publishers can write" in facts["seen"], facts
    assert "2 of 2 InService members' own series" in facts["used"]


def test_an_alarm_on_a_forged_series_holds_and_says_why(infer: Fleet) -> None:
    forge(infer, 5e4)
    infer.alarm_state("gpufleet-infer-gpu-high", "ALARM")  # what CloudWatch would do on the forged Average
    body = sample("scaler/eventbridge-alarm-asg-high.json")
    body["detail"]["alarmName"] = "gpufleet-infer-gpu-high"
    body["resources"] = ["arn:aws:cloudwatch:us-east-1:123456789012:alarm:gpufleet-infer-gpu-high"]
    body["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = {
        "AutoScalingGroupName": GROUP
    }
    (d,) = decisions(infer.scaler().handle(body, NOW))
    # Before: "alarm gpufleet-infer-gpu-high in ALARM" and scale-out 2 -> 4.
    assert (d["action"], d["desired"]) == ("hold", 2), d["reason"]
    assert "holds data no member could publish" in d["reason"] and "2,880" in d["reason"]
    # The tick re-raises the firing alarm: it holds the same way.
    later = NOW + timedelta(seconds=30)
    (again,) = decisions(infer.scaler().handle(tick("forged-later", later), later))
    assert again["action"] == "hold" and "no member could publish" in again["reason"], again["reason"]
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
