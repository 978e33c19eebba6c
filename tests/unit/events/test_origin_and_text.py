"""Where an event says it comes from, and text that must stay loggable (review of issue 22)."""

from __future__ import annotations

import json

import pytest

from gpufleet.domain.errors import InvalidEvent
from gpufleet.events.origin import Origin, check_origin
from gpufleet.events.queue import InvalidMessage, parse_message

HOME = Origin(account="123456789012", region="us-east-1")


def sns(topic_arn: str, alarm_arn: str, account: str) -> dict[str, object]:
    message = {"AlarmName": "gpufleet-x", "AlarmArn": alarm_arn, "AWSAccountId": account}
    return {"Records": [{"EventSource": "aws:sns", "Sns": {"TopicArn": topic_arn, "Message": json.dumps(message)}}]}


@pytest.mark.parametrize(
    ("event", "refused"),
    [
        # A central alerting topic in another account or region carries this account's alarm: accepted.
        (
            sns(
                "arn:aws:sns:eu-west-1:999999999999:org-alarms",
                "arn:aws:cloudwatch:us-east-1:123456789012:alarm:a",
                "123456789012",
            ),
            None,
        ),
        (
            sns(
                "arn:aws:sns:us-east-1:123456789012:t",
                "arn:aws:cloudwatch:us-east-1:999999999999:alarm:a",
                "999999999999",
            ),
            "999999999999",
        ),
        (
            sns(
                "arn:aws:sns:us-east-1:123456789012:t",
                "arn:aws:cloudwatch:eu-west-1:123456789012:alarm:a",
                "123456789012",
            ),
            "eu-west-1",
        ),
        ({"detail-type": "x", "account": "123456789012", "region": "us-west-2"}, "us-west-2"),
        (
            {"alarmArn": "arn:aws-cn:cloudwatch:cn-north-1:123456789012:alarm:a", "accountId": "123456789012"},
            "cn-north-1",
        ),
        ({"gpufleet": "reconcile"}, None),  # gpufleet's own schedule input names nothing
    ],
)
def test_only_the_alarms_own_account_and_region_count(event: dict[str, object], refused: str | None) -> None:
    if refused is None:
        check_origin(event, HOME)
    else:
        with pytest.raises(InvalidEvent, match=refused):
            check_origin(event, HOME)


def test_a_refusal_naming_a_lone_surrogate_is_still_a_loggable_line() -> None:
    """The message is logged as JSON without ASCII escaping: a lone surrogate would lose the line."""
    with pytest.raises(InvalidEvent) as refused:
        check_origin({"account": "12345678901\ud800", "region": "us-east-1"}, HOME)
    str(refused.value).encode("utf-8")  # raises UnicodeEncodeError if a lone surrogate got through
    assert "\\ud800" in str(refused.value)


def test_a_flush_nudge_with_a_lone_surrogate_is_rejected() -> None:
    with pytest.raises(InvalidMessage, match="valid Unicode"):
        parse_message(json.dumps({"flush": "asg:x\ud800|capacity"}))
