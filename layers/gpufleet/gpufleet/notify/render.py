"""Render a planned delivery for people: Slack Block Kit and SNS (email/pager). Pure."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.notify.incidents import Delivery, Occasion
from gpufleet.notify.model import IncidentState, Severity, clip

SNS_SUBJECT_MAX = 100
SLACK_HEADER_MAX = 150
SLACK_TEXT_MAX = 3000
SLACK_FIELDS_MAX = 10

_ICON = {Severity.INFO: ":information_source:", Severity.WARNING: ":warning:", Severity.CRITICAL: ":rotating_light:"}
_OCCASION_LABEL = {
    Occasion.NEW: "",
    Occasion.UPDATE: "update",
    Occasion.REPEAT: "still firing",
    Occasion.RESOLVED: "resolved",
    Occasion.FLAPPING: "flapping",
}


def headline(d: Delivery) -> str:
    label = _OCCASION_LABEL[d.occasion]
    prefix = f"[{d.severity.upper()}{' ' + label if label else ''}]"
    return f"{prefix} {d.title}"


def _summary(d: Delivery) -> str:
    if d.occasion is Occasion.FLAPPING:
        return (
            f"This incident changed between firing and resolved {d.flips} times recently; "
            f"individual changes are summarised here instead of posted one by one. Now: {d.state}."
        )
    return d.reason


def render_slack(d: Delivery) -> dict[str, Any]:
    """Block Kit payload (text is the notification/fallback line)."""
    icon = ":white_check_mark:" if d.state is IncidentState.RESOLVED else _ICON[d.severity]
    fields = [
        {"type": "mrkdwn", "text": f"*Severity*\n{d.severity}"},
        {"type": "mrkdwn", "text": f"*State*\n{d.state}"},
        {"type": "mrkdwn", "text": f"*Group*\n`{d.group}`"},
        {"type": "mrkdwn", "text": f"*Kind*\n{d.kind}"},
    ]
    for name, value in d.facts.items():
        if len(fields) >= SLACK_FIELDS_MAX:
            break
        fields.append({"type": "mrkdwn", "text": clip(f"*{name}*\n{value}", 2000)})
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": clip(f"{headline(d)}", SLACK_HEADER_MAX)}},
        {"type": "section", "fields": fields},
    ]
    summary = _summary(d)
    if summary:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(f"*Why:* {summary}", 3000)}})
    if len(d.updates) > 1 or d.dropped_updates:
        lines = [f"• {u.at:%H:%M:%S} {u.title}" for u in d.updates]
        if d.dropped_updates:
            lines.insert(0, f"• … {d.dropped_updates} earlier updates not shown")
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": clip("*Since the last message:*\n" + "\n".join(lines), 3000)},
            }
        )
    context = f"incident `{d.incident_key}` · open since {d.opened_at:%Y-%m-%d %H:%M} UTC"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": clip(context, 3000)}]})
    if d.links:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {"type": "button", "text": {"type": "plain_text", "text": clip(link.title, 75)}, "url": link.url}
                    for link in d.links[:5]
                ],
            }
        )
    return {"text": clip(f"{icon} {headline(d)}", SLACK_TEXT_MAX), "blocks": blocks}


_NOT_SUBJECT = re.compile(r"[^\x20-\x7e]")


def sns_subject(d: Delivery) -> str:
    """SNS subjects: ASCII, no line breaks, at most 100 characters."""
    text = _NOT_SUBJECT.sub("?", f"gpufleet {headline(d)}")
    return text if len(text) <= SNS_SUBJECT_MAX else text[: SNS_SUBJECT_MAX - 3] + "..."


def render_sns(d: Delivery) -> tuple[str, str, dict[str, dict[str, str]]]:
    """(subject, message, message attributes); attributes let subscriptions filter by severity/group/kind."""
    lines = [headline(d), "", f"Group: {d.group}", f"Kind: {d.kind}", f"Severity: {d.severity}", f"State: {d.state}"]
    lines += [f"{name}: {value}" for name, value in d.facts.items()]
    summary = _summary(d)
    if summary:
        lines += ["", f"Why: {summary}"]
    if len(d.updates) > 1:
        lines += ["", "Since the last message:"] + [f"  {u.at:%H:%M:%S} {u.title}" for u in d.updates]
    if d.links:
        lines += [""] + [f"{link.title}: {link.url}" for link in d.links]
    lines += ["", f"Incident {d.incident_key}, open since {d.opened_at:%Y-%m-%d %H:%M} UTC"]
    attributes = {
        name: {"DataType": "String", "StringValue": value}
        for name, value in (
            ("severity", str(d.severity)),
            ("group", d.group),
            ("kind", d.kind),
            ("state", str(d.state)),
            ("occasion", d.occasion),
        )
    }
    return sns_subject(d), "\n".join(lines), attributes
