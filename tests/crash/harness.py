"""Crash-point testing: make the k-th AWS call of an action scenario fail, for every k, then deliver the
event again the way Lambda / SQS would and let the next scheduled runs happen; check the invariants.

moto never crashes a Lambda half-way; this harness does. Between attempts a scenario may change the world
(`World.between`: work lands on a node). Two faults per call index:
- "error": the call fails and has no effect (a 5xx after boto3's retries);
- "lost": the call takes effect, then its answer is lost (a read timeout after the write landed).
Both are raised where botocore's own retries cannot see them, so they reach gpufleet's code as they would
after the SDK gave up. Only calls made by gpufleet's functions are counted (tests/setup calls are not).
"""

from __future__ import annotations

import functools
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import boto3
from botocore.client import BaseClient
from botocore.exceptions import ClientError, ReadTimeoutError

from rehearsal import calls as recorded

MODES = ("error", "lost")
RETRIES = (timedelta(minutes=1), timedelta(minutes=3))  # Lambda's two async retries (SQS: redeliveries)
FUNCTION_TIMEOUT = timedelta(seconds=120)
RESET_TIMEOUT_S = 120  # moto's reset, waited for (a loaded CI machine took over 10 s)


class InjectedFault(Exception):
    """Marks what the harness raised, to tell it from a real bug in the logs."""


@dataclass
class FaultInjector:
    """Counts gpufleet's AWS calls; the `at`-th one (1-based) fails once in `mode` (None: count only)."""

    at: int | None = None
    mode: str = "error"
    count: int = 0
    fired: str | None = None
    _original: Callable[..., Any] | None = None

    def _call(self, client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        assert self._original is not None
        counted = not getattr(recorded._local, "off", False) and recorded.calling_function() is not None
        if counted:
            self.count += 1
            if self.count == self.at and self.fired is None:
                self.fired = f"{client.meta.service_model.service_name}:{operation}"
                if self.mode == "error":
                    raise ClientError({"Error": {"Code": "InternalFailure", "Message": "injected"}}, operation)
                self._original(client, operation, params)  # it takes effect; the answer is what is lost
                raise ReadTimeoutError(endpoint_url=f"injected-after-effect:{operation}")
        return self._original(client, operation, params)

    @contextmanager
    def installed(self) -> Iterator[FaultInjector]:
        self._original = BaseClient._make_api_call
        injector = self

        def call(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
            return injector._call(client, operation, params)

        BaseClient._make_api_call = call  # type: ignore[method-assign]
        try:
            yield self
        finally:
            BaseClient._make_api_call = self._original  # type: ignore[method-assign]


class World:
    """One scenario's fleet in moto and its function(s). `deliver` is one delivery of the event; `later`
    the scheduled runs that follow (they finish what a crash left), at `later_minutes` after it - past the
    lease (300 s) and the posting staleness (150 s); `violations` checks the invariants."""

    later_minutes: tuple[int, ...] = (6, 20)

    def deliver(self, now: datetime) -> None:
        raise NotImplementedError

    def later(self, now: datetime) -> None:
        raise NotImplementedError

    def violations(self) -> list[str]:
        raise NotImplementedError

    def between(self) -> None:
        """What happens in the world between two attempts (after a failed delivery, before the later runs):
        nothing by default; a scenario may land work on a node there."""


@dataclass
class Run:
    scenario: str
    at: int | None
    mode: str
    fired: str | None
    calls: int
    violations: list[str] = field(default_factory=list)


@functools.cache
def client(service: str) -> Any:
    """One test-side client per service for the whole sweep: a client takes ~15 ms to build and the sweep
    builds a world a thousand times. moto's state is reset under it; the client holds none."""
    return boto3.client(service)


def reset(endpoint: str) -> None:
    # A reset of every backend can take seconds on a loaded machine: a generous timeout, never a deadline.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=RESET_TIMEOUT_S)


def expire_in_progress_idempotency(dynamodb: Any, table: str) -> None:
    """[emulated] Powertools Idempotency lets a retry through once the first attempt's function timeout
    has passed (its in-progress expiry follows the real clock, which the harness does not advance): a
    retry more than the timeout later finds such a record expired, so it is removed here."""
    items = dynamodb.scan(TableName=table).get("Items", [])
    for item in items:
        if item["pk"]["S"].startswith("IDEMPOTENCY#") and item.get("status", {}).get("S") == "INPROGRESS":
            dynamodb.delete_item(TableName=table, Key={"pk": item["pk"], "sk": item["sk"]})


def run_once(name: str, build: Callable[[], World], now: datetime, at: int | None, mode: str, endpoint: str) -> Run:
    """Fresh moto state, the scenario built, the event delivered with retries, then the later runs."""
    reset(endpoint)
    world = build()
    with FaultInjector(at, mode).installed() as injector:
        for delay in (timedelta(0), *RETRIES):
            if delay > FUNCTION_TIMEOUT:
                with recorded.unrecorded():
                    expire_in_progress_idempotency(client("dynamodb"), "gpufleet-state")
            try:
                world.deliver(now + delay)
                break
            except Exception:  # the invocation failed: Lambda / SQS delivers the same event again
                with recorded.unrecorded():
                    world.between()
                continue
        with recorded.unrecorded():
            world.between()
        for minutes in world.later_minutes:
            try:
                world.later(now + timedelta(minutes=minutes))
            except Exception:
                continue
    return Run(name, at, mode, injector.fired, injector.count, world.violations())


def sweep(name: str, build: Callable[[], World], now: datetime, endpoint: str) -> list[Run]:
    """Every call index of a fault-free run, in both fault modes."""
    clean = run_once(name, build, now, None, "error", endpoint)
    runs = [clean]
    for at in range(1, clean.calls + 1):
        for mode in MODES:
            runs.append(run_once(name, build, now, at, mode, endpoint))
    return runs
