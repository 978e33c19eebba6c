"""Render a planned delivery for people: Slack Block Kit and SNS (email/pager). Pure.

Limits are code here, not hopes: every text that reaches Slack is escaped for mrkdwn (so a group or
alarm name like `<!channel>` is shown, never acted on) and clipped to Block Kit's sizes; the SNS message is
clipped to SNS's 256 KiB and its subject to 100 printable ASCII characters. `notify.slack.payload_problems`
checks the result with slack-sdk's own models plus the limits they do not check.
"""

from __future__ import annotations

import re
from typing import Any

from gpufleet.domain.incidents import Delivery, Occasion
from gpufleet.domain.notification import IncidentState, Severity, clip

SNS_SUBJECT_MAX = 100
SNS_MESSAGE_MAX_BYTES = 256 * 1024 - 4 * 1024  # SNS's limit, less room for the message attributes
SLACK_HEADER_MAX = 150  # header block text
SLACK_TEXT_MAX = 3000  # section text, context element text
SLACK_FIELD_MAX = 2000  # each section field
SLACK_FIELDS_MAX = 10
SLACK_BUTTON_TEXT_MAX = 75
SLACK_BUTTONS_MAX = 5
SLACK_URL_MAX = 3000
SLACK_BLOCKS_MAX = 50
SLACK_FALLBACK_MAX = 3000  # the notification text (Slack truncates at 40,000; on-call reads the first line)

# Said on a repeat of a post whose answer never came: on-call may see the same message twice.
MAYBE_DUPLICATE = "may be a duplicate: Slack did not confirm the last post"

_ICON = {Severity.INFO: ":information_source:", Severity.WARNING: ":warning:", Severity.CRITICAL: ":rotating_light:"}
_OCCASION_LABEL = {
    Occasion.NEW: "",
    Occasion.UPDATE: "update",
    Occasion.REPEAT: "still firing",
    Occasion.RESOLVED: "resolved",
    Occasion.FLAPPING: "flapping",
}


