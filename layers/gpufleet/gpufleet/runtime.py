"""Composition root: the one place that reads the environment (into `Settings`) and builds each
function's parts from boto3 clients, the policy loader and Powertools."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities import parameters
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig, idempotent_function

from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.audit import AuditLog
from gpufleet.aws.clients import AwsClients, client
from gpufleet.aws.documents import DocStore
from gpufleet.aws.fleet import FleetActuator, FleetReader
from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.aws.policy_store import PolicyStore, digest
from gpufleet.aws.queue import NotificationQueue, enqueue_or_log
from gpufleet.aws.state import StateStore
from gpufleet.domain import defaults
from gpufleet.domain.errors import PolicyError
from gpufleet.domain.policy import FleetPolicy, parse_policy
from gpufleet.notify.model import Notification
from gpufleet.scaling.execution import ControlContext, Executor
from gpufleet.scaling.notes import invalid_policy_note
from gpufleet.scaling.service import Process, Scaler
from gpufleet.settings import Settings

if TYPE_CHECKING:
    from gpufleet.capacity.service import SpotWatch
    from gpufleet.doctor.service import AccountReader
    from gpufleet.guard.service import OomGuard
    from gpufleet.notify.service import Notifier
    from gpufleet.notify.slack import SlackPoster
    from gpufleet.scaling.answer import TerminationPolicy


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


def idempotency_for(
    function_name: str, table: str, dynamodb: Any
) -> tuple[IdempotencyConfig, Callable[[Process], Process]]:
    config = IdempotencyConfig(event_key_jmespath="event_id", expires_after_seconds=defaults.IDEMPOTENCY_TTL_S)
    store = DynamoDBPersistenceLayer(
        table_name=table,
        key_attr="pk",
        sort_key_attr="sk",
        static_pk_value=f"IDEMPOTENCY#{function_name}",
        boto3_client=dynamodb,
    )

    def wrap(fn: Process) -> Process:
        return idempotent_function(data_keyword_argument="trigger", persistence_store=store, config=config)(fn)  # type: ignore[no-any-return]

    return config, wrap


def _region(session: boto3.session.Session | None) -> str:
    return (session or boto3.session.Session()).region_name or "us-east-1"


def _settings(env: Mapping[str, str] | None) -> Settings:
    return Settings.from_env(os.environ if env is None else env)


def _control_context(
    settings: Settings,
    clients: AwsClients,
    table: str,
    queue: NotificationQueue | None,
    logger: Logger,
    emf: Metrics,
    region: str,
    keeps_policy: bool = True,
) -> ControlContext:
    """`keeps_policy`: the last good fleet policy is kept and fallen back on (not by the termination
    policy, whose 2 s and narrow role leave no room for it: an invalid policy fails it, and Auto Scaling
    asks again)."""
    state = StateStore(clients.dynamodb, table)
    last_good = (
        LastGoodPolicy(
            PolicyStore(clients.dynamodb, table),
            logger,
            logger.service,
            writes=True,
            tell=lambda notes: enqueue_or_log(queue, notes, logger, emf),
        )
        if keeps_policy
        else None
    )
    actuator = FleetActuator(clients.autoscaling, clients.eks)
    return ControlContext(
        fleet=FleetReader(clients.autoscaling, clients.eks),
        state=state,
        docs=DocStore(clients.dynamodb, table),
        executor=Executor(actuator, state, AuditLog(clients.dynamodb, table), logger, emf, queue, region),
        load_policy=policy_loader(settings, last_good),
        logger=logger,
        emf=emf,
        region=region,
        global_dry_run=settings.dry_run,
    )


def build_scaler(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: boto3.session.Session | None = None
) -> tuple[Scaler, IdempotencyConfig]:
    settings = _settings(env)
    table = settings.require(settings.state_table, defaults.ENV_STATE_TABLE, "the scaler needs its state table")
    clients = AwsClients.create(session)
    queue_url = settings.notify_queue_url
    queue = NotificationQueue(client("sqs", session), queue_url) if queue_url else None
    if queue is None:  # once per cold start: decisions are still audited, but nobody hears of them
        logger.warning(
            f"notifications have nowhere to go: {defaults.ENV_NOTIFY_QUEUE_URL} is not set; "
            "decisions are audited (gpufleet explain) but nobody is told"
        )
    ctx = _control_context(settings, clients, table, queue, logger, emf, _region(session))
    config, wrap = idempotency_for("scaler", table, clients.dynamodb)
    scaler = Scaler(ctx, GpuMetricsReader(clients.cloudwatch), AlarmReader(clients.cloudwatch), idempotent=wrap)
    return scaler, config


def slack_loader(settings: Settings) -> Callable[[], SlackPoster | None]:
    """The Slack secret is read through Powertools Parameters (cached); its value stays in memory only."""
    from gpufleet.notify.slack import SlackConfig, SlackPoster

    arn, api_url, timeout_s = settings.slack_secret_arn, settings.slack_api_url, settings.slack_timeout_s
    built: dict[str, SlackPoster] = {}

    def load() -> SlackPoster | None:
        if not arn:
            return None
        value = str(parameters.get_secret(arn, max_age=defaults.SECRET_CACHE_S))
        if value not in built:  # a rotated secret builds a new client
            built.clear()
            built[value] = SlackPoster(SlackConfig.from_secret(value), api_url=api_url, timeout_s=timeout_s)
        return built[value]

    return load


def build_notifier(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: boto3.session.Session | None = None
) -> Notifier:
    # Imported here so the scaler's cold start does not pay for slack-sdk and the notifier's modules.
    from gpufleet.aws.incidents import IncidentStore
    from gpufleet.aws.queue import SnsPublisher
    from gpufleet.notify.service import Notifier

    settings = _settings(env)
    table = settings.require(
        settings.state_table, defaults.ENV_STATE_TABLE, "the notifier keeps incidents in the state table"
    )
    queue_url = settings.require(
        settings.notify_queue_url, defaults.ENV_NOTIFY_QUEUE_URL, "the notifier schedules its own flushes"
    )
    topic = settings.notify_topic_arn
    return Notifier(
        store=IncidentStore(client("dynamodb", session), table),
        queue=NotificationQueue(client("sqs", session), queue_url, settings.notify_dlq_url),
        sns=SnsPublisher(client("sns", session), topic) if topic else None,
        slack=slack_loader(settings),
        load_policy=policy_loader(
            settings, LastGoodPolicy(PolicyStore(client("dynamodb", session), table), logger, "notifier", writes=False)
        ),
        logger=logger,
        emf=emf,
    )


def build_guard(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: boto3.session.Session | None = None
) -> OomGuard:
    """The OOM guard shares the scaler's clients, state and decision path (for memory-pressure scale-outs)."""
    from gpufleet.guard.service import OomGuard

    scaler, _ = build_scaler(logger, emf, env, session)
    return OomGuard(scaler.ctx, scaler, scaler.ctx.executor.actuator, scaler.metrics)


