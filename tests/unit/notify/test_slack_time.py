"""A Slack post takes at most the time it is given, retries and their pauses included: against a real
local server that hangs or throttles, not a mocked client."""

from __future__ import annotations

import json
import time
from collections import deque

import pytest

from gpufleet.notify.slack import SlackConfig, SlackFailed, SlackPoster, SlackTimedOut
from rehearsal.slack import SlackReceiver, slack_receiver
from tests.unit.notify.hanging_slack import hanging_slack

PAYLOAD = {"text": "asg:train: scaled 4 -> 6", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "x"}}]}


def poster(base: str, mode: str, timeout_s: int) -> SlackPoster:
    secret = (
        f"{base}/services/T0/B0/X"
        if mode == "webhook"
        else json.dumps({"bot_token": "xoxb-test", "channel": "#gpu-oncall"})
    )
    return SlackPoster(SlackConfig.from_secret(secret), api_url=f"{base}/api/", timeout_s=timeout_s)


@pytest.mark.parametrize("mode", ["webhook", "bot"])
def test_a_post_to_a_hanging_slack_ends_within_the_time_it_was_given(mode: str) -> None:
    """The poster's own timeout is 5 s; the invocation has 1.5 s left for it: one attempt of 1 s (whole
    seconds), not retried (the post may have landed), reported as a timeout."""
    with hanging_slack() as (slack, base):
        started = time.monotonic()
        with pytest.raises(SlackTimedOut, match="did not answer in time"):
            poster(base, mode, timeout_s=5).post(PAYLOAD, within_s=1.5)
        took = time.monotonic() - started
    assert 0.9 < took < 1.5
    assert len(slack.hung()) == 1


def test_the_poster_timeout_still_bounds_an_attempt_when_time_is_plenty() -> None:
    with hanging_slack() as (slack, base):
        started = time.monotonic()
        with pytest.raises(SlackTimedOut):
            poster(base, "webhook", timeout_s=1).post(PAYLOAD, within_s=60)
        assert time.monotonic() - started < 1.5
    assert len(slack.hung()) == 1


def test_a_retry_after_longer_than_the_time_left_is_not_waited_out() -> None:
    """Slack throttles with Retry-After: 30 and the post has 3 s: no 30 s sleep in a Lambda that would
    time out meanwhile; the post fails now and SQS redelivers it."""
    receiver = SlackReceiver(script=deque(["429:30"] * 4))
    with slack_receiver(receiver) as (rx, base):
        started = time.monotonic()
        with pytest.raises(SlackFailed, match="429"):
            poster(base, "webhook", timeout_s=5).post(PAYLOAD, within_s=3)
        assert time.monotonic() - started < 1
    assert rx.answers == ["429:30"] and rx.received == []


@pytest.mark.parametrize("mode", ["webhook", "bot"])
def test_retries_that_fit_in_the_time_left_are_still_made(mode: str) -> None:
    receiver = SlackReceiver(script=deque(["500", "429:0"]))
    with slack_receiver(receiver) as (rx, base):
        poster(base, mode, timeout_s=2).post(PAYLOAD, within_s=10)
    assert rx.answers == ["500", "429:0", "ok"] and len(rx.received) == 1


def test_no_attempt_is_made_with_less_than_a_second_left() -> None:
    with hanging_slack() as (slack, base), pytest.raises(SlackFailed, match=r"not sent: 0\.4 s left"):
        poster(base, "webhook", timeout_s=5).post(PAYLOAD, within_s=0.4)
    assert slack.posts == []
