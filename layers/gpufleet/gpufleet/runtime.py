"""Composition root: the one place that reads the environment (into `Settings`) and builds each
function's parts from boto3 clients, the policy loader and Powertools."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities import parameters
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig, idempotent_function

from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.audit import AuditLog
from gpufleet.aws.busy_marks import BusyMarks
from gpufleet.aws.clients import AwsClients, Session, client, new_session, region_of
from gpufleet.aws.documents import DocStore
from gpufleet.aws.fleet import FleetActuator, FleetReader, builtin_groups
from gpufleet.aws.groups.provider import GroupShapes
from gpufleet.aws.hyperpod import HyperPodFleet, LazyClient
from gpufleet.aws.marks import LazyMarker, NodeMarker
from gpufleet.aws.metrics import GpuMetricsReader, ec2_gpus
from gpufleet.aws.policy_store import PolicyStore
from gpufleet.aws.queue import NotificationQueue, enqueue_or_log
from gpufleet.aws.slurm_marks import SlurmMarker
from gpufleet.aws.state import StateStore
from gpufleet.domain import defaults
from gpufleet.domain.models import MarkChannel, QueuedSource
from gpufleet.events.origin import Origin
from gpufleet.kubernetes.pods import ClusterPods, NodeListing
from gpufleet.policy_loading import LastGoodPolicy, policy_loader
from gpufleet.scaling.demand_source import DemandReader
from gpufleet.scaling.execution import ControlContext, Executor
from gpufleet.scaling.last_look import LastLook, PodsLook
from gpufleet.scaling.service import Process, Scaler
from gpufleet.settings import KubeEndpoint, Settings

if TYPE_CHECKING:
    from gpufleet.capacity.service import SpotWatch
    from gpufleet.guard.service import OomGuard
    from gpufleet.kubernetes.cluster import PodReader
    from gpufleet.notify.service import Notifier
    from gpufleet.notify.slack import SlackPoster
    from gpufleet.scaling.answer import TerminationPolicy


def idempotency_for(
    function_name: str, table: str, dynamodb: Any
) -> tuple[IdempotencyConfig, Callable[[Process], Process]]:
    # An alarm's state change is one key however it was delivered (EventBridge and SNS both): it acts once.
    config = IdempotencyConfig(
        event_key_jmespath="change_id || event_id", expires_after_seconds=defaults.IDEMPOTENCY_TTL_S
    )
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


def _kube_marker(settings: Settings, clients: AwsClients, region: str) -> NodeMarker:
    """Cordons through each cluster's API, reached as the pod reader reaches it."""
    from gpufleet.kubernetes.cluster import ClusterAccess
    from gpufleet.kubernetes.marks import KubernetesMarker

    return KubernetesMarker(ClusterAccess(clients.eks, new_session(region_name=region), settings.kube_endpoints))


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
    ec2: Callable[[], Any] = lambda: None,
) -> ControlContext:
    """`keeps_policy`: the last good fleet policy is kept and fallen back on (not by the termination
    policy, whose 2 s and narrow role leave no room for it: an invalid policy fails it, and Auto Scaling
    asks again)."""
    state = StateStore(clients.dynamodb, table)
    tell = lambda notes: enqueue_or_log(queue, notes, logger, emf)  # noqa: E731
    last_good = LastGoodPolicy(PolicyStore(clients.dynamodb, table), logger, logger.service, True, tell)
    # HyperPod instance groups named by rules: the SageMaker client is made only when one is read.
    slurm = SlurmMarker(clients.dynamodb, table)  # consolidation by attrition: drains the controller applies
    hyperpod = HyperPodFleet(
        LazyClient(lambda: client("sagemaker", new_session(region_name=region))), clients.cloudwatch, marker=slurm
    )
    cordon = LazyMarker(lambda: _kube_marker(settings, clients, region))
    markers: dict[MarkChannel, NodeMarker] = {MarkChannel.KUBERNETES: cordon, MarkChannel.SLURM: slurm}
    busy = BusyMarks(clients.dynamodb, clients.autoscaling, logger=logger)  # queue workers' marks (domain.busy)
    groups = builtin_groups(clients.autoscaling, clients.eks, hyperpod, logger, ec2, busy)
    actuator = FleetActuator(groups, markers, clients.autoscaling, clients.eks)
    wait = defaults.BATCH_WAIT_MAX_S if keeps_policy else defaults.TERMINATION_BATCH_WAIT_MAX_S
    return ControlContext(
        fleet=FleetReader(groups, clients.autoscaling, clients.eks),
        state=state,
        docs=DocStore(clients.dynamodb, table),
        executor=Executor(
            actuator, state, AuditLog(clients.dynamodb, table, wait), logger, emf, queue, region, LastLook(groups)
        ),
        load_policy=policy_loader(settings, last_good if keeps_policy else None),
        logger=logger,
        emf=emf,
        region=region,
        home=Origin(account=settings.account_id, region=region),
        global_dry_run=settings.dry_run,
        busy_marks=busy,
    )


