"""Where the fleet policy comes from: a local file (CLI, demo) or the SSM parameter (the deployed stack,
cached by Powertools), and the last good policy a controller falls back on when an edit does not parse.
Glue: it reads files and the parameter and writes the state table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities import parameters

from gpufleet.aws.policy_store import PolicyStore, digest
from gpufleet.domain import defaults
from gpufleet.domain.errors import PolicyError
from gpufleet.domain.notification import Notification
from gpufleet.policy.fleet import FleetPolicy, parse_policy
from gpufleet.scaling.notes import invalid_policy_note
from gpufleet.settings import Settings


@lru_cache(maxsize=8)
def _parse_cached(text: str, source: str) -> FleetPolicy:
    return parse_policy(text, source)


@dataclass
class LastGoodPolicy:
    """The deployed policy with a fallback: each new text that parses is kept in the state table (by the
    controllers, `writes`); an invalid one is replaced by the last kept, logged, and (where `tell` is given)
    told as CRITICAL - once per bad text per container, which then keeps its fallback instead of reading
    the table on every call. Nothing kept yet: the error stands, as before."""

    store: PolicyStore
    logger: Logger
    service: str
    writes: bool
    tell: Callable[[list[Notification]], object] | None = None
    _saved: set[str] = field(default_factory=set)
    _fallbacks: dict[str, FleetPolicy] = field(default_factory=dict)  # by the bad text's digest

    def parse(self, text: str, source: str) -> FleetPolicy:
        text_digest = digest(text)
        if text_digest in self._fallbacks:
            return self._fallbacks[text_digest]
        try:
            policy = _parse_cached(text, source)
        except PolicyError as bad:
            return self._fall_back(bad, text_digest, source)
        self._fallbacks.clear()  # a good text again: a later bad one falls back to it
        if self.writes and text_digest not in self._saved:
            self.store.save(text, source, datetime.now(UTC))
            self._saved.add(text_digest)
        return policy

    def _fall_back(self, bad: PolicyError, text_digest: str, source: str) -> FleetPolicy:
        last = self.store.load()
        if last is None:
            raise bad
        self.logger.error(
            "invalid fleet policy: running on the last good one",
            extra={"source": source, "problems": bad.problems[:5], "last_good_saved_at": last.saved_at},
        )
        if self.tell is not None:
            now = datetime.now(UTC)
            self.tell([invalid_policy_note(bad.problems, source, last.saved_at, text_digest, now, self.service)])
        fallback = self._fallbacks[text_digest] = _parse_cached(
            last.text, f"{last.source} (last good, saved {last.saved_at})"
        )
        return fallback


def policy_loader(settings: Settings, last_good: LastGoodPolicy | None = None) -> Callable[[], FleetPolicy]:
    """A local file (CLI, demo) wins over the SSM parameter (deployed stack, cached by Powertools); the
    parameter's text goes through `last_good` when one is given."""
    path, name = settings.policy_file, settings.policy_parameter
    if path:
        return lambda: _parse_cached(Path(path).read_text(), path)
    if name:
        parse = last_good.parse if last_good is not None else _parse_cached

        def from_ssm() -> FleetPolicy:
            text = parameters.get_parameter(name, max_age=defaults.POLICY_CACHE_S)
            return parse(str(text), f"ssm:{name}")

        return from_ssm

    def missing() -> FleetPolicy:
        raise PolicyError(
            [f"no fleet policy: set {defaults.ENV_POLICY_PARAMETER} (SSM parameter) or {defaults.ENV_POLICY_FILE}"]
        )

    return missing
