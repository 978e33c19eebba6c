"""Nodes outside managed groups in the guard's screening, against a fake CloudWatch (no boto3): how they
are listed, what is read for them (cost), and that they are forecast and checked under their own key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.domain import defaults
from gpufleet.guard.core import Risk
from gpufleet.guard.screen import GpuScreen, Outside, is_unmanaged, list_publishers, unmanaged_group
from gpufleet.policy.fleet import FleetPolicy
from gpufleet_node import schema

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
MINUTES = 15


def dims(**named: str) -> list[dict[str, str]]:
    return [{"Name": k, "Value": v} for k, v in named.items()]


class FakeCloudWatch:
    """Answers as adaptive publishers would: per instance (max, average, health summary when non-zero),
    per GPU only for GPUs in detail. `memory[iid][gpu]` is percent used per minute, oldest first;
    `xid[iid]` the GPU with one critical XID in the last minute."""

    def __init__(self, memory: dict[str, list[list[float]]], xid: dict[str, int] | None = None) -> None:
        self.memory, self.xid = memory, xid or {}
        self.pages: dict[str, list[dict[str, Any]]] = {}  # ListMetrics answers by metric name, if set
        self.calls: list[tuple[str, Any]] = []

    def list_metrics(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("ListMetrics", kwargs))
        name = kwargs.get("MetricName")
        if name in self.pages:
            return self.pages[name][len([c for c in self.calls if c[1].get("MetricName") == name]) - 1]
        if name == schema.GPU_HEALTH_EVENTS.name:
            return {"Metrics": [{"MetricName": name, "Dimensions": dims(InstanceId=i)} for i in self.xid]}
        if name == schema.GPU_MEMORY_USED_PERCENT.name:
            found = [dims(InstanceId=i) for i in self.memory]
            found += [dims(InstanceId=i, GpuIndex=str(g)) for i in self.memory for g in self._detail(i)]
            found.append(dims(AutoScalingGroupName="someone-elses-asg"))
            return {"Metrics": [{"MetricName": name, "Dimensions": d} for d in found]}
        iid = kwargs["Dimensions"][0]["Value"]  # a suspect's GPUs
        return {
            "Metrics": [
                {"MetricName": "x", "Dimensions": dims(InstanceId=iid, GpuIndex=str(g))} for g in self._detail(iid)
            ]
        }

    def _detail(self, iid: str) -> list[int]:
        return [g for g, m in enumerate(self.memory.get(iid, [])) if m[-1] >= 70 or self.xid.get(iid) == g]

    def _values(self, name: str, stat: str, d: dict[str, str]) -> list[float]:
        iid = d[schema.DIM_INSTANCE_ID]
        if name == schema.HOST_MEMORY_USED_PERCENT.name:
            return []  # hosts below 70 %: no own host series (tests/adapters/guard/test_host_memory.py)
        gpus = self.memory.get(iid, [])
        if schema.DIM_GPU_INDEX in d:
            g = int(d[schema.DIM_GPU_INDEX])
            if name == schema.GPU_MEMORY_USED_PERCENT.name:
                return gpus[g]
            if name == schema.GPU_MEMORY_TOTAL.name:
                return [81920.0] * MINUTES
            if name == schema.GPU_XID_ERRORS.name:
                return [0.0] * (MINUTES - 1) + [1.0 if self.xid.get(iid) == g else 0.0]
            return []
        if name == schema.GPU_HEALTH_EVENTS.name:
            return [0.0] * (MINUTES - 1) + [1.0] if iid in self.xid else []
        columns = list(zip(*gpus, strict=True))
        return [max(c) if stat == "Maximum" else sum(c) / len(c) for c in columns]

    def get_metric_data(self, MetricDataQueries: list[dict[str, Any]], **_: Any) -> dict[str, Any]:  # noqa: N803
        self.calls.append(("GetMetricData", MetricDataQueries))
        results = []
        for q in MetricDataQueries:
            stat = q["MetricStat"]
            d = {x["Name"]: x["Value"] for x in stat["Metric"]["Dimensions"]}
            values = self._values(stat["Metric"]["MetricName"], stat["Stat"], d)[::-1]
            results.append(
                {
                    "Id": q["Id"],
                    "Timestamps": [NOW - timedelta(minutes=m) for m in range(len(values))],
                    "Values": values,
                }
            )
        return {"MetricDataResults": results}

    def series_read(self) -> list[list[dict[str, Any]]]:
        return [c[1] for c in self.calls if c[0] == "GetMetricData"]


def flat(p: float) -> list[float]:
    return [p] * MINUTES


def test_listing_keeps_instance_series_only() -> None:
    """GPU and group series of the same metric are not nodes; health is listed separately (sent only when
    non-zero, so this list is short)."""
    cw = FakeCloudWatch({"i-a": [flat(80), flat(30)], "i-b": [flat(20)]}, xid={"i-b": 0})
    publishing, ill = list_publishers(GpuMetricsReader(cw))  # type: ignore[arg-type]
    assert (publishing, ill) == ({"i-a", "i-b"}, {"i-b"})
    assert [c[1]["MetricName"] for c in cw.calls] == [
        schema.GPU_MEMORY_USED_PERCENT.name,
        schema.GPU_HEALTH_EVENTS.name,
    ]
    assert all(c[1]["RecentlyActive"] == "PT3H" and c[1]["Dimensions"] == [{"Name": "InstanceId"}] for c in cw.calls)


@pytest.mark.parametrize("token", ["same", "fresh"])
def test_a_listing_that_never_ends_is_bounded(token: str) -> None:
    """A repeated token ends the listing at once; fresh tokens forever end at LIST_METRICS_MAX_PAGES."""
    cw = FakeCloudWatch({})
    endless = [
        {"Metrics": [{"Dimensions": dims(InstanceId=f"i-{n}")}], "NextToken": "t" if token == "same" else f"t{n}"}
        for n in range(defaults.LIST_METRICS_MAX_PAGES + 5)
    ]
    cw.pages = {schema.GPU_MEMORY_USED_PERCENT.name: endless, schema.GPU_HEALTH_EVENTS.name: [{"Metrics": []}]}
    publishing, _ = list_publishers(GpuMetricsReader(cw))  # type: ignore[arg-type]
    expected = 2 if token == "same" else defaults.LIST_METRICS_MAX_PAGES
    assert len(publishing) == expected


def test_nodes_outside_ride_in_the_first_batch_and_are_judged_under_their_own_key() -> None:
    """Three nodes outside managed groups: two summaries each plus the health summary of the one listed
    with an event, in the same first GetMetricData as the groups' (no extra call); only the leaking and
    the failing node are read per GPU. Their forecasts and findings carry unmanaged:<instance>."""
    leak = [60.0 + 2 * m for m in range(MINUTES)]  # 88 % now, 2 %/min: full in ~6 min
    cw = FakeCloudWatch(
        {"i-leak": [leak, flat(30)], "i-xid": [flat(20), flat(20)], "i-calm": [flat(40)]}, xid={"i-xid": 1}
    )
    outside = Outside(groups={i: unmanaged_group(i) for i in cw.memory}, ill=frozenset({"i-xid"}))
    forecasts, findings = GpuScreen(GpuMetricsReader(cw)).assess([], set(), NOW, FleetPolicy(), outside)  # type: ignore[arg-type]
    first = cw.series_read()[0]
    assert len(first) == 2 * 3 + 1 + 3  # + each node's own host memory: 09:00 is a host-screening minute
    health = [q for q in first if q["MetricStat"]["Metric"]["MetricName"] == schema.GPU_HEALTH_EVENTS.name]
    assert [q["MetricStat"]["Metric"]["Dimensions"] for q in health] == [dims(InstanceId="i-xid")]
    suspects = {c[1]["Dimensions"][0]["Value"] for c in cw.calls if c[0] == "ListMetrics"}
    assert suspects == {"i-leak", "i-xid"}
    [at_risk] = [f for f in forecasts if f.risk is not Risk.OK]
    assert at_risk.gpu.key == "i-leak/gpu0" and at_risk.gpu.group == "unmanaged:i-leak"
    assert at_risk.risk is Risk.WARNING
    [finding] = findings
    assert finding.gpu.key == "i-xid/gpu1" and is_unmanaged(finding.gpu.group)
    assert "1 critical XID" in finding.reason


def test_without_outside_nodes_nothing_more_is_read() -> None:
    """The managed-only path is unchanged: no node outside, no query for one."""
    cw = FakeCloudWatch({"i-x": [flat(99)]})
    assert GpuScreen(GpuMetricsReader(cw)).assess([], set(), NOW, FleetPolicy()) == ([], [])  # type: ignore[arg-type]
    assert cw.calls == []
