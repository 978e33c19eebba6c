"""Posting to Slack with slack-sdk: an incoming webhook, or a bot token for threaded incidents.

The webhook URL / token come from Secrets Manager and are never logged: failures are reported with
the HTTP status and Slack's error code only.

A post is given the time it may take, retries and their pauses included (the notifier passes what is left
of its invocation): each attempt's timeout is trimmed to it, and a retry that would not fit is not made.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackObjectFormationError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.handler import RetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.models.blocks import Block
from slack_sdk.webhook import WebhookClient

from gpufleet.domain import defaults
from gpufleet.notify.render import (
    SLACK_BLOCKS_MAX,
    SLACK_BUTTON_TEXT_MAX,
    SLACK_FIELD_MAX,
    SLACK_TEXT_MAX,
    SLACK_URL_MAX,
)


class SlackFailed(RuntimeError):
    """Slack did not confirm the post (after slack-sdk's own retries); redelivery may succeed."""


class SlackUnconfirmed(SlackFailed):
    """Slack's answer does not say the post was refused: it may have landed. It is repeated at most once,
    marked as a possible duplicate, then held (notify.incidents.plan_delivery), as a timeout is."""


class SlackTimedOut(SlackUnconfirmed):
    """Slack did not answer in time; the post may have landed."""


class SlackRejected(SlackFailed):
    """Slack refused the post itself (a 4xx other than 429: invalid_blocks, channel_not_found, ...):
    retrying the same post cannot succeed, so it goes to the DLQ with the reason and the incident moves on."""


# Block Kit limits slack-sdk's models do not check (they check e.g. the header's 150 characters) are
# the renderer's: one source for what is clipped and what is checked.


def _text_problems(i: int, block: dict[str, Any]) -> list[str]:
    problems = []
    for field in block.get("fields") or []:
        if len(field.get("text", "")) > SLACK_FIELD_MAX:
            problems.append(f"block {i}: a field is longer than {SLACK_FIELD_MAX}")
    text = (block.get("text") or {}).get("text", "")
    if block.get("type") == "section" and len(text) > SLACK_TEXT_MAX:
        problems.append(f"block {i}: section text is longer than {SLACK_TEXT_MAX}")
    for element in block.get("elements") or []:
        label = (
            (element.get("text") or {}).get("text") if isinstance(element.get("text"), dict) else element.get("text")
        )
        if element.get("type") == "button":
            if not (label or "").strip() or len(label or "") > SLACK_BUTTON_TEXT_MAX:
                problems.append(f"block {i}: a button's text is empty or longer than {SLACK_BUTTON_TEXT_MAX}")
            if not 0 < len(element.get("url", "")) <= SLACK_URL_MAX:
                problems.append(f"block {i}: a button's url is empty or longer than {SLACK_URL_MAX}")
        elif isinstance(label, str) and len(label) > SLACK_TEXT_MAX:
            problems.append(f"block {i}: an element's text is longer than {SLACK_TEXT_MAX}")
    return problems


def payload_problems(payload: dict[str, Any]) -> list[str]:
    """What Slack would reject in a payload: slack-sdk's own model checks, then the limits they miss."""
    blocks = payload.get("blocks") or []
    problems = [f"{len(blocks)} blocks (Slack takes {SLACK_BLOCKS_MAX})"] if len(blocks) > SLACK_BLOCKS_MAX else []
    if not str(payload.get("text", "")).strip():
        problems.append("empty notification text")
    for i, raw in enumerate(blocks):
        try:
            block = Block.parse(raw)
            if block is None:
                problems.append(f"block {i}: unknown block type {raw.get('type')!r}")
                continue
            block.validate_json()
        except SlackObjectFormationError as exc:
            problems.append(f"block {i}: {exc}")
        problems += _text_problems(i, raw)
    return problems


# Answers after which the post may have landed (issue 29), so they count as a timeout does. Slack's own
# words: HTTP 500 is its webhook's "something strange and unusual happened"
# (https://api.slack.com/changelog/2016-05-17-changes-to-errors-for-incoming-webhooks), and the Web API's
# internal_error / fatal_error say "It's possible some aspect of the operation succeeded before the error
# was raised" (https://api.slack.com/methods/chat.postMessage, common errors). 502 and 504 come from a
# gateway whose backend failed or was slow after taking the request. 503 is not here: RFC 9110 15.6.4
# says the server could not handle the request (overload, maintenance): nothing was posted, so it is
# retried at once and at every sweep, unmarked.
UNCONFIRMED_STATUSES = frozenset({500, 502, 504})
UNCONFIRMED_ERRORS = frozenset({"internal_error", "fatal_error"})
RETRIED_STATUSES = (503,)  # retried within the post: an answer that proves nothing was posted


class UnavailableRetryHandler(ServerErrorRetryHandler):
    """slack-sdk's server-error handler retries 500 and 503 within one post; a 500 retried so may post
    the same message again, unmarked. This one retries only RETRIED_STATUSES."""

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        return response is not None and response.status_code in RETRIED_STATUSES


def retry_handlers() -> list[RetryHandler]:
    """429 honours Retry-After; 503 and connection errors are retried with backoff. A read timeout and
    the answers in UNCONFIRMED_STATUSES are not retried here: Slack may have posted already, so the
    incident's plan decides (one repeat at most, then held: notify.incidents)."""
    return [
        RateLimitErrorRetryHandler(max_retry_count=3),
        UnavailableRetryHandler(max_retry_count=2),
        ConnectionErrorRetryHandler(max_retry_count=2),
    ]


MIN_ATTEMPT_S = 1  # an attempt trimmed to the deadline gets whole seconds; one with less is not started


class WithinDeadline(RetryHandler):
    """One of slack-sdk's handlers, bounded by the post's deadline: a retry is made only when its pause
    and an attempt of at least MIN_ATTEMPT_S fit in what is left (`fits` says so and trims the next
    attempt's timeout). A Retry-After of a minute is not waited out with 20 s left. `sleep` is
    time.sleep, injectable so a test can see the pauses without waiting them out."""

    def __init__(
        self, inner: RetryHandler, fits: Callable[[float], bool], sleep: Callable[[float], None] = time.sleep
    ) -> None:
        super().__init__(inner.max_retry_count, inner.interval_calculator)
        self._inner = inner
        self._fits = fits
        self._sleep = sleep
        self._pause_s = 0.0

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if not self._inner.can_retry(state=state, request=request, response=response, error=error):
            return False
        if response is not None and response.status_code == 429:
            self._pause_s = _retry_after_s(response) + random.random()  # slack-sdk's own jitter
        else:
            self._pause_s = self.interval_calculator.calculate_sleep_duration(state.current_attempt)
        return self._fits(self._pause_s)

    def prepare_for_next_attempt(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        """The pause `_can_retry` checked against the deadline, not a new random one."""
        state.next_attempt_requested = True
        self._sleep(self._pause_s)
        state.increment_current_attempt()


def _retry_after_s(response: HttpResponse) -> float:
    """Slack sends whole seconds; a header missing or unreadable waits 1 s, as slack-sdk does."""
    for name, value in response.headers.items():
        if name.lower() == "retry-after":
            text = value[0] if isinstance(value, list) and value else value
            try:
                return max(0.0, float(str(text)))
            except ValueError:
                return 1.0
    return 1.0


def _timed_out(exc: BaseException) -> bool:
    """urllib raises a read timeout as TimeoutError, and a connect timeout wrapped in a URLError."""
    return isinstance(exc, TimeoutError) or (isinstance(exc, URLError) and isinstance(exc.reason, TimeoutError))


@dataclass(frozen=True)
class SlackConfig:
    webhook_url: str | None = None
    bot_token: str | None = None
    channel: str | None = None  # bot mode's default channel

    def __repr__(self) -> str:  # never print the secret parts
        return f"SlackConfig(mode={'bot' if self.bot_token else 'webhook'}, channel={self.channel!r})"

    @classmethod
    def from_secret(cls, value: str) -> SlackConfig:
        """The secret is a webhook URL, or JSON {"webhook_url"} / {"bot_token", "channel"}."""
        text = value.strip()
        if not text.startswith("{"):
            return cls(webhook_url=text)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError("the Slack secret is neither a URL nor valid JSON") from None
        if not isinstance(doc, dict) or not (doc.get("webhook_url") or doc.get("bot_token")):
            raise ValueError("the Slack secret's JSON needs 'webhook_url' or 'bot_token'")
        if doc.get("bot_token") and not doc.get("channel"):
            raise ValueError("the Slack secret has a bot_token but no default 'channel'")
        return cls(webhook_url=doc.get("webhook_url"), bot_token=doc.get("bot_token"), channel=doc.get("channel"))


class SlackPoster:
    """`timeout_s` bounds one attempt; `post(within_s=...)` bounds the whole post, retries included.
    `clock` (monotonic seconds) and `sleep` are the real ones unless a test injects its own. A
    `timeout_s` under a second is for tests (a Slack that answers late, without waiting seconds):
    urllib takes float seconds, though slack-sdk annotates them as int."""

    def __init__(
        self,
        config: SlackConfig,
        api_url: str | None = None,
        timeout_s: float = defaults.SLACK_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._config = config
        self._timeout_s = timeout_s
        self._clock = clock
        self._until = math.inf  # the current post's deadline, on `clock`
        handlers: list[RetryHandler] = [WithinDeadline(h, self._retry_fits, sleep) for h in retry_handlers()]
        self._webhook = (
            WebhookClient(config.webhook_url, timeout=cast(int, timeout_s), retry_handlers=handlers)
            if config.webhook_url and not config.bot_token
            else None
        )
        self._web = (
            WebClient(
                token=config.bot_token,
                timeout=cast(int, timeout_s),
                retry_handlers=handlers,
                base_url=api_url or WebClient.BASE_URL,
            )
            if config.bot_token
            else None
        )

    @property
    def threads(self) -> bool:
        return self._web is not None

    def _retry_fits(self, pause_s: float) -> bool:
        """Whether an attempt of at least MIN_ATTEMPT_S still fits after `pause_s`; if so, that attempt's
        timeout is what is left then (at most `timeout_s`), so the post ends by its deadline."""
        left_s = self._until - self._clock() - pause_s
        if left_s < MIN_ATTEMPT_S:
            return False
        client = self._web if self._web is not None else self._webhook
        assert client is not None
        client.timeout = cast(int, self._timeout_s if self._timeout_s <= left_s else math.floor(left_s))
        return True

    def post(
        self,
        payload: dict[str, Any],
        channel: str | None = None,
        thread_ts: str | None = None,
        within_s: float = math.inf,
    ) -> str | None:
        """Returns the message ts in bot mode (the incident's thread), None for webhooks. A payload Slack
        would reject is refused here, before it is sent. `within_s`: how long the post may take in all;
        with less than MIN_ATTEMPT_S it is not sent."""
        problems = payload_problems(payload)
        if problems:
            raise SlackRejected("payload not sent, Slack would reject it: " + "; ".join(problems[:5]))
        self._until = self._clock() + within_s
        if not self._retry_fits(0.0):
            raise SlackFailed(f"not sent: {max(within_s, 0.0):.1f} s left for Slack in this invocation")
        try:
            return self._send(payload, channel, thread_ts)
        except SlackApiError as exc:
            status, error = exc.response.status_code, exc.response.get("error")
            raise _failure(status, error)(f"Slack API error {error!r} (HTTP {status})") from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, connection resets
            if _timed_out(exc):
                raise SlackTimedOut(f"Slack did not answer in time ({type(exc).__name__})") from None
            raise SlackFailed(f"Slack unreachable: {type(exc).__name__}") from None

    def _send(self, payload: dict[str, Any], channel: str | None, thread_ts: str | None) -> str | None:
        if self._web is not None:
            resp = self._web.chat_postMessage(
                channel=channel or self._config.channel or "",
                text=payload["text"],
                blocks=payload["blocks"],
                thread_ts=thread_ts,
                unfurl_links=False,
            )
            return str(resp["ts"])
        assert self._webhook is not None
        answer = self._webhook.send(text=payload["text"], blocks=payload["blocks"], unfurl_links=False)
        if answer.status_code != 200:
            kind = _failure(answer.status_code, None)
            raise kind(f"Slack webhook answered HTTP {answer.status_code}: {answer.body[:200]!r}")
        return None


# Web API errors that no retry of the same post can fix (HTTP 200 with ok=false).
REFUSALS = frozenset(
    {
        "invalid_blocks",
        "invalid_arguments",
        "invalid_blocks_format",
        "msg_too_long",
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "no_text",
    }
)


def _refused(status: int) -> bool:
    return 400 <= status < 500 and status != 429


def _failure(status: int, error: str | None) -> type[SlackFailed]:
    """Refused (no retry can fix it), may have posted (repeated once, marked), or failed (retried)."""
    if status in UNCONFIRMED_STATUSES or error in UNCONFIRMED_ERRORS:
        return SlackUnconfirmed
    return SlackRejected if _refused(status) or error in REFUSALS else SlackFailed
