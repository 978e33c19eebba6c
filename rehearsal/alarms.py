"""[emulated CloudWatch] Evaluate metric alarms on a simulated clock and emit their events.

moto stores alarms but never evaluates them. This evaluator reads the alarm's metric with
GetMetricData over its last N periods, applies a simplified N-of-N rule, sets the state in moto
(so DescribeAlarms(StateValue=ALARM) answers like AWS) and returns the EventBridge
"CloudWatch Alarm State Change" event AWS would deliver for each state change.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

ACCOUNT = "123456789012"
REGION = "us-east-1"

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanThreshold": operator.gt,
    "GreaterThanOrEqualToThreshold": operator.ge,
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
}


def _evaluate(cloudwatch: Any, alarm: dict[str, Any], now: datetime) -> tuple[str, str, list[float]]:
    period = alarm["Period"]
    n = alarm["EvaluationPeriods"]
    end = now.replace(second=0, microsecond=0)
    resp = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": alarm["Namespace"],
                        "MetricName": alarm["MetricName"],
                        "Dimensions": alarm.get("Dimensions", []),
                    },
                    "Period": period,
                    "Stat": alarm["Statistic"],
                },
            }
        ],
        StartTime=end - timedelta(seconds=period * n),
        EndTime=end,
        ScanBy="TimestampDescending",
    )
    values = [float(v) for v in resp["MetricDataResults"][0].get("Values", [])][:n]
    breach = _COMPARE[alarm["ComparisonOperator"]]
    threshold = alarm["Threshold"]
    shown = ", ".join(f"{v:.0f}" for v in reversed(values))
    if len(values) < n:
        return "INSUFFICIENT_DATA", f"{len(values)} of {n} datapoints", values
    if all(breach(v, threshold) for v in values):
        return "ALARM", f"Threshold Crossed: [{shown}] all {alarm['ComparisonOperator']} {threshold:g}", values
    return "OK", f"Threshold not crossed: [{shown}] vs {threshold:g}", values


def eventbridge_event(
    source: str, detail_type: str, at: datetime, detail: dict[str, Any], resources: list[str], event_id: str
) -> dict[str, Any]:
    """An event as EventBridge delivers it to a Lambda target: the envelope around `detail`."""
    return {
        "version": "0",
        "id": event_id,
        "detail-type": detail_type,
        "source": source,
        "account": ACCOUNT,
        "time": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": resources,
        "detail": detail,
    }


def alarm_event(alarm: dict[str, Any], state: str, previous: str, reason: str, now: datetime) -> dict[str, Any]:
    """The EventBridge event AWS sends for an alarm state change (shape as documented)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.000+0000")
    return eventbridge_event(
        "aws.cloudwatch",
        "CloudWatch Alarm State Change",
        now,
        resources=[alarm["AlarmArn"]],
        event_id=str(uuid.uuid4()),
        detail={
            "alarmName": alarm["AlarmName"],
            "state": {"value": state, "reason": reason, "timestamp": stamp},
            "previousState": {"value": previous, "reason": "", "timestamp": stamp},
            "configuration": {
                "metrics": [
                    {
                        "id": "m1",
                        "metricStat": {
                            "metric": {
                                "namespace": alarm["Namespace"],
                                "name": alarm["MetricName"],
                                "dimensions": {d["Name"]: d["Value"] for d in alarm.get("Dimensions", [])},
                            },
                            "period": alarm["Period"],
                            "stat": alarm["Statistic"],
                        },
                        "returnData": True,
                    }
                ]
            },
        },
    )


class AlarmEvaluator:
    """Keeps each alarm's emulated state; `tick` returns the events for this minute's changes."""

    def __init__(self, cloudwatch: Any, prefix: str) -> None:
        self.cloudwatch = cloudwatch
        self.prefix = prefix
        self.states: dict[str, str] = {}

    def tick(self, now: datetime) -> list[dict[str, Any]]:
        events = []
        alarms = self.cloudwatch.describe_alarms(AlarmNamePrefix=self.prefix)["MetricAlarms"]
        for alarm in alarms:
            name = alarm["AlarmName"]
            state, reason, _ = _evaluate(self.cloudwatch, alarm, now)
            previous = self.states.get(name, "INSUFFICIENT_DATA")
            if state == previous:
                continue
            self.states[name] = state
            self.cloudwatch.set_alarm_state(AlarmName=name, StateValue=state, StateReason=reason)
            events.append(alarm_event(alarm, state, previous, reason, now))
        return events
