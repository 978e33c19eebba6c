"""Composition root: the one place that reads the environment and builds the scaler's parts."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities import parameters
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

from gpufleet import defaults
from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.clients import AwsClients, client
from gpufleet.aws.fleet import FleetActuator, FleetReader
from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.aws.outbox import NotificationQueue
from gpufleet.aws.state import StateStore
from gpufleet.fleet_policy import FleetPolicy, PolicyError, parse_policy
from gpufleet.scaler import Scaler

if TYPE_CHECKING:
    from gpufleet.guard import OomGuard
    from gpufleet.notifier import Notifier
    from gpufleet.slack import SlackPoster
    from gpufleet.spot_watch import SpotWatch


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@lru_cache(maxsize=8)
def _parse_cached(text: str, source: str) -> FleetPolicy:
    return parse_policy(text, source)


def policy_loader(env: Mapping[str, str]) -> Callable[[], FleetPolicy]:
    """A local file (CLI, demo) wins over the SSM parameter (deployed stack, cached by Powertools)."""
    path = env.get(defaults.ENV_POLICY_FILE)
    name = env.get(defaults.ENV_POLICY_PARAMETER)
    if path:
        return lambda: _parse_cached(Path(path).read_text(), path)
    if name:

        def from_ssm() -> FleetPolicy:
            text = parameters.get_parameter(name, max_age=defaults.POLICY_CACHE_S)
            return _parse_cached(str(text), f"ssm:{name}")

        return from_ssm

    def missing() -> FleetPolicy:
        raise PolicyError(
            [f"no fleet policy: set {defaults.ENV_POLICY_PARAMETER} (SSM parameter) or {defaults.ENV_POLICY_FILE}"]
        )

    return missing


def idempotency_for(
    function_name: str, table: str, client: Any
) -> tuple[IdempotencyConfig, Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]]:
    config = IdempotencyConfig(event_key_jmespath="event_id", expires_after_seconds=defaults.IDEMPOTENCY_TTL_S)
    store = DynamoDBPersistenceLayer(
        table_name=table,
        key_attr="pk",
        sort_key_attr="sk",
        static_pk_value=f"IDEMPOTENCY#{function_name}",
        boto3_client=client,
    )

    def wrap(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        return idempotent_function(  # type: ignore[no-any-return]
            data_keyword_argument="trigger", persistence_store=store, config=config
        )(fn)

    return config, wrap


def build_scaler(
    logger: Logger,
    emf: Metrics,
    env: Mapping[str, str] | None = None,
    session: boto3.session.Session | None = None,
) -> tuple[Scaler, IdempotencyConfig]:
    env = os.environ if env is None else env
    table = _required(env, defaults.ENV_STATE_TABLE, "the scaler needs its state table")
    clients = AwsClients.create(session)
    queue_url = env.get(defaults.ENV_NOTIFY_QUEUE_URL)
    config, wrap = idempotency_for("scaler", table, clients.dynamodb)
    scaler = Scaler(
        fleet=FleetReader(clients.autoscaling, clients.eks),
        actuator=FleetActuator(clients.autoscaling, clients.eks),
        metrics=GpuMetricsReader(clients.cloudwatch),
        alarms=AlarmReader(clients.cloudwatch),
        state=StateStore(clients.dynamodb, table),
        load_policy=policy_loader(env),
        logger=logger,
        emf=emf,
        global_dry_run=_truthy(env.get(defaults.ENV_DRY_RUN)),
        idempotent=wrap,
        outbox=NotificationQueue(client("sqs", session), queue_url) if queue_url else None,
        region=_region(session),
    )
    return scaler, config


def _required(env: Mapping[str, str], name: str, why: str) -> str:
    value = env.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: {why}")
    return value


def _region(session: boto3.session.Session | None) -> str:
    return (session or boto3.session.Session()).region_name or "us-east-1"


def slack_loader(env: Mapping[str, str]) -> Callable[[], SlackPoster | None]:
    """The Slack secret is read through Powertools Parameters (cached); its value stays in memory only."""
    from gpufleet.slack import SlackConfig, SlackPoster

    arn = env.get(defaults.ENV_SLACK_SECRET)
    api_url = env.get(defaults.ENV_SLACK_API_URL)
    timeout_s = int(env.get(defaults.ENV_SLACK_TIMEOUT_S) or defaults.SLACK_TIMEOUT_S)
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
    logger: Logger,
    emf: Metrics,
    env: Mapping[str, str] | None = None,
    session: boto3.session.Session | None = None,
) -> Notifier:
    # Imported here so the scaler's cold start does not pay for slack-sdk and the notifier's modules.
    from gpufleet.aws.incidents import IncidentStore
    from gpufleet.aws.outbox import SnsPublisher
    from gpufleet.notifier import Notifier

    env = os.environ if env is None else env
    table = _required(env, defaults.ENV_STATE_TABLE, "the notifier keeps incidents in the state table")
    queue_url = _required(env, defaults.ENV_NOTIFY_QUEUE_URL, "the notifier schedules its own flushes")
    topic = env.get(defaults.ENV_NOTIFY_TOPIC_ARN)
    sqs = client("sqs", session)
    return Notifier(
        store=IncidentStore(client("dynamodb", session), table),
        queue=NotificationQueue(sqs, queue_url, env.get(defaults.ENV_NOTIFY_DLQ_URL)),
        sns=SnsPublisher(client("sns", session), topic) if topic else None,
        slack=slack_loader(env),
        load_policy=policy_loader(env),
        logger=logger,
        emf=emf,
    )


def build_guard(
    logger: Logger,
    emf: Metrics,
    env: Mapping[str, str] | None = None,
    session: boto3.session.Session | None = None,
) -> OomGuard:
    """The OOM guard shares the scaler's clients, state and decision path (for memory-pressure scale-outs)."""
    from gpufleet.guard import OomGuard

    scaler = _shared_scaler(logger, emf, env, session)
    guard = OomGuard.sharing(scaler, actuator=scaler.actuator, metrics=scaler.metrics)
    assert isinstance(guard, OomGuard)
    return guard


def build_spot_watch(
    logger: Logger,
    emf: Metrics,
    env: Mapping[str, str] | None = None,
    session: boto3.session.Session | None = None,
) -> SpotWatch:
    """spot_watch shares the scaler's clients, state and execution path (for the fallback group)."""
    from gpufleet.aws.activities import LaunchActivityReader
    from gpufleet.spot_watch import SpotWatch

    scaler = _shared_scaler(logger, emf, env, session)
    watch = SpotWatch.sharing(scaler, activities=LaunchActivityReader(scaler.fleet.autoscaling, scaler.fleet.eks))
    assert isinstance(watch, SpotWatch)
    return watch


def _shared_scaler(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None, session: boto3.session.Session | None
) -> Scaler:
    scaler, _ = build_scaler(logger, emf, os.environ if env is None else env, session)
    return scaler
