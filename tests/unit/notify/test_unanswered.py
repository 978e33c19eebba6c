"""Issue 29: a post Slack took but did not answer in time may have landed. It is repeated once at most,
marked as a possible duplicate, then held until the repeat interval (or the group interval when
something new arrived). An error that sent nothing is still retried at every look. Pure: the incident
fold and plan on an injected clock."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.incidents import Incident, Occasion
from gpufleet.notify.incidents import (
    MAX_UNANSWERED,
    POSTING_STALE_S,
    begin_delivery,
    complete_delivery,
    fail_delivery,
    plan_delivery,
)
from gpufleet.notify.render import MAYBE_DUPLICATE, render_slack
from tests.profiles import examples
from tests.unit.notify.test_incidents import FLAP, GROUPING, at, fold, note

REPEAT_S = GROUPING.repeat_interval_s


def attempt(incident: Incident, now: datetime, outcome: str) -> tuple[Incident, str | None]:
    """Plan at `now`; if a post is due, post it with `outcome` ("ok", "timeout": the post landed but the
    answer came too late, "5xx": nothing sent). The rendered text of what was posted, if anything."""
    plan = plan_delivery(incident, now, GROUPING, FLAP)
    if plan.delivery is None:
        return incident, None
    started = begin_delivery(incident, plan.delivery, now)
    text = render_slack(plan.delivery)["text"]
    if outcome == "ok":
        return complete_delivery(started, plan.delivery, now, thread_ts="1.0"), text
    return fail_delivery(started, (), now, unanswered=outcome == "timeout"), text


def first_post(outcome: str) -> tuple[Incident, str | None]:
    return attempt(fold(None, note(1), at(0)), at(GROUPING.group_wait_s), outcome)


def sweeps(incident: Incident, start_s: int, end_s: int, outcome: str) -> tuple[Incident, list[str]]:
    """A sweep every minute from `start_s` to `end_s` (seconds after T0), Slack answering `outcome`."""
    posted = []
    for t in range(start_s, end_s + 1, 60):
        incident, text = attempt(incident, at(t), outcome)
        if text is not None:
            posted.append(text)
    return incident, posted


def test_a_slow_slack_gets_the_post_and_one_marked_repeat_then_nothing_until_the_repeat_interval() -> None:
    """The probe's finding: every sweep re-posted the unconfirmed delivery (6 NEW posts in 3 minutes)."""
    inc, first = first_post("timeout")
    inc, repeats = sweeps(inc, 60, 240, "timeout")
    assert first is not None and MAYBE_DUPLICATE not in first
    assert len(repeats) == 1 and MAYBE_DUPLICATE in repeats[0]  # the one repeat, marked
    assert inc.in_flight is not None and inc.in_flight.unanswered == MAX_UNANSWERED
    held = plan_delivery(inc, at(240), GROUPING, FLAP)
    assert held.delivery is None and held.why.startswith("held until")
    assert held.wake_at == inc.in_flight.unanswered_at + timedelta(seconds=REPEAT_S)
    inc, later = sweeps(inc, 300, 60 + REPEAT_S + 60, "timeout")  # one more after the repeat interval
    assert len(later) == 1 and MAYBE_DUPLICATE in later[0]
    inc, answered = sweeps(inc, 120 + 2 * REPEAT_S, 180 + 2 * REPEAT_S, "ok")  # Slack answers again
    assert len(answered) == 1 and inc.in_flight is None and inc.sent_count == 1


def test_an_error_that_sent_nothing_is_still_retried_at_every_sweep_unmarked() -> None:
    inc, _ = first_post("5xx")
    inc, retries = sweeps(inc, 60, 240, "5xx")
    assert len(retries) == 4 and not any(MAYBE_DUPLICATE in t for t in retries)
    inc, done = sweeps(inc, 300, 300, "ok")
    assert len(done) == 1 and MAYBE_DUPLICATE not in done[0] and inc.in_flight is None


def test_a_slack_that_answers_is_unaffected() -> None:
    inc, first = first_post("ok")
    inc, more = sweeps(inc, 60, 240, "ok")
    assert first is not None and MAYBE_DUPLICATE not in first and more == [] and inc.sent_count == 1


