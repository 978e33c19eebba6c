"""Items DynamoDB leaves unprocessed (throttling) are sent again with capped, jittered exponential backoff,
a bounded number of times (issue 22 #5: a throttled table was re-asked millions of times in seconds)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from gpufleet.aws.audit import AuditLog
from gpufleet.aws.state import BatchNotProcessed, batch_get, until_processed
from gpufleet.domain import defaults
from gpufleet.domain.models import Action, Decision, Trigger, TriggerKind

LOOPED = 10_000  # what the old tight loop reached at once: the fake gives up there


class ThrottledTable:
    """A DynamoDB that leaves everything unprocessed for its first `throttled` calls."""

    def __init__(self, throttled: int) -> None:
        self.throttled = throttled
        self.calls = 0

    def _answer(self, left_key: str, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls >= LOOPED:
            raise AssertionError(f"re-asked {self.calls} times without giving up")
        return {left_key: request} if self.calls <= self.throttled else {}

    def batch_write_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:  # noqa: N803 (boto3's name)
        return self._answer("UnprocessedItems", RequestItems)

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:  # noqa: N803
        return {**self._answer("UnprocessedKeys", RequestItems), "Responses": {}}


def _decision() -> Decision:
    trigger = Trigger(kind=TriggerKind.ALARM, name="a")
    at = datetime(2026, 11, 23, tzinfo=UTC)
    return Decision(
        group="asg:g", action=Action.HOLD, current=0, desired=0, reason="r", trigger=trigger, event_id="e", at=at
    )


def test_a_throttled_batch_is_retried_with_growing_capped_waits_until_it_goes_through() -> None:
    table, waits = ThrottledTable(throttled=5), []
    until_processed(table.batch_write_item, {"t": [{"PutRequest": {}}]}, "UnprocessedItems", sleep=waits.append)
    assert table.calls == 6 and len(waits) == 5
    ceilings = [min(defaults.BATCH_BACKOFF_CAP_S, defaults.BATCH_BACKOFF_BASE_S * 2**i) for i in range(5)]
    assert all(0 <= w <= c for w, c in zip(waits, ceilings, strict=True))


@pytest.mark.parametrize("max_wait_s", [defaults.BATCH_WAIT_MAX_S, defaults.TERMINATION_BATCH_WAIT_MAX_S])
def test_a_table_that_never_recovers_ends_in_an_error_within_the_wait_allowed(max_wait_s: float) -> None:
    """Bounded in tries and in time: the termination policy, with 2 s to answer, waits 0.3 s at most.
    No pause follows the last try (it would only delay the error)."""
    table, waits = ThrottledTable(throttled=LOOPED), []
    with pytest.raises(BatchNotProcessed, match="1 items unprocessed after"):
        until_processed(
            table.batch_write_item, {"t": [{"PutRequest": {}}]}, "UnprocessedItems", waits.append, max_wait_s
        )
    assert 1 <= table.calls <= defaults.BATCH_ATTEMPTS
    assert len(waits) == table.calls - 1 and sum(waits) <= max_wait_s


@pytest.mark.parametrize("path", ["audit record", "batch get"])
def test_the_audit_and_batch_reads_back_off_instead_of_spinning(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    table = ThrottledTable(throttled=LOOPED)
    calls = {
        "audit record": lambda: AuditLog(table, "t").record([_decision()], 30),  # type: ignore[arg-type]
        "batch get": lambda: batch_get(table, "t", [("GROUP#asg:g", "STATE")]),  # type: ignore[arg-type]
    }
    with pytest.raises(BatchNotProcessed):
        calls[path]()
    assert 1 < table.calls <= defaults.BATCH_ATTEMPTS and len(waits) == table.calls - 1
    assert sum(waits) <= defaults.BATCH_WAIT_MAX_S
