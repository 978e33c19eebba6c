"""Incidents: grouping, pacing, repeats, resolution, flap damping, silences, two-phase delivery."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.incidents import Incident, Silence
from gpufleet.domain.notification import IncidentState, Notification, NotificationKind, Severity
from gpufleet.notify.incidents import (
    MAX_PENDING_UPDATES,
    POSTING_STALE_S,
    active_silence,
    begin_delivery,
    complete_delivery,
    fail_delivery,
    merge_notification,
    plan_delivery,
)
from gpufleet.notify.render import render_slack
from gpufleet.policy.notify import FlapDamping, Grouping
from tests.profiles import examples

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
GROUPING = Grouping()  # 30 s wait, 5 min interval, 4 h repeat
FLAP = FlapDamping()  # more than 4 flips in 1 h


def note(
    n: int,
    at: datetime = T0,
    state: IncidentState = IncidentState.FIRING,
    severity: Severity = Severity.WARNING,
    key: str = "asg:train|capacity",
) -> Notification:
    return Notification(
        notification_id=f"n{n}",
        kind="scaling",
        severity=severity,
        group="asg:train",
        incident_key=key,
        title=f"event {n} ({state})",
        reason=f"because {n}",
        state=state,
        at=at,
    )


def fold(incident: Incident | None, n: Notification, now: datetime) -> Incident:
    merged = merge_notification(incident, n, now, FLAP)
    assert merged is not None
    return merged


def post(incident: Incident, now: datetime) -> tuple[Incident, str | None]:
    """Plan at `now`; if a post is due, post it (two-phase) and return its occasion."""
    plan = plan_delivery(incident, now, GROUPING, FLAP)
    if plan.delivery is None:
        return incident, None
    started = begin_delivery(incident, plan.delivery, now)
    return complete_delivery(started, plan.delivery, now, thread_ts="1.0"), plan.delivery.occasion


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_first_post_waits_for_grouping_and_collects_what_arrived_meanwhile() -> None:
    inc = fold(None, note(1), T0)
    plan = plan_delivery(inc, at(10), GROUPING, FLAP)
    assert plan.delivery is None and plan.wake_at == at(30)
    inc = fold(inc, note(2, severity=Severity.CRITICAL), at(20))
    plan = plan_delivery(inc, at(30), GROUPING, FLAP)
    assert plan.delivery is not None
    assert plan.delivery.occasion == "new"
    assert [u.notification_id for u in plan.delivery.updates] == ["n1", "n2"]
    assert plan.delivery.severity is Severity.CRITICAL  # the worst of what is firing


def test_duplicate_notification_folds_once() -> None:
    inc = fold(None, note(1), T0)
    assert merge_notification(inc, note(1), at(5), FLAP) is None


@pytest.mark.parametrize(
    ("update_at", "check_at", "expect"),
    [
        (60, 120, None),  # inside the 5 min interval after the first post at 30 s
        (60, 329, None),
        (60, 330, "update"),
        (400, 400, "update"),  # interval long over: posted at once
    ],
)
def test_updates_are_paced_by_group_interval(update_at: int, check_at: int, expect: str | None) -> None:
    inc, occasion = post(fold(None, note(1), T0), at(30))
    assert occasion == "new"
    inc = fold(inc, note(2), at(update_at))
    _, occasion = post(inc, at(check_at))
    assert occasion == expect


def test_firing_incident_repeats_every_repeat_interval_and_not_before() -> None:
    inc, _ = post(fold(None, note(1), T0), at(30))
    assert post(inc, at(30 + 4 * 3600 - 1))[1] is None
    inc, occasion = post(inc, at(30 + 4 * 3600))
    assert occasion == "repeat"
    assert post(inc, at(30 + 4 * 3600 + 60))[1] is None


def test_resolution_is_posted_and_ends_repeats() -> None:
    inc, _ = post(fold(None, note(1), T0), at(30))
    inc = fold(inc, note(2, state=IncidentState.RESOLVED), at(600))
    inc, occasion = post(inc, at(600))
    assert occasion == "resolved"
    assert plan_delivery(inc, at(10 * 3600), GROUPING, FLAP).delivery is None
    # Another "resolved" for the same closed incident says nothing new.
    inc = fold(inc, note(3, state=IncidentState.RESOLVED), at(700))
    assert not inc.pending


def test_resolved_before_the_first_post_is_one_message_telling_both() -> None:
    inc = fold(None, note(1), T0)
    inc = fold(inc, note(2, state=IncidentState.RESOLVED), at(10))
    plan = plan_delivery(inc, at(30), GROUPING, FLAP)
    assert plan.delivery is not None and plan.delivery.occasion == "resolved"
    assert len(plan.delivery.updates) == 2


def test_resolved_for_an_incident_nobody_saw_posts_nothing() -> None:
    inc = fold(None, note(1, state=IncidentState.RESOLVED), T0)
    assert plan_delivery(inc, at(3600), GROUPING, FLAP).delivery is None


def test_return_after_a_quiet_hour_is_a_new_incident_not_a_flip() -> None:
    inc, _ = post(fold(None, note(1), T0), at(30))
    inc, _ = post(fold(inc, note(2, state=IncidentState.RESOLVED), at(400)), at(400))
    later = fold(inc, note(3), at(400 + FLAP.window_s + 1))
    assert later.sent_count == 0 and later.flips == () and later.thread_ts is None


def test_flapping_incident_is_summarised_once_per_window() -> None:
    inc, _ = post(fold(None, note(0), T0), at(30))
    posts = []
    for i in range(1, 13):  # flips every 2 minutes for 24 minutes
        state = IncidentState.RESOLVED if i % 2 else IncidentState.FIRING
        inc = fold(inc, note(i, at=at(120 * i), state=state), at(120 * i))
        inc, occasion = post(inc, at(120 * i))
        if occasion:
            posts.append(occasion)
    # Without damping: a post at every group interval (4 in 24 min). With it: the first flips still go
    # out as updates/resolutions until the threshold, then one flapping summary for the window.
    assert posts.count("flapping") == 1
    assert len(posts) <= 3


def test_in_flight_delivery_is_reposted_unchanged_and_later_updates_stay_pending() -> None:
    inc = fold(None, note(1), T0)
    plan = plan_delivery(inc, at(30), GROUPING, FLAP)
    assert plan.delivery is not None
    started = begin_delivery(inc, plan.delivery, at(30))
    # The post's answer is lost (the invocation dies); meanwhile another notification arrives.
    started = fold(started, note(2), at(31))
    waiting = plan_delivery(started, at(40), GROUPING, FLAP)
    assert waiting.delivery is None and "another invocation is posting" in waiting.why  # no double post
    retry = plan_delivery(started, at(30 + POSTING_STALE_S), GROUPING, FLAP)  # that attempt has died
    assert retry.delivery is not None
    assert retry.delivery.delivery_id == plan.delivery.delivery_id
    again = begin_delivery(started, retry.delivery, at(30 + POSTING_STALE_S))
    assert again.in_flight is not None and again.in_flight.attempts == 2
    done = complete_delivery(again, retry.delivery, at(200), thread_ts="9.9")
    assert [u.notification_id for u in done.pending] == ["n2"]
    assert done.in_flight is None and done.thread_ts == "9.9"


def test_a_failed_attempt_is_retried_at_once_skipping_the_channels_done() -> None:
    inc = fold(None, note(1), T0)
    plan = plan_delivery(inc, at(30), GROUPING, FLAP)
    assert plan.delivery is not None
    failed = fail_delivery(begin_delivery(inc, plan.delivery, at(30)), ("slack",), at(30))
    retry = plan_delivery(failed, at(31), GROUPING, FLAP)
    assert retry.delivery is not None and retry.delivery.delivery_id == plan.delivery.delivery_id
    assert begin_delivery(failed, retry.delivery, at(31)).channels_done == ("slack",)


def test_info_activity_is_a_quiet_log_no_resolution_no_repeat_no_flap() -> None:
    """Scaling steps (info): an alarm clearing and firing again continues the same thread."""
    info = Severity.INFO
    inc, occasion = post(fold(None, note(1, severity=info), T0), at(30))
    assert occasion == "new"
    for i in range(2, 12):  # the daily rhythm: scale, alarm clears, scale again...
        state = IncidentState.RESOLVED if i % 2 else IncidentState.FIRING
        inc = fold(inc, note(i, at=at(60 * i), state=state, severity=info), at(60 * i))
    assert inc.flips == ()
    assert all(u.state is IncidentState.FIRING for u in inc.pending)  # the clears are not news
    inc, occasion = post(inc, at(30 + GROUPING.group_interval_s + 600))
    assert occasion == "update"
    assert post(inc, at(30 + 5 * 3600))[1] is None  # no "still firing" repeats of activity


def test_a_failure_in_an_activity_thread_makes_it_an_incident_that_resolves() -> None:
    inc, _ = post(fold(None, note(1, severity=Severity.INFO), T0), at(30))
    inc, occasion = post(fold(inc, note(2, severity=Severity.CRITICAL), at(400)), at(400))
    assert (occasion, inc.severity) == ("update", Severity.CRITICAL)
    inc = fold(inc, note(3, state=IncidentState.RESOLVED, severity=Severity.INFO), at(800))
    inc, occasion = post(inc, at(800))
    assert occasion == "resolved"


def test_a_resolution_closes_only_what_its_own_kind_opened() -> None:
    """The capacity thread: spot_watch's failure is open; the scaler's 'alarm OK' must not close it."""
    spot = note(1).model_copy(update={"kind": "spot"})
    inc, _ = post(fold(None, spot, T0), at(30))
    alarm_ok = note(2, state=IncidentState.RESOLVED, severity=Severity.INFO)  # kind "scaling"
    inc = fold(inc, alarm_ok, at(400))
    assert inc.state is IncidentState.FIRING and inc.severity is Severity.WARNING
    inc, occasion = post(inc, at(400))
    assert occasion == "update"
    recovered = note(3, state=IncidentState.RESOLVED, severity=Severity.INFO).model_copy(update={"kind": "spot"})
    inc = fold(inc, recovered, at(800))
    # Scaling activity right after, before the resolution was posted, joins the resolving post.
    inc = fold(inc, note(4, severity=Severity.INFO), at(810))
    plan = plan_delivery(inc, at(800 + GROUPING.group_interval_s), GROUPING, FLAP)
    assert plan.delivery is not None and plan.delivery.occasion == "resolved"
    assert [u.notification_id for u in plan.delivery.updates][-2:] == ["n3", "n4"]
    inc, _ = post(inc, at(800 + GROUPING.group_interval_s))
    later = fold(inc, note(5, severity=Severity.INFO), at(2000))  # after it: a quiet log, no flap
    assert (
        later.state is IncidentState.FIRING and later.severity is Severity.INFO and len(later.flips) == len(inc.flips)
    )


def test_a_partial_resolution_shows_its_own_facts_not_the_last_notes() -> None:
    """Issue 23: the scaler's 'alarm OK' landing in a capacity thread whose spot warning is still open
    showed the previous hand-back's facts ('owed back to spot: 1') under its own title."""
    spot = note(1).model_copy(update={"kind": "spot", "facts": {"owed back to spot": "1"}})
    inc, _ = post(fold(None, spot, T0), at(30))
    alarm_ok = note(2, state=IncidentState.RESOLVED, severity=Severity.INFO).model_copy(update={"facts": {"a": "b"}})
    inc = fold(inc, alarm_ok, at(400))
    assert inc.state is IncidentState.FIRING and inc.title == alarm_ok.title
    assert inc.facts == {"a": "b"} and inc.kind == "scaling"


