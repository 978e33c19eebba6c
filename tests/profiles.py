"""hypothesis profiles: how many examples a property runs with, chosen by HYPOTHESIS_PROFILE (the Makefile
sets it; unset is `ci`).

- `dev` (`make unit`): a tenth of `ci`'s examples, for the edit loop;
- `ci` (`make test`, `make pytest`, and plain `pytest`): hypothesis's default, 100 examples a property,
  the counts the suite has always run;
- `deep` (`make fuzz`): five times `ci`'s.

A property that needs more or fewer examples than the profile's says so relative to it: `examples(300)` is
300 under `ci`, 30 under `dev`, 1,500 under `deep`. The fuzz (tests/unit/test_fuzz_inputs.py) scales its
seeded loops the same way: FUZZ_SCALE is its share of the full run under each profile (GPUFLEET_FUZZ_SCALE
overrides it).
"""

from __future__ import annotations

import os

from hypothesis import settings

CI_EXAMPLES = 100  # hypothesis's default max_examples
PROFILES = {"dev": 10, "ci": CI_EXAMPLES, "deep": 500}  # max_examples of a property under each profile
FUZZ_SCALES = {"dev": 0.05, "ci": 0.5, "deep": 1.0}  # the fuzz's share of its full run (86k inputs)

for _name, _count in PROFILES.items():
    settings.register_profile(_name, max_examples=_count)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or "ci"
if PROFILE not in PROFILES:
    raise ValueError(f"HYPOTHESIS_PROFILE is one of {', '.join(PROFILES)} (got {PROFILE!r})")
settings.load_profile(PROFILE)
FUZZ_SCALE = float(os.environ.get("GPUFLEET_FUZZ_SCALE") or FUZZ_SCALES[PROFILE])


def examples(n: int) -> int:
    """`n` examples under `ci`, scaled by the profile (at least 1)."""
    return max(1, round(n * PROFILES[PROFILE] / CI_EXAMPLES))
