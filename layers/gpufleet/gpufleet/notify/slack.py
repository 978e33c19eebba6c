"""Posting to Slack with slack-sdk: an incoming webhook, or a bot token for threaded incidents.

The webhook URL / token come from Secrets Manager and are never logged: failures are reported with
the HTTP status and Slack's error code only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackObjectFormationError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.handler import RetryHandler
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


def retry_handlers() -> list[RetryHandler]:
    """429 honours Retry-After; 500/503 and connection errors are retried with backoff. A read timeout
    is not retried here: Slack may have posted already, so the SQS redelivery decides (one repeat at most)."""
    return [
        RateLimitErrorRetryHandler(max_retry_count=3),
        ServerErrorRetryHandler(max_retry_count=2),
        ConnectionErrorRetryHandler(max_retry_count=2),
    ]


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
    def __init__(
        self, config: SlackConfig, api_url: str | None = None, timeout_s: int = defaults.SLACK_TIMEOUT_S
    ) -> None:
        self._config = config
        self._webhook = (
            WebhookClient(config.webhook_url, timeout=timeout_s, retry_handlers=retry_handlers())
            if config.webhook_url and not config.bot_token
            else None
        )
        self._web = (
            WebClient(
                token=config.bot_token,
                timeout=timeout_s,
                retry_handlers=retry_handlers(),
                base_url=api_url or WebClient.BASE_URL,
            )
            if config.bot_token
            else None
        )

    @property
    def threads(self) -> bool:
        return self._web is not None

    def post(self, payload: dict[str, Any], channel: str | None = None, thread_ts: str | None = None) -> str | None:
        """Returns the message ts in bot mode (the incident's thread), None for webhooks. A payload Slack
        would reject is refused here, before it is sent."""
        problems = payload_problems(payload)
        if problems:
            raise SlackRejected("payload not sent, Slack would reject it: " + "; ".join(problems[:5]))
        try:
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
        except SlackApiError as exc:
            status, error = exc.response.status_code, exc.response.get("error")
            kind = SlackRejected if _refused(status) or error in REFUSALS else SlackFailed
            raise kind(f"Slack API error {error!r} (HTTP {status})") from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, connection resets
            raise SlackFailed(f"Slack unreachable: {type(exc).__name__}") from None
        if answer.status_code != 200:
            kind = SlackRejected if _refused(answer.status_code) else SlackFailed
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