def _activity_after_resolution(resolution_posted: bool) -> Incident:
    """A warning resolved (posted or not), then 25 scaling steps (info) before the next post."""
    inc, _ = post(fold(None, note(1), T0), at(30))
    inc = fold(inc, note(2, state=IncidentState.RESOLVED, severity=Severity.INFO), at(400))
    if resolution_posted:
        inc, occasion = post(inc, at(400))
        assert occasion == "resolved"
    for i in range(3, 28):
        inc = fold(inc, note(i, at=at(400 + i), severity=Severity.INFO), at(400 + i))
    return inc


@pytest.mark.parametrize("resolution_posted", [False, True])
def test_updates_beyond_the_pending_limit_are_counted_in_every_branch(resolution_posted: bool) -> None:
    """Reproduced defect: two branches kept the last 20 pending updates without counting the rest, so
    the post never said how many earlier updates it did not show."""
    inc = _activity_after_resolution(resolution_posted)
    assert len(inc.pending) == MAX_PENDING_UPDATES
    shown = MAX_PENDING_UPDATES if resolution_posted else MAX_PENDING_UPDATES - 1
    assert inc.dropped_updates == 25 + (0 if resolution_posted else 1) - MAX_PENDING_UPDATES, shown
    plan = plan_delivery(inc, at(400 + 3600), GROUPING, FLAP)
    assert plan.delivery is not None
    text = json.dumps(render_slack(plan.delivery))
    assert f"{inc.dropped_updates} earlier updates not shown" in text


