"""EventBridge pattern matching as AWS documents it (content filtering): the subset `gpufleet local send`
uses to deliver only where the template's rules would."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.events.patterns import matches

ALARM = {
    "source": "aws.cloudwatch",
    "detail-type": "CloudWatch Alarm State Change",
    "resources": ["arn:aws:cloudwatch:us-east-1:123456789012:alarm:gpufleet-train-high"],
    "detail": {"alarmName": "gpufleet-train-high", "state": {"value": "ALARM"}, "previousState": {"value": "OK"}},
}


@pytest.mark.parametrize(
    ("pattern", "matched"),
    [
        ({"source": ["aws.cloudwatch"]}, True),
        ({"source": ["aws.ec2", "aws.cloudwatch"]}, True),  # any of a list
        ({"source": ["aws.ec2"]}, False),
        ({"detail": {"alarmName": [{"prefix": "gpufleet-"}]}}, True),
        ({"detail": {"alarmName": [{"prefix": "gpumem-"}]}}, False),
        ({"detail": {"alarmName": [{"suffix": "-high"}]}}, True),
        ({"detail": {"state": {"value": ["ALARM"]}}}, True),  # nested objects
        ({"detail": {"state": {"value": [{"anything-but": "OK"}]}}}, True),
        ({"detail": {"state": {"value": [{"anything-but": ["ALARM", "OK"]}]}}}, False),
        ({"detail": {"alarmName": [{"anything-but": {"prefix": "gpufleet-"}}]}}, False),
        ({"detail": {"muteDetail": [{"exists": False}]}}, True),  # absent, and asked to be
        ({"detail": {"muteDetail": [{"exists": True}]}}, False),
        ({"detail": {"muteDetail": ["x"]}}, False),  # a missing key matches no value
        ({"detail": {"state": ["ALARM"]}}, False),  # an object is not a value
        ({"resources": [{"prefix": "arn:aws:cloudwatch:"}]}, True),  # an event array: any element
        ({"detail-type": [{"equals-ignore-case": "cloudwatch alarm state change"}]}, True),
        ({"source": ["aws.cloudwatch"], "detail-type": ["EC2 Instance Launch Unsuccessful"]}, False),  # all fields
        ({}, True),
    ],
)
def test_content_filters(pattern: dict[str, Any], matched: bool) -> None:
    assert matches(pattern, ALARM) is matched


@pytest.mark.parametrize(
    ("condition", "value", "matched"),
    [([">", 0, "<=", 5], 5, True), ([">", 0, "<=", 5], 0, False), (["=", 3], 3.0, True), ([">", 1], "2", False)],
)
def test_numeric(condition: list[Any], value: Any, matched: bool) -> None:
    assert matches({"n": [{"numeric": condition}]}, {"n": value}) is matched


def test_an_event_that_is_not_an_object_matches_nothing() -> None:
    assert not matches({"source": ["aws.cloudwatch"]}, ["aws.cloudwatch"])