def build_scaler(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: Session | None = None
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
    ec2 = client("ec2", session)  # one for node shapes, the demand reader and the forged-series check's GPU counts
    ctx = _control_context(settings, clients, table, queue, logger, emf, region_of(session), ec2=lambda: ec2)
    config, wrap = idempotency_for("scaler", table, clients.dynamodb)
    demand = demand_reader(settings, clients, logger, session, ec2, ctx.fleet.groups)
    # The last look before a removal reads a victim's pods through the demand path's cluster access.
    ctx.executor.last_look = LastLook(ctx.fleet.groups, PodsLook(demand.cluster_pods, demand.instances_of))
    scaler = Scaler(
        ctx,
        GpuMetricsReader(clients.cloudwatch, gpus_per_type=ec2_gpus(ec2)),
        AlarmReader(clients.cloudwatch),
        idempotent=wrap,
        demand=demand,
        busy=ctx.busy_marks,
    )
    return scaler, config


class ClusterPodsReader:
    """Each EKS cluster's pods through its API (DescribeCluster, or the local override in
    GPUFLEET_KUBE_ENDPOINTS): one pod reader per GPU resource table (its STS client kept), every cluster
    of one tick in the time the tick gives them all (`start_tick`)."""

    def __init__(self, eks: Any, session: Session, overrides: Mapping[str, KubeEndpoint]) -> None:
        from gpufleet.kubernetes.cluster import TickBudget

        self.eks, self.session, self.overrides = eks, session, overrides
        self.budget = TickBudget()
        self._readers: dict[frozenset[tuple[str, float]], PodReader] = {}

    def start_tick(self) -> None:
        self.budget.start()

    def read(
        self,
        cluster: str,
        resources: Mapping[str, float],
        nodes: NodeListing,
        queued: Collection[QueuedSource],
        now: datetime,
    ) -> ClusterPods:
        from gpufleet.kubernetes.cluster import PodReader

        key = frozenset(resources.items())
        reader = self._readers.setdefault(key, PodReader(self.eks, self.session, self.overrides, resources))
        return reader.read(cluster, self.budget.for_cluster(cluster), nodes=nodes, queued=queued, now=now)


def demand_reader(
    settings: Settings, clients: AwsClients, logger: Logger, session: Session | None, ec2: Any, groups: GroupShapes
) -> DemandReader:
    """The groups' demand sources: pods from each EKS cluster's API for its managed node groups and
    self-managed ASGs, queues, backlog metrics. Clients are made here; nothing is read until a group's
    policy names a source. `groups`: what each group's kind says of its nodes (the fleet's registry)."""
    from gpufleet.aws.eks_nodes import fewest_gpus, instances_by_node_name
    from gpufleet.aws.readiness import node_readiness

    pods = ClusterPodsReader(clients.eks, session or new_session(), settings.kube_endpoints)
    return DemandReader(
        sqs=client("sqs", session),
        cloudwatch=clients.cloudwatch,
        cluster_pods=pods,
        groups=groups,
        type_gpus=lambda types: fewest_gpus(ec2, types),
        instances_of=lambda names: instances_by_node_name(ec2, names),
        logger=logger,
        readiness=lambda ids, now, young: node_readiness(ec2, GpuMetricsReader(clients.cloudwatch), ids, now, young),
        tick_started=pods.start_tick,
    )


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
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: Session | None = None
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
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: Session | None = None
) -> OomGuard:
    """The OOM guard shares the scaler's clients, state and decision path (for memory-pressure scale-outs)."""
    from gpufleet.guard.service import OomGuard

    scaler, _ = build_scaler(logger, emf, env, session)
    return OomGuard(scaler.ctx, scaler, scaler.ctx.executor.actuator, scaler.metrics)


def build_spot_watch(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: Session | None = None
) -> SpotWatch:
    """spot_watch shares the scaler's clients, state and execution path (for the fallback group)."""
    from gpufleet.aws.activities import LaunchActivityReader
    from gpufleet.capacity.service import SpotWatch

    scaler, _ = build_scaler(logger, emf, env, session)
    autoscaling = scaler.ctx.fleet.autoscaling
    assert autoscaling is not None  # the control context's fleet reader always has it
    return SpotWatch(
        scaler.ctx, scaler, LaunchActivityReader(autoscaling, client("eks", session), client("ec2", session))
    )


def build_termination_policy(
    logger: Logger, emf: Metrics, env: Mapping[str, str] | None = None, session: Session | None = None
) -> TerminationPolicy:
    """The custom termination policy: the scaler's reading and audit path on quick clients (2 s budget);
    it tells nobody (Auto Scaling terminates, and its activity says so)."""
    from gpufleet.aws.clients import QUICK_CONFIG
    from gpufleet.scaling.answer import TerminationPolicy

    settings = _settings(env)
    table = settings.require(settings.state_table, defaults.ENV_STATE_TABLE, "answers are audited in the state table")
    clients = AwsClients.create(session, QUICK_CONFIG)
    ctx = _control_context(settings, clients, table, None, logger, emf, region_of(session), keeps_policy=False)
    return TerminationPolicy(ctx, GpuMetricsReader(clients.cloudwatch))
