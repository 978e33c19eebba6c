"""A hostile or broken policy document is a policy error like any other (issue 22, item 4): deep nesting,
alias bombs and oversized texts give one clear line, never a RecursionError, so the last good policy holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import pytest
from aws_lambda_powertools import Logger

from gpufleet.aws.policy_store import LastGood
from gpufleet.domain.errors import PolicyError
from gpufleet.domain.policy import MAX_POLICY_ALIASES, MAX_POLICY_BYTES, MAX_POLICY_DEPTH, parse_policy
from gpufleet.policy_loading import LastGoodPolicy

NESTED = "defaults: " + "[" * 500 + "]" * 500  # 1 KB, 500 levels: RecursionError before the bound
ALIAS_BOMB = "a: &a [x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(20)
)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (NESTED, f"nested deeper than {MAX_POLICY_DEPTH} levels"),
        (ALIAS_BOMB, f"more than {MAX_POLICY_ALIASES} aliases"),
        ("# " + "x" * MAX_POLICY_BYTES, "more than a policy may be"),
        ("{" * 100_000, "nested deeper than"),  # JSON goes through the same loader
    ],
)
def test_a_hostile_document_is_one_policy_error(text: str, says: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(text, "ssm:/gpufleet/policy")
    [problem] = raised.value.problems
    assert says in problem and problem.startswith("ssm:/gpufleet/policy: ") and "\n" not in problem


def test_real_policies_are_well_within_the_bounds() -> None:
    nested = "defaults:\n  target: {low: 20, high: 80}\n  idle: {gpu_utilization: 5}\n"
    assert parse_policy(nested).defaults.target.low == 20
    anchors = "defaults: &d {scale_out_cooldown_s: 120}\n"
    assert parse_policy(anchors).defaults.scale_out_cooldown_s == 120


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
