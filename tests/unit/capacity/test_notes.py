"""What spot_watch tells when it hands on-demand capacity back (issue 23): the facts as they stand after
the change, never an earlier note's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.capacity.core import SpotState
from gpufleet.capacity.notes import spot_notes
from gpufleet.domain.models import (
    Action,
    Decision,
    GroupObservation,
    GroupRef,
    InstanceObservation,
    Outcome,
    Trigger,
    TriggerKind,
)
from gpufleet.policy.capacity import PriceTable

NOW = datetime(2026, 11, 23, 9, 5, tzinfo=UTC)
PRICES = PriceTable(on_demand={"g5.12xlarge": 5.672}, spot={"g5.12xlarge": 2.10})
SPOT = GroupObservation(
    ref=GroupRef.parse_key("asg:train-spot"),
    min_size=1,
    max_size=8,
    desired=6,
    instance_types=("g5.12xlarge",),
    instances=tuple(InstanceObservation(instance_id=f"i-{i}", lifecycle_state="InService") for i in range(6)),
)
PLAN = "spot delivering again: hand back {n} of {n}"


def hand_back(current: int, desired: int, passed_over: str = "") -> tuple[Decision, str]:
    """The fallback group's scale-in as the scaler's executor returns it, with the plan's reason."""
    reason = (
        f"{PLAN.format(n=current)} (asg:train-ondemand): scale in {current} -> {desired}, terminating i-od "
        f"(1 idle (<= 5% util, <= 10% mem){passed_over})"
    )
    decision = Decision(
        group="asg:train-ondemand",
        action=Action.SCALE_IN,
        current=current,
        desired=desired,
        victims=("i-od",),
        reason=reason,
        trigger=Trigger(kind=TriggerKind.SPOT_FALLBACK, name="asg:train-spot"),
        event_id="spot-65",
        at=NOW,
        outcome=Outcome.APPLIED,
    )
    return decision, PLAN.format(n=current)


def told(fallback: tuple[Decision, str] | None, owed_after: int, streak_over: bool) -> dict[str, dict[str, str]]:
    """Title -> (facts + Why) of each note one spot_watch pass tells."""
    before = SpotState(streak_started_at=NOW - timedelta(minutes=50), fallback_added=owed_after + 1)
    after = before.model_copy(update={"fallback_added": owed_after})
    notes = spot_notes(
        SPOT, before, after, [], fallback, streak_over, PRICES, now=NOW, event_id="spot-65", region="us-east-1"
    )
    return {n.title.split(": ", 1)[1]: {**n.facts, "Why": n.reason, "state": str(n.state)} for n in notes}


@pytest.mark.parametrize(
    ("fallback", "owed", "streak_over", "expected"),
    [
        pytest.param(  # the demo at 09:05: the last on-demand node handed back, the streak over, one pass
            hand_back(1, 0),
            0,
            True,
            {
                "handing capacity back to spot: asg:train-ondemand 1 -> 0": {
                    "owed back to spot": "0 (all handed back)"
                },
                "launches recovered, capacity back on spot": {
                    "owed back to spot": "0",
                    "fallback group": "asg:train-ondemand at 0 (was 1)",
                    "state": "resolved",
                },
            },
            id="last-hand-back-and-recovery",
        ),
        pytest.param(  # 08:39: the plan asked for 2, one node was busy: the note says why only 1 went
            hand_back(2, 1, "; passed over 1 busy"),
            1,
            False,
            {
                "handing capacity back to spot: asg:train-ondemand 2 -> 1": {
                    "owed back to spot": "1",
                    "Why": "spot delivering again: hand back 2 of 2 (asg:train-ondemand): scale in 2 -> 1, "
                    "terminating i-od (1 idle (<= 5% util, <= 10% mem); passed over 1 busy)",
                }
            },
            id="partial-hand-back",
        ),
        pytest.param(  # handed back in an earlier pass: the resolution still states the ledger now
            None,
            0,
            True,
            {
                "launches recovered, capacity back on spot": {
                    "owed back to spot": "0",
                    "fallback group": None,  # nothing moved in this pass
                    "state": "resolved",
                }
            },
            id="recovery-after-an-earlier-hand-back",
        ),
    ],
)
def test_hand_backs_and_the_recovery_state_the_facts_after_the_change(
    fallback: tuple[Decision, str] | None, owed: int, streak_over: bool, expected: dict[str, dict[str, str | None]]
) -> None:
    notes = told(fallback, owed, streak_over)
    assert set(notes) == set(expected)
    for title, facts in expected.items():
        assert {k: notes[title].get(k) for k in facts} == facts, notes[title]