def test_a_timeout_then_errors_still_retries_until_a_second_post_may_have_landed() -> None:
    """Only attempts that may have posted count: 5xx answers between them do not use up the repeat."""
    inc, _ = first_post("timeout")
    inc, errors = sweeps(inc, 60, 180, "5xx")
    assert len(errors) == 3 and all(MAYBE_DUPLICATE in t for t in errors)
    inc, lost = sweeps(inc, 240, 600, "timeout")
    assert len(lost) == 1 and inc.in_flight is not None and inc.in_flight.unanswered == 2


def test_what_arrives_while_held_is_posted_after_the_group_interval_with_everything_unconfirmed() -> None:
    inc, _ = first_post("timeout")
    inc, _ = attempt(inc, at(60), "timeout")  # held from 60 s
    inc = fold(inc, note(2), at(90))
    assert plan_delivery(inc, at(60 + GROUPING.group_interval_s - 1), GROUPING, FLAP).delivery is None
    plan = plan_delivery(inc, at(60 + GROUPING.group_interval_s), GROUPING, FLAP)
    assert plan.delivery is not None and plan.delivery.occasion is Occasion.NEW  # no thread may exist yet
    assert [u.notification_id for u in plan.delivery.updates] == ["n1", "n2"]
    assert inc.in_flight is not None and plan.delivery.delivery_id == inc.in_flight.delivery_id
    assert MAYBE_DUPLICATE in render_slack(plan.delivery)["text"]
    done = complete_delivery(begin_delivery(inc, plan.delivery, at(400)), plan.delivery, at(400), "1.0")
    assert done.pending == () and done.in_flight is None


def test_an_attempt_that_died_while_posting_counts_as_unanswered() -> None:
    """The invocation died mid-post (its answer never came): the re-post is the one repeat, marked."""
    inc = fold(None, note(1), at(0))
    plan = plan_delivery(inc, at(30), GROUPING, FLAP)
    assert plan.delivery is not None
    died = begin_delivery(inc, plan.delivery, at(30))
    again = plan_delivery(died, at(30 + POSTING_STALE_S), GROUPING, FLAP)
    assert again.delivery is not None and again.delivery.unanswered == 1
    assert MAYBE_DUPLICATE in render_slack(again.delivery)["text"]
    lost = fail_delivery(begin_delivery(died, again.delivery, at(200)), (), at(200), unanswered=True)
    assert plan_delivery(lost, at(260), GROUPING, FLAP).delivery is None  # held


@settings(max_examples=examples(60), deadline=None)
@given(outcomes=st.lists(st.sampled_from(["ok", "timeout", "5xx"]), min_size=1, max_size=300))
def test_posts_that_may_have_landed_are_bounded_by_the_repeat_interval(outcomes: list[str]) -> None:
    """Whatever Slack answers at each minute's sweep: between two confirmed posts, at most two posts
    that may have landed, plus one per repeat interval after that."""
    inc, _ = first_post("timeout")
    unanswered_at = [at(GROUPING.group_wait_s)]
    for i, outcome in enumerate(outcomes, start=1):
        now = at(GROUPING.group_wait_s + 60 * i)
        inc, text = attempt(inc, now, outcome)
        if text is not None and outcome == "timeout":
            unanswered_at.append(now)
        if inc.in_flight is None:
            break
    span_s = (unanswered_at[-1] - unanswered_at[0]).total_seconds()
    assert len(unanswered_at) <= MAX_UNANSWERED + span_s // REPEAT_S


def test_a_held_critical_post_waits_the_group_interval_not_hours() -> None:
    """Second probe: Slack failed twice with answers that may have posted, then recovered; a critical
    incident's post was held for the repeat interval (4 h by default). It now waits the group interval."""
    from gpufleet.domain.notification import Severity

    inc = fold(None, note(1, severity=Severity.CRITICAL), at(0))
    inc, first = attempt(inc, at(GROUPING.group_wait_s), "timeout")
    inc, repeats = sweeps(inc, 60, 120, "timeout")
    assert first is not None and len(repeats) == 1 and inc.in_flight is not None
    held = plan_delivery(inc, at(180), GROUPING, FLAP)
    assert held.delivery is None
    assert held.wake_at == inc.in_flight.unanswered_at + timedelta(seconds=GROUPING.group_interval_s)
    assert GROUPING.group_interval_s < REPEAT_S
    inc, later = sweeps(inc, 180, 120 + GROUPING.group_interval_s + 60, "ok")
    assert len(later) == 1 and MAYBE_DUPLICATE in later[0] and inc.in_flight is None
