"""The demo's policy passes `gpufleet validate-policy`'s static checks clean (the other shipped policies:
tests/unit/domain/test_policy_checks.py). It lives in the rehearsal, which imports the runtime."""

from __future__ import annotations

from rehearsal.scenario import POLICY
from tests.unit.domain.test_policy_checks import problems


def test_the_demos_policy_is_clean() -> None:
    assert problems(POLICY) == []