def test_the_incident_shows_the_kind_of_its_latest_notification() -> None:
    """A spot failure joining a scaling thread is shown as spot (silences and routes match it so)."""
    inc, _ = post(fold(None, note(1, severity=Severity.INFO), T0), at(30))
    inc = fold(inc, note(2).model_copy(update={"kind": NotificationKind.SPOT}), at(400))
    plan = plan_delivery(inc, at(400), GROUPING, FLAP)
    assert plan.delivery is not None and plan.delivery.kind is NotificationKind.SPOT
    fields = [f["text"] for f in render_slack(plan.delivery)["blocks"][1]["fields"]]
    assert "*Kind*\nspot" in fields


@pytest.mark.parametrize(
    ("silence", "covered"),
    [
        ({"groups": ("asg:train*",)}, True),
        ({"groups": ("asg:infer*",)}, False),
        ({"kinds": ("scaling",), "severities": (Severity.WARNING,)}, True),
        ({"kinds": ("scaling",), "severities": (Severity.CRITICAL,)}, False),
        ({"groups": ("asg:train",), "expired": True}, False),
    ],
)
def test_silences_match_group_kind_severity_and_expire(silence: dict[str, object], covered: bool) -> None:
    expired = silence.pop("expired", False)
    s = Silence(
        silence_id="s1",
        reason="maintenance",
        starts_at=T0 - timedelta(hours=1),
        expires_at=T0 - timedelta(seconds=1) if expired else T0 + timedelta(hours=1),
        **silence,  # type: ignore[arg-type]
    )
    assert (active_silence(note(1), [s], T0) is not None) is covered


