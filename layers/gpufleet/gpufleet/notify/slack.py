"""Posting to Slack with slack-sdk: an incoming webhook, or a bot token for threaded incidents.

The webhook URL / token come from Secrets Manager and are never logged: failures are reported with
the HTTP status and Slack's error code only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.handler import RetryHandler
from slack_sdk.webhook import WebhookClient

from gpufleet.domain import defaults


class SlackFailed(RuntimeError):
    """Slack did not confirm the post (after slack-sdk's own retries)."""


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
        """Returns the message ts in bot mode (the incident's thread), None for webhooks."""
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
            raise SlackFailed(
                f"Slack API error {exc.response.get('error')!r} (HTTP {exc.response.status_code})"
            ) from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, connection resets
            raise SlackFailed(f"Slack unreachable: {type(exc).__name__}") from None
        if answer.status_code != 200:
            raise SlackFailed(f"Slack webhook answered HTTP {answer.status_code}: {answer.body[:200]!r}")
        return None