def build_spot_watch(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: boto3.session.Session | None = None
) -> SpotWatch:
    """spot_watch shares the scaler's clients, state and execution path (for the fallback group)."""
    from gpufleet.aws.activities import LaunchActivityReader
    from gpufleet.capacity.service import SpotWatch

    scaler, _ = build_scaler(logger, emf, env, session)
    fleet = scaler.ctx.fleet
    return SpotWatch(scaler.ctx, scaler, LaunchActivityReader(fleet.autoscaling, fleet.eks, client("ec2", session)))


def build_termination_policy(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: boto3.session.Session | None = None
) -> TerminationPolicy:
    """The custom termination policy: the scaler's reading and audit path on quick clients (2 s budget);
    it tells nobody (Auto Scaling terminates, and its activity says so)."""
    from gpufleet.aws.clients import QUICK_CONFIG
    from gpufleet.scaling.answer import TerminationPolicy

    settings = _settings(env)
    table = settings.require(settings.state_table, defaults.ENV_STATE_TABLE, "answers are audited in the state table")
    clients = AwsClients.create(session, QUICK_CONFIG)
    ctx = _control_context(settings, clients, table, None, logger, emf, _region(session), keeps_policy=False)
    return TerminationPolicy(ctx, GpuMetricsReader(clients.cloudwatch))


def build_account_reader(session: boto3.session.Session | None = None) -> AccountReader:
    """`gpufleet doctor`'s read-only view of the account (the caller's credentials, not a function's role)."""
    from gpufleet.doctor.service import AccountReader

    clients = AwsClients.create(session)
    return AccountReader(
        FleetReader(clients.autoscaling, clients.eks),
        AlarmReader(clients.cloudwatch),
        client("secretsmanager", session),
        client("sns", session),
    )