# ---- properties over random notification streams ----

events = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=6 * 3600),  # arrival, seconds after T0
        st.booleans(),  # firing?
        st.sampled_from(list(Severity)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=examples(150), deadline=None)
@given(events=events, tick_s=st.sampled_from([10, 60, 300]))
def test_posts_are_paced_and_nothing_is_left_unsaid(events: list[tuple[int, bool, Severity]], tick_s: int) -> None:
    """Whatever arrives: no post before the group wait, posts at least a group interval apart, and
    after a final look everything that was folded in has been posted."""
    arrivals = sorted(events)
    inc: Incident | None = None
    post_times: list[datetime] = []
    i = 0
    t = 0
    end = arrivals[-1][0] + 2 * FLAP.window_s + GROUPING.group_interval_s
    while t <= end:
        while i < len(arrivals) and arrivals[i][0] <= t:
            secs, firing, severity = arrivals[i]
            state = IncidentState.FIRING if firing else IncidentState.RESOLVED
            inc = fold(inc, note(i, at=at(secs), state=state, severity=severity), at(t))
            i += 1
        if inc is not None:
            first, opened = inc.sent_count == 0, inc.opened_at
            inc, occasion = post(inc, at(t))
            if occasion:
                post_times.append(at(t))
                if first:
                    assert at(t) >= opened + timedelta(seconds=GROUPING.group_wait_s)
        t += tick_s
    assert inc is not None
    for a, b in itertools.pairwise(post_times):
        assert b - a >= timedelta(seconds=GROUPING.group_interval_s)
    assert inc.pending == ()
