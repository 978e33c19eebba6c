"""The State people read (issue 23): info activity never fires or resolves, so Slack and SNS show no
state for it; warnings and criticals show firing, then resolved. Built through the real incident fold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.domain.incidents import Delivery, Incident
from gpufleet.domain.notification import NotificationKind, Severity, note
from gpufleet.notify.incidents import complete_delivery, merge_notification, plan_delivery
from gpufleet.notify.render import render_slack, render_sns
from gpufleet.policy.notify import FlapDamping, Grouping

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
INFO, WARNING = Severity.INFO, Severity.WARNING
FIRES, CLEARS = False, True  # a note's `resolved`

Batch = tuple[tuple[Severity, bool], ...]


def last_post(*batches: Batch) -> Delivery:
    """Each batch folded into one capacity incident, 10 minutes after the one before; then what is due
    is posted. The last post."""
    incident: Incident | None = None
    last: Delivery | None = None
    n = 0
    for i, batch in enumerate(batches):
        at = T0 + timedelta(minutes=10 * i)
        for severity, resolved in batch:
            n += 1
            title = "asg:train: alarm OK again" if resolved else f"asg:train: scaled {n} -> {n + 1}"
            found = note(
                NotificationKind.SCALING,
                severity,
                "asg:train",
                title,
                at=at,
                source="t",
                id_parts=(str(n),),
                resolved=resolved,
            )
            incident = merge_notification(incident, found, at, FlapDamping()) or incident
        assert incident is not None
        now = at + timedelta(minutes=1)
        plan = plan_delivery(incident, now, Grouping(), FlapDamping())
        if plan.delivery is not None:
            last = plan.delivery
            incident = complete_delivery(incident, last, now, None)
    assert last is not None
    return last


@pytest.mark.parametrize(
    ("batches", "shown"),
    [
        # the demo's "[INFO update] scaled 2 -> 1 ... State: resolved": its alarm went OK before the post
        pytest.param((((INFO, FIRES),), ((INFO, FIRES), (INFO, CLEARS))), None, id="info-alarm-ok-before-the-post"),
        pytest.param((((INFO, FIRES),),), None, id="info-scaling-step"),
        pytest.param((((INFO, FIRES),), ((INFO, CLEARS), (INFO, FIRES))), None, id="info-after-its-alarm-ok"),
        pytest.param((((WARNING, FIRES),),), "firing", id="warning-firing"),
        pytest.param((((WARNING, FIRES),), ((INFO, FIRES),)), "firing", id="info-inside-a-firing-warning"),
        pytest.param((((WARNING, FIRES),), ((WARNING, CLEARS),)), "resolved", id="warning-resolved"),
    ],
)
def test_slack_and_sns_show_a_state_only_where_one_can_fire_and_resolve(
    batches: tuple[Batch, ...], shown: str | None
) -> None:
    d = last_post(*batches)
    payload = render_slack(d)
    fields = [f["text"] for f in payload["blocks"][1]["fields"]]
    _, message, attributes = render_sns(d)
    lines = message.splitlines()
    if shown is None:
        assert not [f for f in fields if f.startswith("*State*")], fields
        assert not [line for line in lines if line.startswith("State:")], message
        assert "state" not in attributes
    else:
        assert f"*State*\n{shown}" in fields
        assert f"State: {shown}" in lines
        assert attributes["state"]["StringValue"] == shown
    assert payload["text"].startswith(":white_check_mark:") is (shown == "resolved")
