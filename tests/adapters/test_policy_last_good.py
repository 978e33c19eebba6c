"""The last good policy holds when a new one is hostile or broken (issue 22, item 4): LastGoodPolicy
(gpufleet.policy_loading, glue: Powertools, the clock) over a PolicyStore. That each such document is one
policy error: tests/unit/test_policy_bounds.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from aws_lambda_powertools import Logger

from gpufleet.aws.policy_store import LastGood
from gpufleet.policy_loading import LastGoodPolicy
from tests.unit.test_policy_bounds import NESTED


@dataclass
class KeptPolicy:
    """A PolicyStore holding one last good text (fake: in memory)."""

    kept: LastGood | None = None
    saved: list[str] = field(default_factory=list)

    def save(self, text: str, source: str, at: datetime) -> None:
        self.saved.append(text)
        self.kept = LastGood(text, source, at.isoformat())

    def load(self) -> LastGood | None:
        return self.kept


def test_the_last_good_policy_holds_when_the_new_one_is_nested_500_deep() -> None:
    store = KeptPolicy()
    loader = LastGoodPolicy(store, Logger(service="test"), "scaler", writes=True)  # type: ignore[arg-type]
    good = loader.parse("defaults: {scale_out_cooldown_s: 90}\n", "ssm:/gpufleet/policy")
    assert good.defaults.scale_out_cooldown_s == 90 and store.saved
    assert loader.parse(NESTED, "ssm:/gpufleet/policy").defaults.scale_out_cooldown_s == 90


def test_the_last_good_policy_holds_when_the_new_one_has_an_impossible_date() -> None:
    store = KeptPolicy()
    loader = LastGoodPolicy(store, Logger(service="test"), "scaler", writes=True)  # type: ignore[arg-type]
    loader.parse("defaults: {scale_out_cooldown_s: 90}\n", "ssm:/gpufleet/policy")
    assert loader.parse("a: 2026-02-30\n", "ssm:/gpufleet/policy").defaults.scale_out_cooldown_s == 90
