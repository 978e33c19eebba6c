"""Every DynamoDB key gpufleet builds from outside text is bounded, stable and keeps distinct inputs apart
(issue 22 #1: a 246-character four-byte alarm name made an audit key DynamoDB refused, forever). The pure
builders here; those the adapters build (the group partition key, the decision sort key, the EKS request
token) in tests/adapters/aws/test_keys.py, by the same check."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.keys import DIGEST_MARK, MAX_KEY_BYTES, bounded, joined, utf8_len
from gpufleet.domain.notification import MAX_INCIDENT_KEY_BYTES, NotificationKind, Severity, note
from tests.profiles import examples

AT = datetime(2026, 11, 23, 8, 12, tzinfo=UTC)
ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=600) | st.text(st.sampled_from("a😀é#~h:"), max_size=600)
KEY_EXAMPLES = examples(150)  # per builder


def _incident_key(group: str) -> str:
    group = f"asg:{group}"  # never empty, as a group key
    return note(NotificationKind.SCALING, Severity.INFO, group, "t", at=AT, source="s", id_parts=(group,)).incident_key


BUILDERS: dict[str, tuple[Callable[[str], str], int]] = {
    "incident / silence sort key": (bounded, MAX_KEY_BYTES),
    "notification incident key": (_incident_key, MAX_INCIDENT_KEY_BYTES),
}


def check_key_builder(build: Callable[[str], str], limit: int, a: str, b: str) -> None:
    key_a, key_b = build(a), build(b)
    assert utf8_len(key_a) <= limit and utf8_len(key_b) <= limit
    assert build(a) == key_a  # stable: a retry builds the same key
    if a != b:
        assert key_a != key_b  # distinct inputs stay distinct


@pytest.mark.parametrize("name", sorted(BUILDERS))
@settings(max_examples=KEY_EXAMPLES, deadline=None)
@given(a=ANY_TEXT, b=ANY_TEXT)
def test_every_key_builder_is_bounded_stable_and_injective(name: str, a: str, b: str) -> None:
    check_key_builder(*BUILDERS[name], a, b)


def test_a_short_text_that_looks_like_a_shortened_key_is_shortened_too() -> None:
    """So it can never collide with one."""
    key = bounded("GROUP#asg:gpufleet-" + "😀" * 300)
    assert key.startswith("GROUP#asg:gpufleet-😀") and DIGEST_MARK in key and utf8_len(key) <= MAX_KEY_BYTES
    assert bounded(key) != key and joined("P#", "x") == "P#x"
