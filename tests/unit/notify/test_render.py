"""Rendering for people (Block Kit, SNS) and queue message parsing. The Slack secret's forms and the
payloads slack-sdk checks: tests/adapters/notify/test_slack_payloads.py."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.notification import NotificationKind, Severity, console_links, note
from gpufleet.events.queue import InvalidMessage, parse_message
from gpufleet.notify.incidents import merge_notification, plan_delivery
from gpufleet.notify.render import (
    SNS_MESSAGE_MAX_BYTES,
    SNS_SUBJECT_MAX,
    escape,
    mrkdwn,
    render_slack,
    render_sns,
)
from gpufleet.policy.notify import FlapDamping, Grouping

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)


def delivery(title: str, severity: Severity = Severity.CRITICAL, facts: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    n = note(
        NotificationKind.SCALING,
        severity,
        "eks:ml/infer-gpu",
        title,
        at=T0,
        source="test",
        id_parts=("n1",),
        facts=facts or {"capacity": "2 -> 3"},
        reason="alarm gpufleet-infer-gpu-high in ALARM",
        links=console_links("eks:ml/infer-gpu", "eu-west-1", "gpufleet-infer-gpu-high"),
    )
    incident = merge_notification(None, n, T0, FlapDamping())
    assert incident is not None
    plan = plan_delivery(incident, T0.replace(minute=1), Grouping(), FlapDamping())
    assert plan.delivery is not None
    return plan.delivery


def test_slack_message_has_severity_group_facts_reason_and_console_links() -> None:
    payload = render_slack(delivery("eks:ml/infer-gpu: failed to scale 2 -> 3"))
    assert payload["text"].startswith(":rotating_light: [CRITICAL]")
    kinds = [b["type"] for b in payload["blocks"]]
    assert kinds[:2] == ["header", "section"] and "actions" in kinds
    fields = " ".join(f["text"] for f in payload["blocks"][1]["fields"])
    assert "`eks:ml/infer-gpu`" in fields and "2 -&gt; 3" in fields  # escaped for mrkdwn; Slack shows 2 -> 3
    urls = [e["url"] for e in payload["blocks"][-1]["elements"]]
    assert any("#/clusters/ml/nodegroups/infer-gpu" in u for u in urls)
    assert any("alarmsV2:alarm/gpufleet-infer-gpu-high" in u for u in urls)


def test_slack_limits_hold_for_huge_facts() -> None:
    facts = {f"fact {i}": "x" * 5000 for i in range(30)}
    payload = render_slack(delivery("t" * 300, facts=facts))
    assert len(payload["blocks"][0]["text"]["text"]) <= 150
    assert len(payload["blocks"][1]["fields"]) <= 10
    assert all(len(f["text"]) <= 2000 for f in payload["blocks"][1]["fields"])


@given(st.text(min_size=1, max_size=300))
def test_sns_subject_is_ascii_one_line_and_at_most_100_chars(title: str) -> None:
    subject, message, attributes = render_sns(delivery(title))
    assert len(subject) <= SNS_SUBJECT_MAX
    assert subject.isascii() and "\n" not in subject
    assert attributes["severity"] == {"DataType": "String", "StringValue": "critical"}
    assert "Group: eks:ml/infer-gpu" in message


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("{oops", "not JSON"),
        ("[1]", "expected a JSON object"),
        (json.dumps({"flush": ""}), "flush: expected an incident key"),
        (json.dumps({"kind": "scaling"}), "notification_id: Field required"),
    ],
)
def test_malformed_queue_messages_say_what_is_wrong(body: str, why: str) -> None:
    with pytest.raises(InvalidMessage, match=why):
        parse_message(body)


def test_flush_messages_name_an_incident() -> None:
    assert parse_message(json.dumps({"flush": "asg:a|capacity"})) == "asg:a|capacity"


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ("<!channel>", "&lt;!channel&gt;"),
        ("<@U123> please", "&lt;@U123&gt; please"),
        ("<https://evil.example|docs>", "&lt;https://evil.example|docs&gt;"),
        ("a & b", "a &amp; b"),
        ("&lt; already", "&amp;lt; already"),  # shown as written, not decoded
        ("*bold* _it_ `code`", "*bold* _it_ `code`"),  # formatting is harmless and kept
    ],
)
def test_user_text_in_mrkdwn_is_shown_never_acted_on(written: str, sent: str) -> None:
    assert escape(written) == sent
    assert mrkdwn(written, 3000)["text"] == sent


@pytest.mark.parametrize("limit", range(2, 14))
def test_clipping_escaped_text_never_cuts_an_entity_in_two(limit: int) -> None:
    text = mrkdwn("<<<&&&>>>", limit)["text"]
    assert len(text) <= limit
    assert re.fullmatch(r"(&lt;|&amp;|&gt;)*…?", text), text


def test_a_mention_in_a_title_or_group_reaches_slack_escaped_everywhere_slack_parses() -> None:
    payload = render_slack(delivery("<!channel> scaled", facts={"<!here>": "<!everyone>"}))
    parsed = [payload["text"]] + [
        obj["text"]
        for block in payload["blocks"]
        for obj in [block.get("text"), *block.get("fields", []), *block.get("elements", [])]
        if isinstance(obj, dict) and obj.get("type") == "mrkdwn"
    ]
    assert parsed and not [t for t in parsed if "<!" in t]


def test_sns_message_is_clipped_to_the_sns_limit_on_a_character_boundary() -> None:
    huge = {f"fact {i}": "é" * 1000 for i in range(20)}  # multi-byte: bytes, not characters, are the limit
    d = delivery("t", facts=huge).model_copy(update={"reason": "🔥" * 70_000})
    _, message, attributes = render_sns(d)
    assert len(message.encode("utf-8")) <= SNS_MESSAGE_MAX_BYTES
    message.encode("utf-8").decode("utf-8")  # no split character
    assert message.startswith("[CRITICAL] t") and all(a["StringValue"] for a in attributes.values())
