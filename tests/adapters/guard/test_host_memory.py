"""Host memory in the OOM guard: forecast like a GPU's memory (table), screened on the group's fullest node
every HOST_SCREEN_EVERY_MIN minutes or more (timed from the container's last screen), confirmed on the
node's own series, told as a host (not a GPU) with the numbers, and resolved when it recovers. Injected
clock, a fake CloudWatch that answers as adaptive publishers do (a node's own host series only above 70 %).
The forecast itself, a table on the pure core: tests/unit/guard/test_host_memory.py."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, InstanceObservation
from gpufleet.domain.notification import IncidentState
from gpufleet.guard.core import GuardState, Risk
from gpufleet.guard.hosts import HostScreening
from gpufleet.guard.notes import GuardTeller, risk_notes
from gpufleet.guard.screen import GpuScreen, Outside
from gpufleet.policy.fleet import FleetPolicy
from gpufleet_node import schema
from tests.unit.guard.test_host_memory import MINUTES, SCREEN

BETWEEN = SCREEN + timedelta(minutes=2)  # not one, after SCREEN
REF = GroupRef(kind=GroupKind.ASG, name="train")


class FakeCloudWatch:
    """Answers as adaptive publishers would: the group's GPU summaries flat and calm; the group's host
    Maximum = its fullest node; a node's own host series only while it is above 70 %."""

    def __init__(self, hosts: dict[str, list[float]]) -> None:
        self.hosts = hosts
        self.queries: list[list[dict[str, Any]]] = []
        self.now = SCREEN

    def list_metrics(self, **_: Any) -> dict[str, Any]:
        return {"Metrics": []}

    def _values(self, name: str, d: dict[str, str]) -> list[float]:
        if name == schema.HOST_MEMORY_USED_PERCENT.name:
            if schema.DIM_INSTANCE_ID in d:
                own = self.hosts.get(d[schema.DIM_INSTANCE_ID], [])
                return own if own and own[-1] >= 70 else []
            return [max(c) for c in zip(*self.hosts.values(), strict=True)]
        if name == schema.GPU_MEMORY_USED_PERCENT.name:
            return [30.0] * MINUTES
        return []

    def get_metric_data(self, MetricDataQueries: list[dict[str, Any]], **_: Any) -> dict[str, Any]:  # noqa: N803
        self.queries.append(MetricDataQueries)
        results = []
        for q in MetricDataQueries:
            metric = q["MetricStat"]["Metric"]
            values = self._values(metric["MetricName"], {x["Name"]: x["Value"] for x in metric["Dimensions"]})
            stamps = [self.now - timedelta(minutes=len(values) - 1 - m) for m in range(len(values))]
            results.append({"Id": q["Id"], "Timestamps": stamps[::-1], "Values": values[::-1]})
        return {"MetricDataResults": results}

    def host_queries(self) -> list[dict[str, str]]:
        return [
            {x["Name"]: x["Value"] for x in q["MetricStat"]["Metric"]["Dimensions"]}
            for batch in self.queries
            for q in batch
            if q["MetricStat"]["Metric"]["MetricName"] == schema.HOST_MEMORY_USED_PERCENT.name
        ]


def group(*ids: str) -> GroupObservation:
    return GroupObservation(
        ref=REF,
        min_size=1,
        max_size=10,
        desired=len(ids),
        instances=tuple(InstanceObservation(instance_id=i) for i in ids),
    )


LEAK = [60.0 + 1.5 * m for m in range(MINUTES)]  # 81 % now, full in ~13 min


def assess(
    cw: FakeCloudWatch, now: datetime, known: set[str] | None = None, screening: HostScreening | None = None
) -> list[Any]:
    """One guard run; `screening`: the container's HostScreening (a new one: a new container)."""
    cw.now = now
    forecasts, _ = GpuScreen(GpuMetricsReader(cw), screening or HostScreening()).assess(  # type: ignore[arg-type]
        [group("i-leak", "i-calm")], known or set(), now, FleetPolicy(), Outside()
    )
    return [f for f in forecasts if f.gpu.is_host]