def escape(text: str) -> str:
    """Slack mrkdwn control characters: `<` `>` `&` start links, mentions (`<!channel>`) and entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mrkdwn(text: str, limit: int) -> dict[str, str]:
    """A mrkdwn text object: user text escaped, then clipped (never cutting an entity in two)."""
    escaped = escape(text)
    if len(escaped) > limit:
        escaped = re.sub(r"&[a-z]{0,3}$", "", escaped[: limit - 1]) + "…"
    return {"type": "mrkdwn", "text": escaped}


def plain(text: str, limit: int) -> dict[str, str]:
    """A plain_text object: shown literally; never empty (Slack rejects an empty one)."""
    return {"type": "plain_text", "text": clip(text.strip() or "-", limit)}


def shown_state(d: Delivery) -> IncidentState | None:
    """The state people are shown, None for info: info activity (scaling steps) is a running log that
    never fires or resolves, so its alarm clearing must not read "resolved". Slack and SNS both use it."""
    return None if d.severity is Severity.INFO else d.state


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


def _fields(d: Delivery) -> list[dict[str, str]]:
    state = shown_state(d)
    fields = [
        {"type": "mrkdwn", "text": f"*Severity*\n{d.severity}"},
        *([{"type": "mrkdwn", "text": f"*State*\n{state}"}] if state else []),
        {"type": "mrkdwn", "text": f"*Group*\n`{escape(d.group)[: SLACK_FIELD_MAX - 20]}`"},
        {"type": "mrkdwn", "text": f"*Kind*\n{d.kind}"},
    ]
    for name, value in list(d.facts.items())[: SLACK_FIELDS_MAX - len(fields)]:
        field = mrkdwn(f"{name}\n{value}", SLACK_FIELD_MAX - 2)
        field["text"] = "*" + field["text"].replace("\n", "*\n", 1)  # the name in bold, escaped like the rest
        fields.append(field)
    return fields


def _updates(d: Delivery) -> dict[str, Any] | None:
    if len(d.updates) <= 1 and not d.dropped_updates:
        return None
    lines = [f"• {u.at:%H:%M:%S} {u.title}" for u in d.updates]
    if d.dropped_updates:
        lines.insert(0, f"• … {d.dropped_updates} earlier updates not shown")
    body = mrkdwn("\n".join(lines), SLACK_TEXT_MAX - 30)
    body["text"] = "*Since the last message:*\n" + body["text"]
    return {"type": "section", "text": body}


def render_slack(d: Delivery) -> dict[str, Any]:
    """Block Kit payload (text is the notification/fallback line)."""
    icon = ":white_check_mark:" if shown_state(d) is IncidentState.RESOLVED else _ICON[d.severity]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": plain(headline(d), SLACK_HEADER_MAX)},
        {"type": "section", "fields": _fields(d)},
    ]
    summary = _summary(d)
    if summary:
        why = mrkdwn(summary, SLACK_TEXT_MAX - 10)
        why["text"] = "*Why:* " + why["text"]
        blocks.append({"type": "section", "text": why})
    updates = _updates(d)
    if updates is not None:
        blocks.append(updates)
    context = f"incident `{d.incident_key}` · open since {d.opened_at:%Y-%m-%d %H:%M} UTC"
    repeat = [{"type": "mrkdwn", "text": f":repeat: {MAYBE_DUPLICATE}"}] if d.unanswered else []
    blocks.append({"type": "context", "elements": [mrkdwn(context, SLACK_TEXT_MAX), *repeat]})
    buttons = [
        {"type": "button", "text": plain(link.title, SLACK_BUTTON_TEXT_MAX), "url": link.url}
        for link in d.links[:SLACK_BUTTONS_MAX]
        if 0 < len(link.url) <= SLACK_URL_MAX
    ]
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    text = f"{icon} {escape(headline(d))}" + (f" ({MAYBE_DUPLICATE})" if d.unanswered else "")
    return {"text": clip(text, SLACK_FALLBACK_MAX), "blocks": blocks[:SLACK_BLOCKS_MAX]}


_NOT_SUBJECT = re.compile(r"[^\x20-\x7e]")


def sns_subject(d: Delivery) -> str:
    """SNS subjects: ASCII, no line breaks, at most 100 characters."""
    text = _NOT_SUBJECT.sub("?", f"gpufleet {headline(d)}")
    return text if len(text) <= SNS_SUBJECT_MAX else text[: SNS_SUBJECT_MAX - 3] + "..."


def _clip_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 64].decode("utf-8", errors="ignore") + "\n\n[clipped to the SNS message limit]"


def render_sns(d: Delivery) -> tuple[str, str, dict[str, dict[str, str]]]:
    """(subject, message, message attributes); attributes let subscriptions filter by severity/group/kind."""
    state = shown_state(d)
    lines = [headline(d), "", f"Group: {d.group}", f"Kind: {d.kind}", f"Severity: {d.severity}"]
    lines += [f"State: {state}"] if state else []
    lines += [f"{name}: {value}" for name, value in d.facts.items()]
    summary = _summary(d)
    if summary:
        lines += ["", f"Why: {summary}"]
    if len(d.updates) > 1:
        lines += ["", "Since the last message:"] + [f"  {u.at:%H:%M:%S} {u.title}" for u in d.updates]
    if d.links:
        lines += [""] + [f"{link.title}: {link.url}" for link in d.links]
    lines += ["", f"Incident {d.incident_key}, open since {d.opened_at:%Y-%m-%d %H:%M} UTC"]
    pairs = [("severity", str(d.severity)), ("group", d.group), ("kind", str(d.kind))]
    pairs += [("state", str(state))] if state else []  # as in the text: info activity has no state
    pairs.append(("occasion", str(d.occasion)))
    attributes = {name: {"DataType": "String", "StringValue": clip(value, 256) or "-"} for name, value in pairs}
    return sns_subject(d), _clip_bytes("\n".join(lines), SNS_MESSAGE_MAX_BYTES), attributes
