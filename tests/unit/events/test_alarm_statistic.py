"""An alarm's statistic and threshold, however it arrives (issue 29: an alarm on a node-writable series
acts on its Average only, and a failing group series is weighed against the alarm's threshold)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.domain.models import AlarmCondition
from gpufleet.events import parse_event
from gpufleet.events.alarms import described_condition, described_metrics
from gpufleet.events.model import AlarmEvent

EVENTS = Path(__file__).resolve().parents[3] / "events" / "scaler"


def parsed(name: str, edit: Any = None) -> AlarmEvent:
    body = json.loads((EVENTS / name).read_text())
    if edit is not None:
        edit(body)
    (event,) = parse_event(body)
    assert isinstance(event, AlarmEvent)
    return event


def test_eventbridge_and_the_alarm_action_carry_each_metrics_statistic() -> None:
    assert [m.stat for m in parsed("eventbridge-alarm-asg-high.json").metrics] == ["Average"]
    assert [m.stat for m in parsed("alarm-action-asg-low.json").metrics] == ["Average"]

    def maximum(body: dict[str, Any]) -> None:
        body["detail"]["configuration"]["metrics"][0]["metricStat"]["stat"] = "Maximum"

    assert [m.stat for m in parsed("eventbridge-alarm-asg-high.json", maximum).metrics] == ["Maximum"]


def test_sns_carries_the_statistic_as_it_spells_it() -> None:
    assert [m.stat for m in parsed("sns-alarm-eks-high.json").metrics] == ["AVERAGE"]


@pytest.mark.parametrize(
    ("described", "stats"),
    [
        ({"MetricName": "GPUUtilization", "Namespace": "GPUFleet", "Statistic": "Average"}, ["Average"]),
        ({"MetricName": "GPUUtilization", "Namespace": "GPUFleet", "ExtendedStatistic": "p99"}, ["p99"]),
        (
            {
                "Metrics": [
                    {"Id": "e1", "Expression": "MAX([m1])"},
                    {"Id": "m1", "MetricStat": {"Metric": {"MetricName": "GPUUtilization"}, "Stat": "Maximum"}},
                ]
            },
            ["Maximum"],
        ),
    ],
)
def test_describe_alarms_says_the_statistic(described: dict[str, Any], stats: list[str]) -> None:
    assert [m.stat for m in described_metrics(described)] == stats


@pytest.mark.parametrize(
    ("described", "condition"),
    [
        (
            {"MetricName": "GPUUtilization", "Threshold": 85.0, "ComparisonOperator": "GreaterThanThreshold"},
            AlarmCondition(threshold=85, comparison="GreaterThanThreshold"),
        ),
        # A math expression's threshold is not one series': nothing to weigh a series' mean against.
        (
            {
                "Threshold": 85.0,
                "ComparisonOperator": "GreaterThanThreshold",
                "Metrics": [{"Id": "e1", "Expression": "MAX([m1])"}],
            },
            None,
        ),
        ({"MetricName": "GPUUtilization", "ComparisonOperator": "GreaterThanUpperThreshold"}, None),  # anomaly band
        (None, None),  # the alarm is gone
    ],
)
def test_described_condition(described: dict[str, Any] | None, condition: AlarmCondition | None) -> None:
    assert described_condition(described) == condition