def test_a_leaking_host_is_screened_on_the_group_then_named() -> None:
    cw = FakeCloudWatch({"i-leak": LEAK, "i-calm": [40.0] * MINUTES})
    [f] = assess(cw, SCREEN)
    assert f.gpu.key == "i-leak/host" and f.risk is Risk.WARNING and f.minutes_to_full is not None
    group_dims = {schema.DIM_ASG_NAME: "train"}
    assert cw.host_queries() == [group_dims, {"InstanceId": "i-calm"}, {"InstanceId": "i-leak"}]
    [note] = risk_notes(GuardTeller("asg:train", SCREEN, "e1", "us-east-1"), GuardState(), [f])
    assert note.title == "asg:train: host memory warning: i-leak/host"
    assert note.facts["instance"] == "i-leak" and note.facts["host memory"] == "81.0% used"
    assert "GPU" not in note.facts and "full in" in note.facts["forecast"]


def test_calm_groups_cost_one_host_read_per_screening_run_and_none_between() -> None:
    cw = FakeCloudWatch({"i-leak": [40.0] * MINUTES, "i-calm": [40.0] * MINUTES})
    screening = HostScreening()
    assert assess(cw, SCREEN, screening=screening) == [] and len(cw.host_queries()) == 1
    cw.queries.clear()
    assert assess(cw, BETWEEN, screening=screening) == [] and cw.host_queries() == []


