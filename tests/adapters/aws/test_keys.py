"""The keys the adapters build from outside text (the group partition key, the decision sort key, the EKS
request token) are bounded, stable and keep distinct inputs apart, by the check of
tests/unit/domain/test_keys.py (issue 22 #1: a 246-character four-byte alarm name made an audit key
DynamoDB refused, forever)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings

from gpufleet.aws.audit import decision_sk
from gpufleet.aws.state import group_pk
from gpufleet.domain.keys import DIGEST_MARK, MAX_KEY_BYTES, bounded, joined, utf8_len
from gpufleet.domain.models import Action, Decision, Trigger, TriggerKind
from gpufleet.scaling.execution import request_token
from tests.unit.domain.test_keys import ANY_TEXT, AT, KEY_EXAMPLES, check_key_builder


def _decision(event_id: str, group: str = "asg:g") -> Decision:
    trigger = Trigger(kind=TriggerKind.ALARM, name="a")
    return Decision(
        group=group, action=Action.HOLD, current=0, desired=0, reason="r", trigger=trigger, event_id=event_id, at=AT
    )


BUILDERS: dict[str, tuple[Callable[[str], str], int]] = {
    "group partition key": (group_pk, MAX_KEY_BYTES),
    "decision sort key (alarm ARN / execution id)": (lambda t: decision_sk(_decision(t)), MAX_KEY_BYTES),
    "EKS request token": (lambda t: request_token(t, "asg:g"), 64),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
@settings(max_examples=KEY_EXAMPLES, deadline=None)
@given(a=ANY_TEXT, b=ANY_TEXT)
def test_every_key_builder_is_bounded_stable_and_injective(name: str, a: str, b: str) -> None:
    check_key_builder(*BUILDERS[name], a, b)


def test_a_key_that_fits_is_kept_and_a_long_one_keeps_its_readable_prefix() -> None:
    assert group_pk("asg:train-spot") == "GROUP#asg:train-spot"
    long_name = "asg:gpufleet-" + "😀" * 300
    key = group_pk(long_name)
    assert key.startswith("GROUP#asg:gpufleet-😀") and DIGEST_MARK in key and utf8_len(key) <= MAX_KEY_BYTES
    # A short text that looks like a shortened key is shortened too, so it can never collide with one.
    assert bounded(key) != key and joined("P#", "x") == "P#x"


def test_the_old_builders_overflowed_as_the_probe_found() -> None:
    """The ARN of an alarm named with the prefix and 246 four-byte characters, as the audit key had it."""
    arn = "arn:aws:cloudwatch:us-east-1:123456789012:alarm:gpufleet-" + "\U0001d518" * 246
    old_sk = f"DECISION#{AT.isoformat()}#{arn}@{AT.isoformat()}"
    assert utf8_len(old_sk) > 1024  # what DynamoDB refused
    assert utf8_len(decision_sk(_decision(f"{arn}@{AT.isoformat()}"))) <= 1024
