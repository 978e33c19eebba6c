"""The Slack secret's forms, and slack-sdk's own checks on what the renderer sends (gpufleet.notify.slack,
glue: slack_sdk). The rendering itself: tests/unit/notify/test_render.py."""

from __future__ import annotations

import json

import pytest

from gpufleet.notify.render import render_slack
from gpufleet.notify.slack import SlackConfig, payload_problems
from tests.unit.notify.test_render import delivery


@pytest.mark.parametrize(
    ("secret", "mode"),
    [
        ("https://hooks.slack.com/services/T/B/X", "webhook"),
        (json.dumps({"webhook_url": "https://hooks.slack.com/services/T/B/X"}), "webhook"),
        (json.dumps({"bot_token": "xoxb-1", "channel": "#gpu"}), "bot"),
    ],
)
def test_slack_secret_forms_and_repr_hides_the_secret(secret: str, mode: str) -> None:
    config = SlackConfig.from_secret(secret)
    assert f"mode={mode}" in repr(config)
    assert "hooks.slack.com" not in repr(config) and "xoxb" not in repr(config)


@pytest.mark.parametrize("secret", ["{not json", json.dumps({"channel": "#x"}), json.dumps({"bot_token": "xoxb"})])
def test_unusable_slack_secrets_are_refused_without_echoing_them(secret: str) -> None:
    with pytest.raises(ValueError, match="Slack secret") as err:
        SlackConfig.from_secret(secret)
    assert "xoxb" not in str(err.value)


def test_a_mention_in_a_title_or_group_is_a_payload_slack_accepts() -> None:
    """The payload tests/unit/notify/test_render.py finds escaped everywhere Slack parses is valid too."""
    payload = render_slack(delivery("<!channel> scaled", facts={"<!here>": "<!everyone>"}))
    assert payload_problems(payload) == []