def _screened_minutes(first: datetime, every: timedelta, runs: int, jitter_s: tuple[int, ...] = (0,)) -> list[int]:
    """Minutes after `first` of the runs (one container, rate(`every`)) that read the groups' host memory;
    run k is late by jitter_s[k % len(jitter_s)] seconds."""
    cw = FakeCloudWatch({"i-full": [99.0] * MINUTES, "i-calm": [40.0] * MINUTES})
    screening = HostScreening()
    out = []
    for k in range(runs):
        now = first + k * every + timedelta(seconds=jitter_s[k % len(jitter_s)])
        cw.queries.clear()
        assess(cw, now, screening=screening)
        if {schema.DIM_ASG_NAME: "train"} in cw.host_queries():
            out.append(k * int(every.total_seconds()) // 60)
    return out


@pytest.mark.parametrize(
    ("first_minute", "every_min", "runs", "screened"),
    [
        # rate(5 minutes) created at :02 (EventBridge Scheduler starts a rate schedule at creation): every
        # run screens; on the old minute grid (minute % 5 == 0) none ever did
        (2, 5, 6, [0, 5, 10, 15, 20, 25]),
        (0, 1, 12, [0, 5, 10]),  # rate(1 minute): every 5th run, whatever the offset
        (3, 1, 12, [0, 5, 10]),
        (0, 2, 10, [0, 6, 12, 18]),  # rate(2 minutes): every 6 minutes (the grid gave every 10)
        (1, 10, 3, [0, 10, 20]),  # slower than the screen: every run
    ],
)
def test_host_memory_is_screened_every_5_minutes_whatever_the_schedule_offset(
    first_minute: int, every_min: int, runs: int, screened: list[int]
) -> None:
    first = SCREEN + timedelta(minutes=first_minute)
    assert _screened_minutes(first, timedelta(minutes=every_min), runs) == screened


def test_a_run_a_few_seconds_early_still_screens() -> None:
    """rate(5 minutes) runs land a few seconds either side of their minute: 4 min 58 s after the last
    screen is a screening run (else every other run would be skipped: every 10 minutes)."""
    assert _screened_minutes(SCREEN + timedelta(minutes=2), timedelta(minutes=5), 6, (3, 1, 4, 0, 2)) == [
        0,
        5,
        10,
        15,
        20,
        25,
    ]
    screening = HostScreening(last=SCREEN)
    assert [screening.due(SCREEN + timedelta(seconds=s)) for s in (0, 269, 270, 300, -60)] == [
        False,
        False,
        True,
        True,
        True,  # a clock that went back: screen, never a long pause
    ]


def test_a_host_held_at_risk_is_read_every_run_and_resolves() -> None:
    cw = FakeCloudWatch({"i-leak": [50.0] * MINUTES, "i-calm": [40.0] * MINUTES})  # recovered: own series gone
    [f] = assess(cw, BETWEEN, known={"i-leak/host"}, screening=HostScreening(last=SCREEN))
    assert cw.host_queries() == [{"InstanceId": "i-leak"}]
    assert f.risk is Risk.OK
    before = GuardState(risks={"i-leak/host": Risk.WARNING})
    [note] = risk_notes(GuardTeller("asg:train", BETWEEN, "e2", "us-east-1"), before, [f])
    assert note.state is not IncidentState.FIRING and note.title == "asg:train: host memory back to normal: i-leak/host"


class Silent(FakeCloudWatch):
    """Each node's own series as an adaptive publisher leaves it: one point a minute over the last hour
    (what the request's StartTime asks for), none in the newest `silent_for` minutes (node hung,
    thrashing, publisher OOM-killed, or back below 60 %)."""

    def __init__(self, own: dict[str, list[float]], silent_for: int) -> None:
        super().__init__({iid: [40.0] * MINUTES for iid in own})
        self.own = own  # per node: its readings, one a minute, the last one `silent_for` minutes ago
        self.silent_for = silent_for

    def get_metric_data(self, MetricDataQueries: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:  # noqa: N803
        out = super().get_metric_data(MetricDataQueries, **kw)
        for q, r in zip(MetricDataQueries, out["MetricDataResults"], strict=True):
            dims = {x["Name"]: x["Value"] for x in q["MetricStat"]["Metric"]["Dimensions"]}
            if q["MetricStat"]["Metric"]["MetricName"] == schema.HOST_MEMORY_USED_PERCENT.name and "InstanceId" in dims:
                values = self.own[dims["InstanceId"]]
                last = self.now - timedelta(minutes=self.silent_for)
                pairs = [(last - timedelta(minutes=len(values) - 1 - m), v) for m, v in enumerate(values)]
                pairs = [(t, v) for t, v in pairs if t >= kw["StartTime"]][::-1]
                r["Timestamps"], r["Values"] = [t for t, _ in pairs], [v for _, v in pairs]
        return out


def _resolved_note(own: list[float], silent_for: int) -> Any:
    cw = Silent({"i-leak": own, "i-calm": [40.0]}, silent_for)
    [f] = assess(cw, BETWEEN, known={"i-leak/host"}, screening=HostScreening(last=SCREEN))
    assert f.risk is Risk.OK  # resolved either way: nothing to forecast
    before = GuardState(risks={"i-leak/host": Risk.CRITICAL})
    [note] = risk_notes(GuardTeller("asg:train", BETWEEN, "e3", "us-east-1"), before, [f])
    assert note.state is not IncidentState.FIRING
    return note


def test_a_host_silent_since_99_percent_is_not_told_back_to_normal() -> None:
    """Held CRITICAL at 99 %, then no reading for 16 minutes (past the 15-minute trend window): more likely
    thrashing, the OOM killer or a node gone than a recovery. Its last reading is read further back (the
    same metric, no extra cost) and the note says so."""
    note = _resolved_note([97.0, 98.0, 99.0], silent_for=16)
    assert "back to normal" not in note.title
    assert note.title == (
        "asg:train: host memory: no reading since 99 % (node gone, thrashing or its publisher killed?): i-leak/host"
    )
    assert note.facts == {"instance": "i-leak", "last host memory": "99.0% used"}
    assert "no reading since 99.0% at 08:46 UTC" in note.reason


def test_a_host_whose_series_stopped_after_coming_down_is_back_to_normal() -> None:
    note = _resolved_note([99.0, 80.0, 65.0], silent_for=16)  # its own series stops below 60 %
    assert note.title == "asg:train: host memory back to normal: i-leak/host"
    assert "no recent reading of its own" in note.reason
    note = _resolved_note([99.0], silent_for=90)  # silent for longer than the lookback: nothing to say
    assert "back to normal" in note.title
