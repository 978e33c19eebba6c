"""What the OOM guard and spot_watch share with the scaler: its clients, state, decision path and
settings, and one way to tell on-call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aws_lambda_powertools import Logger, Metrics

from gpufleet.aws.fleet import FleetReader
from gpufleet.aws.outbox import NotificationQueue, enqueue_or_log
from gpufleet.aws.state import StateStore
from gpufleet.fleet_policy import FleetPolicy
from gpufleet.notifications import Notification
from gpufleet.scaler import Scaler


@dataclass(kw_only=True)
class Controller:
    fleet: FleetReader
    state: StateStore
    scaler: Scaler
    load_policy: Callable[[], FleetPolicy]
    logger: Logger
    emf: Metrics
    outbox: NotificationQueue | None = None
    region: str = "us-east-1"
    global_dry_run: bool = False

    @classmethod
    def sharing(cls, scaler: Scaler, **own: object) -> Controller:
        """A controller built from the scaler's parts plus its own (e.g. the guard's metrics reader)."""
        return cls(
            fleet=scaler.fleet,
            state=scaler.state,
            scaler=scaler,
            load_policy=scaler.load_policy,
            logger=scaler.logger,
            emf=scaler.emf,
            outbox=scaler.outbox,
            region=scaler.region,
            global_dry_run=scaler.global_dry_run,
            **own,
        )

    def _send(self, notes: list[Notification]) -> None:
        enqueue_or_log(self.outbox, notes, self.logger, self.emf)
