"""A Slack post takes at most the time it is given, retries and their pauses included: against a real
local server that hangs or throttles, not a mocked client. Nothing here measures how long a post took
(a loaded CI machine would miss any margin): the tests read the mechanism instead, the timeout each
attempt's socket was given, the pauses asked for and the attempts made, on an injected clock."""

from __future__ import annotations

import json
import socket
from collections import deque
from typing import Any

import pytest

from gpufleet.notify.slack import SlackConfig, SlackFailed, SlackPoster, SlackTimedOut
from rehearsal.slack import SlackReceiver, slack_receiver
from tests.adapters.notify.hanging_slack import hanging_slack

PAYLOAD = {"text": "asg:train: scaled 4 -> 6", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "x"}}]}


class Clock:
    """Monotonic seconds that move only by the pauses the poster asks for (`sleep`, recorded, not
    slept): what the poster computes from it does not depend on how fast this machine is."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def poster(base: str, mode: str, timeout_s: float, clock: Clock | None = None) -> SlackPoster:
    secret = (
        f"{base}/services/T0/B0/X"
        if mode == "webhook"
        else json.dumps({"bot_token": "xoxb-test", "channel": "#gpu-oncall"})
    )
    if clock is None:
        return SlackPoster(SlackConfig.from_secret(secret), api_url=f"{base}/api/", timeout_s=timeout_s)
    return SlackPoster(
        SlackConfig.from_secret(secret), api_url=f"{base}/api/", timeout_s=timeout_s, clock=clock, sleep=clock.sleep
    )


@pytest.fixture
def socket_timeouts(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The timeout of every connection the client opens (http.client passes it to create_connection,
    which sets it on the socket), as the hanging Slack would make the client wait it out."""
    seen: list[float | None] = []
    real = socket.create_connection

    def recording(address: Any, timeout: Any = None, *args: Any, **kwargs: Any) -> socket.socket:
        seen.append(timeout)
        return real(address, timeout, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", recording)
    return seen


@pytest.mark.parametrize("mode", ["webhook", "bot"])
def test_a_post_to_a_hanging_slack_ends_within_the_time_it_was_given(
    mode: str, socket_timeouts: list[float | None]
) -> None:
    """The poster's own timeout is 5 s; the invocation has 1.5 s left for it: one attempt of 1 s (whole
    seconds), not retried (the post may have landed), reported as a timeout."""
    clock = Clock()
    with hanging_slack() as (slack, base):
        p = poster(base, mode, timeout_s=5, clock=clock)
        with pytest.raises(SlackTimedOut, match="did not answer in time"):
            p.post(PAYLOAD, within_s=1.5)
    assert socket_timeouts == [1]
    assert len(slack.hung()) == 1 and clock.pauses == []


def test_the_poster_timeout_still_bounds_an_attempt_when_time_is_plenty(socket_timeouts: list[float | None]) -> None:
    """Also a timeout under a second, as tests of a late Slack use: given to the socket as it is."""
    clock = Clock()
    with hanging_slack() as (slack, base), pytest.raises(SlackTimedOut):
        poster(base, "webhook", timeout_s=0.2, clock=clock).post(PAYLOAD, within_s=60)
    assert socket_timeouts == [0.2]
    assert len(slack.hung()) == 1


def test_a_retry_after_longer_than_the_time_left_is_not_waited_out() -> None:
    """Slack throttles with Retry-After: 30 and the post has 3 s: no 30 s sleep in a Lambda that would
    time out meanwhile; the post fails now and SQS redelivers it."""
    clock = Clock()
    receiver = SlackReceiver(script=deque(["429:30"] * 4))
    with slack_receiver(receiver) as (rx, base), pytest.raises(SlackFailed, match="429"):
        poster(base, "webhook", timeout_s=5, clock=clock).post(PAYLOAD, within_s=3)
    assert clock.pauses == []
    assert rx.answers == ["429:30"] and rx.received == []


@pytest.mark.parametrize("mode", ["webhook", "bot"])
def test_retries_that_fit_in_the_time_left_are_still_made(mode: str, socket_timeouts: list[float | None]) -> None:
    """A 503 and a 429 (Retry-After: 0) within 10 s: both retried after their pauses, each attempt's
    socket given what is left after the pause, at most the poster's 2 s."""
    clock = Clock()
    receiver = SlackReceiver(script=deque(["503", "429:0"]))
    with slack_receiver(receiver) as (rx, base):
        poster(base, mode, timeout_s=2, clock=clock).post(PAYLOAD, within_s=10)
    assert rx.answers == ["503", "429:0", "ok"] and len(rx.received) == 1
    assert len(clock.pauses) == 2 and all(0 <= p < 10 for p in clock.pauses)
    assert socket_timeouts == [2, 2, 2]


def test_a_retry_is_given_only_the_time_left() -> None:
    """With 2.5 s left after a pause, the next attempt's timeout is 2 (whole seconds), not the poster's 5:
    the deadline computed from the injected clock."""
    clock = Clock()
    receiver = SlackReceiver(script=deque(["503"]))
    with slack_receiver(receiver) as (rx, base):
        p = poster(base, "webhook", timeout_s=5, clock=clock)
        p._until = clock() + 3.5  # what post() sets; here to read _retry_fits on its own
        assert p._retry_fits(1.0) and p._webhook is not None and p._webhook.timeout == 2
        assert not p._retry_fits(2.6)  # 0.9 s would be left: no attempt under MIN_ATTEMPT_S
    assert rx.answers == []


def test_no_attempt_is_made_with_less_than_a_second_left() -> None:
    with hanging_slack() as (slack, base), pytest.raises(SlackFailed, match=r"not sent: 0\.4 s left"):
        poster(base, "webhook", timeout_s=5).post(PAYLOAD, within_s=0.4)
    assert slack.posts == []
