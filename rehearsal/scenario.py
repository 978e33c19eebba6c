"""The rehearsal: a GPU fleet on moto, a day's load in 100 simulated minutes, the real scaler and notifier.

Load ramps up, plateaus and drops to idle for a training ASG and an EKS inference node group.
Synthetic nodes run the real on-node publisher (gpufleet_node) on a simulated NVML backend, sending
GPU metrics to CloudWatch on the simulated clock; the alarm
evaluator [emulated CloudWatch] turns them into EventBridge alarm events; every minute a reconcile
tick runs. The scaler is the production code (gpufleet.runtime.build_scaler) with `now` injected.
Its notifications go through the real SQS queue (moto) to the notifier (gpufleet.runtime.build_notifier),
which posts in bot-token mode (chat.postMessage, one thread per incident) to a local Slack-compatible
receiver [emulated Slack] and publishes to the SNS topic. The SQS event source
is emulated: every simulated minute the harness drains the queue into the notifier and runs its sweep.
With a Kubernetes API for cluster ml [emulated] (`kube`), the demand scenes of rehearsal.demand_scene play
too: pods waiting in the cluster and a Slurm backlog size two more groups from 0 and back.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics

from gpufleet.aws.metrics import group_dimensions
from gpufleet.domain import defaults
from gpufleet.domain.errors import InvalidEvent
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet.runtime import build_guard, build_notifier, build_scaler, build_spot_watch, build_termination_policy
from gpufleet_node.busy import BusyMark
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import demand_scene, fleet, lifecycle
from rehearsal.alarms import AlarmEvaluator, eventbridge_event
from rehearsal.demand_scene import DemandScenes
from rehearsal.kube_api import KubeApi
from rehearsal.slack import Received, SlackReceiver, describe
from rehearsal.usage_scene import RESEARCH_LOAD, RESEARCH_NODE, UsageScene

START = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)  # a Monday
TABLE = "gpufleet-state"
SLACK_CHANNEL = "#gpu-oncall"
# Bot-token mode against the local receiver [emulated Slack]: the token is a placeholder it accepts.
SLACK_SECRET = json.dumps({"bot_token": "xoxb-demo-local-receiver-not-a-token", "channel": SLACK_CHANNEL})
TRAIN = GroupRef(kind=GroupKind.ASG, name="train-spot")
FALLBACK = GroupRef(kind=GroupKind.ASG, name="train-ondemand")  # on-demand, raised only when spot fails
SPOT_OUTAGE = range(15, 33)  # minutes during which EC2 has no g5.12xlarge spot capacity [emulated]
SPOT_FULL = (
    "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to your request "
    "configuration. Please adjust your request and try again. Launching EC2 instance failed."
)
INFER = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="infer-gpu")
# Two nodes in a Capacity Block (a fixed-size group; one busy, one idle), asked about by an instance refresh
# and warned about before the block ends. [emulated EC2: moto sends no Capacity Block events]
BLOCK = GroupRef(kind=GroupKind.ASG, name="train-block")
INTERRUPT_MINUTE = 78  # [emulated EC2] the long training job's spot node gets its 2-minute warning
RECLAIM_MINUTE = INTERRUPT_MINUTE + 2  # ... and is reclaimed; the job restarts on the node launched early
REFRESH_MINUTE = 84  # [emulated EC2 Auto Scaling] an instance refresh asks which train-block node may go
BLOCK_WARNING_MINUTE = 88  # [emulated EC2] the Capacity Block ends in 40 minutes
IDLE_UTIL, IDLE_MEM = 5.0, 10.0
GPUS_PER_NODE = 4  # g5.12xlarge
LEAK_GPU = 2  # on the long training job's node: a process leaks GPU memory from minute 30 to 61
XID_MINUTE = 45  # another training node's GPU 1 falls off the bus (XID 79)
# The OOM guard runs every 10 simulated minutes here (deployed: every minute) over a 10-minute window:
# moto's GetMetricData scans every stored datum once per query and period, which would otherwise
# dominate the demo's time.
GUARD_EVERY_MIN = 10


def leaking_memory_percent(minute: int) -> float:
    if minute < 30:
        return 60.0
    if minute <= 61:
        return 60.0 + 1.2 * (minute - 30)  # 96.0 % at minute 60: CRITICAL comes before 100 %
    return 20.0  # the leaking process ended; the job restarted it


SAMPLE_EVERY_S = 10  # the demo samples every 10 s of simulated time; the deployed publisher every 1 s
POLICY_NOTIFY_INTERVAL_S = defaults.NOTIFY_GROUP_INTERVAL_S

DEMAND_RULES = demand_scene.POLICY_RULES.rstrip("\n")  # left out without a Kubernetes API (Rehearsal's kube)
POLICY = f"""\
version: 1
alarm_prefix: gpufleet-
metric_lookback_s: 180
defaults:
  idle: {{gpu_utilization: {IDLE_UTIL:g}, memory_percent: {IDLE_MEM:g}}}
groups:
{DEMAND_RULES}
  - name: train-ondemand  # moved only by spot_watch (fallback) and bounds, not by the utilization band
    kind: asg
    target: {{enabled: false}}
  - name: train-block  # a Capacity Block's fixed size: told about, never resized
    kind: asg
    target: {{enabled: false}}
  - name: train-*
    kind: asg
    max: 6
    scale_out_step: 2
    scale_in_step: 1
    scale_out_cooldown_s: 180
    scale_in_cooldown_s: 240
    target: {{low: 30, high: 85}}
  - name: infer-gpu
    cluster: ml
    kind: eks-nodegroup
    max: 4
    scale_out_step: 50%
    scale_out_cooldown_s: 180
    scale_in_cooldown_s: 240
    target: {{low: 30, high: 85}}
    schedules:
      - name: morning-peak
        cron: "15 10 * * 1-5"
        timezone: Europe/Berlin
        duration_minutes: 20
        min: 2
        desired: 3
spot:
  groups:
    - group: asg:train-spot
      fallback: {{group: asg:train-ondemand, wait_minutes: 5}}
  prices:
    on_demand: {{g5.12xlarge: 5.672}}
    spot: {{g5.12xlarge: 2.10}}
  interruptions: {{on_interruption: prelaunch, on_rebalance: notify}}
guard:
  memory: {{window_minutes: 10}}
  health: {{replace_unhealthy: true, max_replacements_per_hour: 1, min_healthy_percent: 50, lookback_minutes: 10}}
"""


def _ramp(t: float, points: list[tuple[float, float]]) -> float:
    """Piecewise-linear demand curve through (minute, instance-equivalents) points."""
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1]


DEMAND: dict[str, list[tuple[float, float]]] = {
    TRAIN.key: [(0, 0.6), (10, 0.6), (40, 6.0), (62, 6.0), (66, 0.0), (100, 0.0)],
    INFER.key: [(0, 0.8), (15, 0.8), (38, 4.0), (58, 4.0), (62, 0.3), (100, 0.3)],
    BLOCK.key: [(0, 1.0), (100, 1.0)],  # one job on one of its two nodes all day
}


@dataclass
class Node:
    instance_id: str
    group: str
    first_seen: int
    util: float = 0.0
    mem: float = 0.0
    long_job: bool = False
    fallback: bool = False  # an on-demand node of train-ondemand: takes training work only spot cannot


@dataclass
class RehearsalResult:
    lines: list[str] = field(default_factory=list)
    capacity: dict[str, list[int]] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    slack: list[dict[str, Any]] = field(default_factory=list)
    thread: list[str] = field(default_factory=list)  # one incident's Slack thread, as the channel shows it
    report: str = ""  # `gpufleet report` over the nodes' usage records

    @property
    def ok(self) -> bool:
        return not self.failures


class Rehearsal:
    def __init__(
        self,
        out_dir: Path,
        slack: tuple[SlackReceiver, str],
        echo: Callable[[str], None] = print,
        minutes: int = 100,
        kube: tuple[KubeApi, str] | None = None,
    ) -> None:
        """`kube`: a Kubernetes API for cluster ml [emulated] (rehearsal.kube_api); without one the demand
        scenes (rehearsal.demand_scene) and their groups are left out."""
        self.out = out_dir
        self.receiver, self.slack_url = slack
        self.receiver.on_message = self._on_slack
        self.slack_numbers: dict[str, int] = {}  # a message's ts -> its [slack #N]
        self.minute = 0
        self.notifications_queued = 0
        self.echo = echo
        self.minutes = minutes
        self.result = RehearsalResult()
        self.nodes: dict[str, Node] = {}
        self.publishers: dict[str, Publisher] = {}
        self.xid_node: str | None = None
        self.doomed: str | None = None  # the spot node EC2 interrupts
        self.before_warning: set[str] = set()
        self.lifecycle: dict[str, Any] = {}  # what the capacity-lifecycle steps answered
        self.spot_delivered: set[str] = set()
        self.spot_event_sent = False
        self.pending_events: list[dict[str, Any]] = []  # EventBridge deliveries for spot_watch
        self.spot_failures: list[dict[str, Any]] = []
        self.fallback_moves: list[tuple[int, int, int]] = []
        self.guard_results: list[tuple[int, dict[str, Any]]] = []
        self.node_minutes = 0
        self.finished_nodes = 0
        self.put_metric_calls = 0
        self.rng = random.Random(7)
        self.clients = fleet.Clients.create()
        self.protected: str | None = None
        self.long_job: str | None = None
        self.job_node: str | None = None
        self.alarms = AlarmEvaluator(self.clients.cloudwatch, "gpufleet-")
        self.limits = {TRAIN.key: (1, 6), INFER.key: (1, 4)}
        self.backing_asg: dict[str, str] = {}
        self.clients_sqs = boto3.client("sqs")
        self.scenes = DemandScenes(self.clients, kube, self._instances, self.say, START) if kube else None
        self.usage = UsageScene(out_dir / "nodes", boto3.client("logs"), SAMPLE_EVERY_S)

    def say(self, minute: int, text: str) -> None:
        stamp = (START + timedelta(minutes=minute)).strftime("%H:%M")
        line = f"{stamp}  {text}"
        self.result.lines.append(line)
        self.echo(line)

    # ---- setup ----

    def setup(self) -> Any:
        c = self.clients
        fleet.create_state_table(c.dynamodb, TABLE)
        fleet.create_asg(c, TRAIN.name, min_size=1, max_size=8, desired=2, tags=fleet.MANAGED_TAG, market="spot")
        fleet.create_asg(c, FALLBACK.name, min_size=0, max_size=4, desired=0, tags=fleet.MANAGED_TAG)
        self.backing_asg[TRAIN.key] = TRAIN.name
        self.backing_asg[FALLBACK.key] = FALLBACK.name
        fleet.create_asg(
            c,
            BLOCK.name,
            min_size=2,
            max_size=2,
            desired=2,
            tags=fleet.MANAGED_TAG,
            market="capacity-block",
            reservation=lifecycle.BLOCK_RESERVATION,
        )
        self.backing_asg[BLOCK.key] = BLOCK.name
        block_end = START + timedelta(minutes=BLOCK_WARNING_MINUTE) + lifecycle.BLOCK_WARNING_BEFORE_END
        fleet.inject_capacity_reservation(os.environ[defaults.ENV_ENDPOINT_URL], lifecycle.BLOCK_RESERVATION, block_end)
        self.backing_asg[INFER.key] = fleet.create_nodegroup(
            c, "ml", INFER.name, min_size=1, max_size=6, desired=2, tags=fleet.MANAGED_TAG
        )
        if self.scenes:
            self.backing_asg.update(self.scenes.setup())
        instances = self._instances(TRAIN.key)
        self.long_job, self.protected = instances[0], instances[1]
        self.job_node = self.long_job  # where the long job runs (it moves once, when its node is reclaimed)
        # [emulated worker] a queue worker on it holds a job: `gpufleet-node busy`'s own mark (the scaler
        # turns it into scale-in protection on its first tick)
        BusyMark(c.dynamodb, f"AROATRAINROLEID:{self.protected}", self.protected, TRAIN.name).set(True)
        for ref in (TRAIN, INFER):
            dims = group_dimensions(ref)
            slug = ref.name.split("-")[0]
            fleet.put_gpu_alarm(
                c.cloudwatch, f"gpufleet-{slug}-gpu-high", dims, direction="out", threshold=85, evaluation_periods=2
            )
            fleet.put_gpu_alarm(
                c.cloudwatch, f"gpufleet-{slug}-gpu-low", dims, direction="in", threshold=20, evaluation_periods=4
            )
        policy_path = self.out / "policy.yaml"
        policy_path.write_text(POLICY if self.scenes else POLICY.replace(DEMAND_RULES + "\n", ""))
        os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"
        # the nodes' own log (an XID's kernel-log hint, say) goes to a file, not between the timeline's lines
        node_log = logging.getLogger("gpufleet.publisher")
        node_log.handlers[:] = [logging.FileHandler(self.out / "publisher.log", mode="w")]
        node_log.propagate = False
        self.emf = Metrics(namespace="GPUFleet/Controller", service="scaler")
        self.stack = fleet.create_notification_stack(slack_secret=SLACK_SECRET)
        env = {**self.stack.env(TABLE, str(policy_path)), **(self.scenes.env() if self.scenes else {})}
        env[defaults.ENV_SLACK_API_URL] = f"{self.slack_url}/api/"  # the Web API [emulated Slack], not slack.com
        scaler, idempotency = build_scaler(self._logger("scaler"), self.emf, env=env)
        self.notifier = build_notifier(self._logger("notifier"), Metrics(service="notifier"), env=env)
        self.guard = build_guard(self._logger("oom_guard"), Metrics(service="oom_guard"), env=env)
        self.spot_watch = build_spot_watch(self._logger("spot_watch"), Metrics(service="spot_watch"), env=env)
        self.termination_policy = build_termination_policy(
            self._logger("termination_policy"), Metrics(service="termination_policy"), env=env
        )
        idempotency.register_lambda_context(LocalLambdaContext("scaler", timeout_s=900))  # type: ignore[arg-type]
        self.say(
            0,
            f"fleet ready: {TRAIN.key} (2 x {fleet.INSTANCE_TYPE}, 1 long training job on "
            f"{self.long_job}, {self.protected} marked busy by its worker), {INFER.key} (2 nodes), "
            f"{BLOCK.key} (2 nodes in Capacity Block {lifecycle.BLOCK_RESERVATION})",
        )
        if self.scenes:
            self.say(
                0,
                f"demand: {demand_scene.TRAIN_GPU.key} (0 nodes, min 0: pods waiting in cluster ml, its Kubernetes API "
                f"[emulated] at {self.scenes.url}), {demand_scene.SLURM.key} (0 nodes, min 0: Slurm/PendingGPUs)",
            )
        self.say(0, f"policy: {policy_path}; alarms: gpufleet-{{train,infer}}-gpu-{{high,low}} (tagged with direction)")
        self.say(
            0,
            f"notifier: Slack bot-token mode, chat.postMessage to {SLACK_CHANNEL} at {self.slack_url}/api/ "
            "[emulated Slack]: an incident's first post opens its thread, later posts reply in it (thread_ts)",
        )
        return scaler

    def _logger(self, service: str) -> Logger:
        return Logger(service=service, logger_handler=logging.FileHandler(self.out / f"{service}.log", mode="w"))

    def _on_slack(self, message: Received) -> None:
        """A message the receiver [emulated Slack] got: shown as the channel shows it, a reply indented
        under a mark naming the post that opened its thread."""
        number = len(self.result.slack) + 1
        self.slack_numbers[message.ts] = number
        entry = {"minute": self.minute, "answered": message.answered, "ts": message.ts, **message.payload}
        self.result.slack.append(entry)
        (self.out / "slack").mkdir(exist_ok=True)
        (self.out / "slack" / f"{number:03d}.json").write_text(json.dumps(message.payload, indent=2))
        lines = describe(message.payload)
        thread = message.payload.get("thread_ts")
        if thread:
            opened = self.slack_numbers.get(thread, "?")
            self.say(self.minute, f"[slack #{number}]   ↳ thread reply to #{opened}: {lines[0]}")
            indent = " " * 15
        else:
            self.say(self.minute, f"[slack #{number}] {lines[0]}")
            indent = " " * 11
        for line in lines[1:]:
            self.say(self.minute, f"{indent}{line}")

    def notify(self, minute: int) -> None:
        """[emulated SQS event source] hand the queue to the notifier, then its per-minute sweep."""
        now = START + timedelta(minutes=minute, seconds=50)
        for message in fleet.drain(self.clients_sqs, self.stack.queue_url):
            self.notifications_queued += "flush" not in message["Body"]
            self.notifier.handle_message(message["Body"], now=now)
        self.notifier.sweep(now)

    def _instances(self, group_key: str) -> list[str]:
        asg = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self.backing_asg[group_key]])
        return [i["InstanceId"] for i in asg["AutoScalingGroups"][0]["Instances"] if i["LifecycleState"] == "InService"]

    def _desired(self, ref: GroupRef) -> int:
        if ref.kind is GroupKind.ASG:
            asg = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[ref.name])
            return int(asg["AutoScalingGroups"][0]["DesiredCapacity"])
        ng = self.clients.eks.describe_nodegroup(clusterName=ref.cluster, nodegroupName=ref.name)
        return int(ng["nodegroup"]["scalingConfig"]["desiredSize"])

    # ---- synthetic nodes ----

    def publish(self, minute: int) -> dict[str, float]:
        """Every InService node runs the real publisher (gpufleet_node) on a simulated NVML backend with
        this minute's GPU use; returns the group averages. [simulated GPUs: no NVML here]"""
        start = START + timedelta(minutes=minute)
        averages = {}
        for ref in (TRAIN, INFER, BLOCK):
            fallback = self._instances(FALLBACK.key) if ref is TRAIN else []
            alive = self._track(ref, self._instances(ref.key) + fallback, minute, fallback)
            demand = _ramp(minute, DEMAND[ref.key])
            ordered = sorted(
                (self.nodes[i] for i in alive),
                key=lambda n: (not n.long_job, n.fallback, n.first_seen, n.instance_id),
            )
            pool = [n for n in ordered if not n.long_job]
            for n in ordered:
                if n.long_job:
                    share = 1.0
                else:
                    k = pool.index(n)
                    share = min(max(demand - k, 0.0), 1.0)
                noise = self.rng.uniform(-2, 2) if share > 0 else 0.0
                n.util = min(100.0, max(0.0, 95 * share + noise))
                n.mem = 80.0 if share > 0.05 else 2.0  # a node with work has its model loaded
                publisher = self.publishers[n.instance_id]
                for gpu in range(GPUS_PER_NODE):
                    mem = leaking_memory_percent(minute) if n.long_job and gpu == LEAK_GPU else n.mem
                    publisher.backend.set(gpu, utilization=n.util, memory_percent=mem)
                ordinary = not n.long_job and n.instance_id != self.protected
                if minute == XID_MINUTE and ref is TRAIN and self.xid_node is None and ordinary:
                    self.xid_node = n.instance_id
                    publisher.backend.lost.add(1)
                    publisher.record_xid(1, 79)
                    self.say(minute, f"[simulated GPU] {n.instance_id} GPU 1: XID 79, fallen off the bus")
                self._sample(publisher, start)
            averages[ref.key] = sum(n.util for n in ordered) / len(ordered) if ordered else 0.0
        self._publish_scenes(minute)
        self._publish_research(minute)
        return averages

    def _publish_research(self, minute: int) -> None:
        """[simulated node] The research box outside every managed group (rehearsal.usage_scene): its pods'
        usage goes into the report; no alarm, decision or check of the scaling story sees it."""
        if RESEARCH_NODE not in self.publishers:
            identity = Identity(RESEARCH_NODE, "us-east-1", fleet.INSTANCE_TYPE)  # no group
            backend, sender = SimulatedBackend(gpus=GPUS_PER_NODE), Sender(self.clients.cloudwatch)
            usage = self.usage.tracker(RESEARCH_NODE, identity, backend, sender)
            self.publishers[RESEARCH_NODE] = Publisher(backend, identity, sender, detail="adaptive", usage=usage)
            self.publishers[RESEARCH_NODE].start(xid_thread=False)
        publisher = self.publishers[RESEARCH_NODE]
        for gpu, (util, memory) in enumerate(RESEARCH_LOAD):
            publisher.backend.set(gpu, utilization=util, memory_percent=memory)
        self._sample(publisher, START + timedelta(minutes=minute))

    def _publish_scenes(self, minute: int) -> None:
        """The demand scenes' nodes: each GPU busy while work runs on it, idle otherwise (rehearsal.demand_scene)."""
        if self.scenes is None:
            return
        for ref in self.scenes.groups:
            for iid in self._track(ref, self._instances(ref.key), minute):
                loads = self.scenes.gpu_load(iid)
                node, publisher = self.nodes[iid], self.publishers[iid]
                node.util, node.mem = sum(u for u, _ in loads) / len(loads), max(m for _, m in loads)
                for gpu, (util, mem) in enumerate(loads):
                    publisher.backend.set(gpu, utilization=util, memory_percent=mem)
                self._sample(publisher, START + timedelta(minutes=minute))

    def _track(self, ref: GroupRef, alive: list[str], minute: int, fallback: list[str] | None = None) -> list[str]:
        """A node and its publisher for each of the group's instances (`fallback`: train-ondemand's, counted
        with train-spot); those gone finish their publisher. Returns `alive`."""
        for iid in alive:
            if iid not in self.nodes:
                on_demand = iid in (fallback or [])
                self.nodes[iid] = Node(iid, ref.key, minute, long_job=iid == self.job_node, fallback=on_demand)
                self.publishers[iid] = self._publisher(iid, FALLBACK if on_demand else ref)
        for iid in list(self.nodes):
            if self.nodes[iid].group == ref.key and iid not in alive:
                del self.nodes[iid]
                self._stop_publisher(iid, minute)
        return alive

    def _sample(self, publisher: Publisher, start: datetime) -> None:
        """One simulated minute of the node's publisher: samples every SAMPLE_EVERY_S, its windows closed."""
        self.usage.load(publisher.identity.instance_id, publisher.backend)
        simulate(publisher, start, 60, every_s=SAMPLE_EVERY_S)
        self.node_minutes += 1
        publisher.close_windows(start + timedelta(seconds=59))

    def _publisher(self, instance_id: str, ref: GroupRef) -> Publisher:
        if ref.kind is GroupKind.ASG:
            identity = Identity(instance_id, "us-east-1", fleet.INSTANCE_TYPE, asg_name=ref.name)
        else:
            identity = Identity(
                instance_id, "us-east-1", fleet.INSTANCE_TYPE, cluster_name=ref.cluster, nodegroup_name=ref.name
            )
        # detail=adaptive and attribution on: the deployed defaults
        backend, sender = SimulatedBackend(gpus=GPUS_PER_NODE), Sender(self.clients.cloudwatch)
        usage = self.usage.tracker(instance_id, identity, backend, sender)
        # caller: the instance profile's aws:userid, as sts:GetCallerIdentity gives it on the node (its GPU
        # faults go into its own namespace too, which the guard needs before it replaces it)
        caller = f"AROAREHEARSAL:{instance_id}"
        publisher = Publisher(backend, identity, sender, detail="adaptive", usage=usage, caller=caller)
        publisher.start(xid_thread=False)
        return publisher

    # ---- the run ----

    def invoke(self, scaler: Any, event: dict[str, Any], minute: int, show_holds: bool = False) -> list[dict[str, Any]]:
        now = START + timedelta(minutes=minute, seconds=30)
        out = scaler.handle(event, now=now)
        self.emf.clear_metrics()  # Lambda flushes EMF per invocation; here nothing reads them
        decisions = [d for r in out["results"] for d in r["decisions"]]
        for d in decisions:
            self.result.decisions.append(d)
            if show_holds or d["outcome"] in ("applied", "dry-run", "skipped-lease", "failed"):
                self.say(minute, f"  {d['group']:<18} {d['action']:<10} {d['outcome']:<8} {d['reason']}")
            if d["outcome"] == "applied" and d["action"] == "scale-in":
                self._check_victims(minute, d)
        return decisions

    def emulate_spot_market(self, minute: int) -> None:
        """[emulated EC2 spot market] during the outage, instances train-spot asks for are not delivered
        (held out of service) and each minute's attempt is a failed launch activity; afterwards they arrive."""
        asg = self.clients.autoscaling
        if minute == SPOT_OUTAGE.start:
            self.spot_delivered = set(self._instances(TRAIN.key))
            self.say(
                minute, "[emulated EC2] g5.12xlarge spot capacity exhausted in us-east-1: train-spot cannot launch"
            )
        if minute in SPOT_OUTAGE:
            group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[TRAIN.name])["AutoScalingGroups"][0]
            new = [
                i["InstanceId"]
                for i in group["Instances"]
                if i["LifecycleState"] == "InService" and i["InstanceId"] not in self.spot_delivered
            ]
            fleet.hold_out_of_service(asg, TRAIN.name, new)
            held = sum(1 for i in group["Instances"] if i["LifecycleState"] == "Pending") + len(new)
            if held:
                at = START + timedelta(minutes=minute, seconds=5)
                activity = fleet.inject_failed_launch(
                    os.environ[defaults.ENV_ENDPOINT_URL],
                    TRAIN.name,
                    at,
                    SPOT_FULL,
                    az=("us-east-1a", "us-east-1b")[minute % 2],
                )
                if not self.spot_event_sent:  # EventBridge delivers this one too; the sweep sees it as well
                    self.spot_event_sent = True
                    self.pending_events.append(self._launch_event(activity, at))
        if minute == SPOT_OUTAGE.stop:
            arrived = fleet.deliver_held(asg, TRAIN.name)
            self.say(minute, f"[emulated EC2] spot capacity is back: {len(arrived)} held train-spot instance(s) launch")

    def _launch_event(self, activity: str, at: datetime) -> dict[str, Any]:
        detail = {
            "StatusCode": "Failed",
            "AutoScalingGroupName": TRAIN.name,
            "ActivityId": activity,
            "StatusMessage": SPOT_FULL,
            "StartTime": at.isoformat(),
            "Details": {"Availability Zone": "us-east-1a"},
        }
        return eventbridge_event(
            "aws.autoscaling", "EC2 Instance Launch Unsuccessful", at, detail, [], f"launch-{activity[:8]}"
        )

    def run_spot_watch(self, minute: int) -> None:
        now = START + timedelta(minutes=minute, seconds=45)
        results = []
        while self.pending_events:
            results += self.spot_watch.handle(self.pending_events.pop(0), now)["results"]
        results += self.spot_watch.handle(
            {
                "gpufleet": "reconcile",
                "execution_id": f"spot-{minute}",
                "scheduled_time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            now,
        )["results"]
        self.emf.clear_metrics()
        self._tell_lifecycle(minute, results)
        launches = [r for r in results if "reservation" not in r]  # a Capacity Block's "groups" are its nodes
        for group in (g for r in launches for g in r.get("groups", [])):
            for f in group["new_failures"]:
                self.spot_failures.append(f)
                self.say(minute, f"  spot_watch: {group['group']} launch failed: {f['class']} {f['offering']}")
            action = group.get("fallback_action")
            if action and action["outcome"] in ("applied", "dry-run"):
                self.fallback_moves.append((minute, action["current"], action["desired"]))
                self.say(
                    minute,
                    f"  spot_watch: {action['group']} {action['current']} -> {action['desired']}: {action['reason']}",
                )

    # ---- capacity going away [emulated EC2 / EC2 Auto Scaling] ----

    def emulate_capacity_events(self, minute: int) -> None:
        """[emulated EC2] what moto never sends: the long job's spot node gets its 2-minute interruption
        warning, then is reclaimed (Auto Scaling replaces it; the job restarts on the node gpufleet launched
        early); the Capacity Block's expiration warning. Delivered to spot_watch with the minute's sweep."""
        at = START + timedelta(minutes=minute, seconds=20)
        if minute == INTERRUPT_MINUTE and self.job_node:
            self.doomed = self.job_node
            self.before_warning = set(self._instances(TRAIN.key))
            self.say(minute, f"[emulated EC2] spot interruption warning: {self.doomed} (the long job) goes in 2 min")
            self.pending_events.append(lifecycle.spot_interruption_warning(self.doomed, at))
        if minute == RECLAIM_MINUTE and self.doomed:
            early = sorted(set(self._instances(TRAIN.key)) - self.before_warning)
            self.clients.autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=self.doomed, ShouldDecrementDesiredCapacity=False
            )
            if early:
                self.job_node = early[0]
                self.nodes[self.job_node].long_job = True
            self.say(
                minute,
                f"[emulated EC2] reclaimed {self.doomed}; Auto Scaling replaces it; the long job restarts on "
                f"{self.job_node}, launched before the node went",
            )
        if minute == BLOCK_WARNING_MINUTE:
            self.say(minute, f"[emulated EC2] Capacity Block {lifecycle.BLOCK_RESERVATION} expiration warning")
            self.pending_events.append(lifecycle.capacity_block_expiration_warning(at))

    def ask_termination_policy(self, minute: int) -> None:
        """[emulated EC2 Auto Scaling] an instance refresh of train-block asks the custom termination
        policy which of its two nodes may go now."""
        nodes = sorted(self._instances(BLOCK.key))
        request = lifecycle.termination_request(BLOCK.name, nodes, fleet.INSTANCE_TYPE, 1, "INSTANCE_REFRESH")
        allowed = self.termination_policy.handle(request, START + timedelta(minutes=minute, seconds=35))["InstanceIDs"]
        self.emf.clear_metrics()
        self.lifecycle["refresh"] = (nodes, allowed)
        self.say(
            minute,
            f"[emulated EC2 Auto Scaling] instance refresh of {BLOCK.name} asks to terminate 1 of {len(nodes)}: "
            f"gpufleet allows {allowed or 'none'}",
        )

    def _tell_lifecycle(self, minute: int, results: list[dict[str, Any]]) -> None:
        for r in results:
            if "replacement" in r:
                self.lifecycle["warned"] = r
                replacement = r["replacement"]
                what = replacement["reason"] if isinstance(replacement, dict) else replacement
                self.say(minute, f"  spot_watch: {r['instance']} ({r['group']}): {what}")
            if "reservation" in r:
                self.lifecycle["block"] = r
                nodes = sum(len(n) for n in r["groups"].values())
                self.say(minute, f"  spot_watch: {r['reservation']} ends: {nodes} node(s) in {', '.join(r['groups'])}")
            for found in r.get("reservations_ending", []):
                self.lifecycle["block_sweep"] = {"minute": minute, **found}
                nodes = sum(len(n) for n in found["groups"].values())
                self.say(
                    minute,
                    f"  spot_watch sweep: {found['reservation']} ends within the hour (DescribeCapacityReservations "
                    f"[emulated]): {nodes} node(s) in {', '.join(found['groups'])}",
                )
            for back in r.get("handed_back", []):
                self.lifecycle.setdefault("handed_back", []).append({"minute": minute, **back})
                self.say(minute, f"  spot_watch: {back['group']} {back['outcome']}: {back['reason']}")

    def run_guard(self, minute: int) -> None:
        """The OOM guard on the reconcile tick; then [emulated EC2 Auto Scaling] replaces Unhealthy instances."""
        now = START + timedelta(minutes=minute, seconds=40)
        result = self.guard.evaluate(now, f"guard-{minute}")
        self.emf.clear_metrics()
        self.guard_results.append((minute, result))
        for r in result["replacements"]:
            self.say(minute, f"  oom_guard: {r['instance_id']} {'replaced' if r['act'] else 'kept'}: {r['reason']}")
        for asg in self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[TRAIN.name])[
            "AutoScalingGroups"
        ]:
            for inst in asg["Instances"]:
                if inst["HealthStatus"].upper() == "UNHEALTHY":
                    self.clients.autoscaling.terminate_instance_in_auto_scaling_group(
                        InstanceId=inst["InstanceId"], ShouldDecrementDesiredCapacity=False
                    )
                    self.say(minute, f"[emulated EC2 Auto Scaling] replaced unhealthy {inst['InstanceId']}")

    def _check_victims(self, minute: int, d: dict[str, Any]) -> None:
        for iid in d["victims"]:
            node = self.nodes.get(iid)
            if iid in (self.long_job, self.job_node, self.protected):
                self.result.failures.append(f"{minute}: terminated {iid}, which must never be chosen")
            elif node is None or node.util > IDLE_UTIL or node.mem > IDLE_MEM:
                self.result.failures.append(f"{minute}: terminated {iid}, which was not idle ({node})")

    def run(self) -> RehearsalResult:
        scaler = self.setup()
        dup_sent = False
        for minute in range(self.minutes):
            self.minute = minute
            for note in fleet.sync_nodegroup_asgs(self.clients):
                self.say(minute, note)
            if self.scenes:
                self.scenes.tick(minute)
            self.emulate_spot_market(minute)
            self.emulate_capacity_events(minute)
            averages = self.publish(minute)
            now = START + timedelta(minutes=minute, seconds=15)
            for event in self.alarms.tick(now):
                detail = event["detail"]
                self.say(
                    minute, f"alarm {detail['alarmName']} -> {detail['state']['value']} ({detail['state']['reason']})"
                )
                self.invoke(scaler, event, minute, show_holds=True)
                if detail["state"]["value"] == "ALARM" and not dup_sent:
                    dup_sent = True
                    self._duplicate_delivery(scaler, event, minute)
            tick = {
                "gpufleet": "reconcile",
                "execution_id": f"rehearsal-{minute}",
                "scheduled_time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            self.invoke(scaler, tick, minute)
            if minute % GUARD_EVERY_MIN == 0:
                self.run_guard(minute)
            self.run_spot_watch(minute)
            if minute == REFRESH_MINUTE:
                self.ask_termination_policy(minute)
            if minute == 20:
                self.receiver.script.append("429:1")  # Slack rate-limits one post; slack-sdk waits and retries
            self.notify(minute)
            self._record_capacity(minute, averages)
            if minute == 5:
                self._malformed(scaler, minute)
                self._malformed_notification(minute)
        self.finish_nodes(self.minutes)
        self.verify()
        self.verify_publisher()
        self.verify_usage()
        self.verify_guard()
        self.verify_spot()
        self.verify_lifecycle()
        self.verify_notifications()
        if self.scenes:
            checks, failures = demand_scene.verify(self.scenes, self.result.decisions, self.result.capacity)
            self.result.checks += checks
            self.result.failures += failures
        return self.result

    def _record_capacity(self, minute: int, averages: dict[str, float]) -> None:
        """Each group's desired capacity this minute; every 10 minutes a [capacity] line."""
        for ref in (TRAIN, INFER, *(self.scenes.groups if self.scenes else ())):
            self.result.capacity.setdefault(ref.key, []).append(self._desired(ref))
        if minute % 10 == 0 or minute == self.minutes - 1:
            status = "   ".join(
                f"{ref.key} util {averages[ref.key]:3.0f}% desired {self.result.capacity[ref.key][-1]}"
                for ref in (TRAIN, INFER)
            )
            self.say(minute, f"[capacity] {status}")

    def _duplicate_delivery(self, scaler: Any, event: dict[str, Any], minute: int) -> None:
        before = {ref.key: self._desired(ref) for ref in (TRAIN, INFER)}
        scaler.handle(event, now=START + timedelta(minutes=minute, seconds=40))
        after = {ref.key: self._desired(ref) for ref in (TRAIN, INFER)}
        if before != after:
            self.result.failures.append(f"duplicate delivery of {event['id']} changed capacity {before} -> {after}")
        else:
            self.result.checks.append("a duplicate EventBridge delivery changed nothing (idempotent per event id)")
            self.say(minute, f"  duplicate delivery of event {event['id'][:8]}: no second change (idempotent)")

    def _malformed(self, scaler: Any, minute: int) -> None:
        before = {ref.key: self._desired(ref) for ref in (TRAIN, INFER)}
        bad = {
            "version": "0",
            "id": "bad-1",
            "detail-type": "CloudWatch Alarm State Change",
            "source": "aws.cloudwatch",
            "account": "123456789012",
            "time": "2026-11-23T08:05:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": {"alarmName": "gpufleet-x", "state": {"value": "PANIC"}},
        }
        try:
            scaler.handle(bad, now=START + timedelta(minutes=minute))
            self.result.failures.append("a malformed event was accepted")
        except InvalidEvent as exc:
            self.say(minute, f"malformed event rejected, nothing changed: {exc}")
        if before != {ref.key: self._desired(ref) for ref in (TRAIN, INFER)}:
            self.result.failures.append("a malformed event changed capacity")
        else:
            self.result.checks.append("a malformed event was rejected with a reason and changed nothing")

    def _malformed_notification(self, minute: int) -> None:
        self.clients_sqs.send_message(QueueUrl=self.stack.queue_url, MessageBody='{"title": "half a message"')
        self.notify(minute)
        rejected = fleet.drain(self.clients_sqs, self.stack.dlq_url)
        reasons = [m["MessageAttributes"]["rejected_reason"]["StringValue"] for m in rejected]
        if len(reasons) == 1:
            self.say(minute, f"malformed notification message sent to the DLQ: {reasons[0]}")
            self.result.checks.append("a malformed queue message went to the DLQ with its reason; nothing posted")
        else:
            self.result.failures.append(f"malformed notification: expected 1 DLQ message, got {reasons}")

    def verify_guard(self) -> None:
        r = self.result
        leak_key = f"{self.long_job}/gpu{LEAK_GPU}"
        levels = [(m, res["at_risk"].get(leak_key, "ok").split(":")[0]) for m, res in self.guard_results]
        first = {lvl: next((m for m, seen in levels if seen == lvl), None) for lvl in ("warning", "critical")}
        cleared = next(
            (m for m, seen in levels if first["critical"] is not None and m > first["critical"] and seen == "ok"), None
        )
        full_at = 30 + (100 - 60) / 1.2
        if first["warning"] is not None and first["critical"] is not None and cleared is not None:
            if first["warning"] < first["critical"] < full_at:
                r.checks.append(
                    f"leaking GPU {leak_key}: WARNING at minute {first['warning']}, CRITICAL at minute "
                    f"{first['critical']} (it would be full at minute {full_at:.0f}), resolved at minute {cleared}"
                )
            else:
                r.failures.append(f"leak flagged in the wrong order or too late: {first}")
        else:
            r.failures.append(f"leak not followed through WARNING -> CRITICAL -> resolved: {first}, cleared {cleared}")
        replaced = [
            rep
            for _, res in self.guard_results
            for rep in res["replacements"]
            if rep["act"] and rep["instance_id"] == self.xid_node
        ]
        unhealthy = any(k.startswith(f"{self.xid_node}/") for _, res in self.guard_results for k in res["unhealthy"])
        if self.xid_node and unhealthy and len(replaced) == 1:
            r.checks.append(f"XID 79 on {self.xid_node}: health incident, instance replaced once (blast radius 1/h)")
        else:
            r.failures.append(f"XID 79 on {self.xid_node}: unhealthy={unhealthy}, replacements={len(replaced)}")
        kinds = [p["text"] for p in r.slack]
        for needle in ("GPU memory warning", "GPU memory critical", "GPU memory back to normal", "GPU failure on"):
            if not any(needle in t for t in kinds):
                r.failures.append(f"no Slack message with {needle!r}")

    def verify_spot(self) -> None:
        r = self.result
        up = [m for m in self.fallback_moves if m[2] > m[1]]
        down = [m for m in self.fallback_moves if m[2] < m[1]]
        ends_at_zero = bool(self.fallback_moves) and self.fallback_moves[-1][2] == 0
        first_failure = SPOT_OUTAGE.start
        if up and up[0][0] - first_failure >= 5 and down and ends_at_zero and down[0][0] >= SPOT_OUTAGE.stop:
            r.checks.append(
                f"spot outage: {len(self.spot_failures)} failed launches classified spot-capacity (event + sweep "
                f"counted once); fallback raised at minute {up[0][0]} after the 5 min wait, handed back from minute "
                f"{down[0][0]} as spot instances came into service"
            )
        else:
            r.failures.append(f"spot fallback cycle incomplete: moves {self.fallback_moves}")
        texts = [p["text"] for p in r.slack]
        for needle in ("launch(es) failed: spot-capacity", "fell back to on-demand", "launches recovered"):
            if not any(needle in t for t in texts):
                r.failures.append(f"no Slack message with {needle!r}")

    def verify_lifecycle(self) -> None:
        r, lc = self.result, self.lifecycle
        warned = lc.get("warned", {}).get("replacement")
        backs = [b for b in lc.get("handed_back", []) if b["outcome"] == "applied"]
        if isinstance(warned, dict) and warned["outcome"] == "applied" and len(backs) == 1:
            r.checks.append(
                f"spot interruption of {self.doomed} (busy): replacement launched {warned['current']} -> "
                f"{warned['desired']} at minute {INTERRUPT_MINUTE}, the job moved to it, one idle node given back "
                f"at minute {backs[0]['minute']}"
            )
        else:
            r.failures.append(f"interruption: replacement {warned}, hand-backs {lc.get('handed_back')}")
        victims = [v for d in r.decisions if d["outcome"] == "applied" for v in d["victims"]]
        if self.job_node in victims or self.job_node not in self._instances(TRAIN.key):
            r.failures.append(f"the long job's new node {self.job_node} was terminated")
        nodes, allowed = lc.get("refresh", ([], []))
        idle = [iid for iid in nodes if self.nodes[iid].util <= IDLE_UTIL and self.nodes[iid].mem <= IDLE_MEM]
        if nodes and allowed == idle and len(idle) == 1:
            r.checks.append(f"termination policy: of {len(nodes)} {BLOCK.name} nodes, only the idle {idle[0]} allowed")
        else:
            r.failures.append(f"termination policy answered {allowed} for {nodes} (idle: {idle})")
        block = lc.get("block", {}).get("groups", {})
        swept = lc.get("block_sweep", {})
        if (
            set(block) == {BLOCK.key}
            and len(block[BLOCK.key]) == 2
            and swept.get("minute") == BLOCK_WARNING_MINUTE - 20
        ):
            r.checks.append(
                f"Capacity Block end: the sweep told of {BLOCK.key}'s 2 nodes at minute {swept['minute']} (1 h before "
                f"the end), EC2's warning at minute {BLOCK_WARNING_MINUTE} joined the same incident"
            )
        else:
            r.failures.append(f"Capacity Block warning named {block}; sweep found {swept}")
        texts = [json.dumps(p) for p in r.slack]  # a paced update lists the ones folded into it
        for needle in ("spot interruption in 2 min", "its early replacement stays", "Capacity Block"):
            if not any(needle in t for t in texts):
                r.failures.append(f"no Slack message with {needle!r}")

    def finish_nodes(self, minute: int) -> None:
        """The rehearsal is over: every node's publisher closes its usage window and sends what it has."""
        for iid in list(self.publishers):
            self._stop_publisher(iid, minute)

    def _stop_publisher(self, iid: str, minute: int) -> None:
        """A node is gone (or the rehearsal over): its publisher sends what it holds, and is counted."""
        gone = self.publishers.pop(iid)
        gone.finish(START + timedelta(minutes=minute))
        self.put_metric_calls += gone.sender.calls
        self.finished_nodes += 1

    def verify_publisher(self) -> None:
        r = self.result
        calls = self.put_metric_calls + sum(p.sender.calls for p in self.publishers.values())
        # one call per node-minute; a node that stops sends its last usage window's team series on its own
        if self.node_minutes <= calls <= self.node_minutes + self.finished_nodes:
            r.checks.append(
                f"the nodes' GPU metrics came from the real publisher: {calls} PutMetricData calls for "
                f"{self.node_minutes} node-minutes x {GPUS_PER_NODE} GPUs (one call per node-minute); "
                f"{calls - self.node_minutes} more carried stopped nodes' last team series"
            )
        else:
            r.failures.append(f"publisher: {calls} PutMetricData calls for {self.node_minutes} node-minutes")

    def verify_usage(self) -> None:
        """`gpufleet report` over the rehearsal's records: the two teams, the idle GPU found and priced."""
        import contextlib
        import io

        from gpufleet_tools.cli import main as cli

        end = START + timedelta(minutes=self.minutes)
        args = ["report", "--start", START.isoformat(), "--end", end.isoformat(), "--no-progress"]
        args += ["--endpoint", os.environ[defaults.ENV_ENDPOINT_URL], "--png", str(self.out / "usage-report.png")]
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            code = cli(args)
        self.result.report = text.getvalue()
        r = self.result
        idle = "team-a/finetune-llm"
        report = self.result.report
        if code == 0 and "team-a" in report and "team-b" in report:
            r.checks.append("`gpufleet report` read the nodes' usage records: GPU-hours and cost per team")
        else:
            r.failures.append(f"gpufleet report (exit {code}) did not show both teams:\n{report}")
        finding = next((line for line in report.splitlines() if idle in line and "requested 2" in line), None)
        if finding:
            r.checks.append(f"finding: {finding.strip()}")
        else:
            r.failures.append(f"the report did not find {idle}'s idle GPU")

    def verify_notifications(self) -> None:
        r = self.result
        posts = r.slack
        if not posts:
            r.failures.append("nothing was posted to Slack")
            return
        r.checks.append(f"{self.notifications_queued} notifications queued -> {len(posts)} Slack posts after grouping")
        if len(posts) >= self.notifications_queued:
            r.failures.append("grouping did not reduce the number of posts")
        by_incident: dict[str, list[int]] = {}
        for p in posts:
            by_incident.setdefault(_incident_of(p)[0], []).append(p["minute"])
        interval_min = POLICY_NOTIFY_INTERVAL_S // 60
        if any(b - a < interval_min for minutes in by_incident.values() for a, b in itertools.pairwise(minutes)):
            r.failures.append(f"an incident was posted more often than every {interval_min} min: {by_incident}")
        else:
            r.checks.append(f"{len(by_incident)} incidents (one thread each), updates at most every {interval_min} min")
        sent = [json.dumps({k: v for k, v in p.items() if k != "ts"}) for p in posts]  # a repeat gets a new ts
        if any(p["answered"] is False for p in posts) or len(set(sent)) != len(posts):
            r.failures.append("a Slack post was repeated")
        sns = fleet.drain(self.clients_sqs, self.stack.sns_inbox_url)
        if len(sns) != len(posts):
            r.failures.append(f"SNS got {len(sns)} notifications, Slack {len(posts)}")
        else:
            r.checks.append(f"the SNS topic got the same {len(sns)} notifications (email/pager subscribers)")
        if "429:1" not in self.receiver.answers:
            r.failures.append("the Slack rate limit was never exercised")
        else:
            r.checks.append("a Slack 429 (Retry-After: 1) was retried by slack-sdk; nothing lost")
        self.verify_threads()

    def verify_threads(self) -> None:
        """Bot-token mode [emulated Slack]: each incident's first post opens a thread in the channel, and
        every later post about it is a reply in that thread (chat.postMessage's thread_ts), none elsewhere.
        The incident with the most posts is kept, as the channel shows it, for the console."""
        r = self.result
        stories: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
        for number, p in enumerate(r.slack, start=1):
            stories.setdefault(_incident_of(p), []).append((number, p))
        wrong = [
            key
            for key, told in stories.items()
            if told[0][1].get("thread_ts")
            or any(p.get("thread_ts") != told[0][1]["ts"] for _, p in told[1:])
            or any(p.get("channel") != SLACK_CHANNEL for _, p in told)
        ]
        replies = sum(len(told) - 1 for told in stories.values())
        if wrong or not replies:
            r.failures.append(f"Slack threads: {replies} replies; posted outside their incident's thread: {wrong}")
            return
        r.checks.append(
            f"Slack bot mode [emulated Slack]: {len(stories)} incidents opened {len(stories)} threads in "
            f"{SLACK_CHANNEL}; all {replies} later posts replied in their incident's thread (thread_ts)"
        )
        (key, since), told = max(stories.items(), key=lambda item: len(item[1]))
        r.thread = [f"incident {key} (open since {since}), {len(told)} posts in one thread:"]
        for number, p in told:
            stamp = (START + timedelta(minutes=p["minute"])).strftime("%H:%M")
            mark = "  ↳ thread reply " if p.get("thread_ts") else ""
            r.thread.append(f"  {stamp}  {mark}[slack #{number}] {describe(p)[0]}")

    # ---- expected outcomes ----

    def verify(self) -> None:
        r = self.result
        for ref in (TRAIN, INFER):
            series = r.capacity[ref.key]
            lo, hi = self.limits[ref.key]
            peak = max(series)
            if peak <= series[0]:
                r.failures.append(f"{ref.key}: no scale-out on load (capacity {series[0]} -> peak {peak})")
            else:
                r.checks.append(f"{ref.key}: scaled out on load {series[0]} -> {peak}")
            if series[-1] >= peak:
                r.failures.append(f"{ref.key}: no scale-in after the load dropped (peak {peak}, end {series[-1]})")
            else:
                r.checks.append(f"{ref.key}: scaled in after the drop {peak} -> {series[-1]}")
            if any(not lo <= c <= hi for c in series):
                r.failures.append(f"{ref.key}: capacity left bounds [{lo}, {hi}]: {series}")
            else:
                r.checks.append(f"{ref.key}: capacity stayed within [{lo}, {hi}] every minute")
        alive = set(self._instances(TRAIN.key))
        if self.job_node in alive and self.protected in alive:
            r.checks.append("the long training job's node and the scale-in-protected node are still running")
        else:
            r.failures.append("the long-job node or the protected node was terminated")
        victims = [v for d in r.decisions if d["outcome"] == "applied" for v in d["victims"]]
        r.checks.append(f"{len(victims)} instance(s) terminated, each idle when chosen")
        window = [d for d in r.decisions if "morning-peak" in d["trigger"] and d["outcome"] == "applied"]
        if window:
            r.checks.append("the morning-peak window (10:15 Europe/Berlin) raised the inference group")
        else:
            r.failures.append("the morning-peak schedule window was never applied")


def _incident_of(post: dict[str, Any]) -> tuple[str, str]:
    """(incident key, open since) from a post's context line: one incident's story, one thread."""
    context = next(b for b in post["blocks"] if b["type"] == "context")["elements"][0]["text"]
    return context.split("`")[1], context.rsplit("open since ", 1)[-1]


def write_outputs(result: RehearsalResult, out_dir: Path) -> None:
    (out_dir / "timeline.txt").write_text("\n".join(result.lines) + "\n")
    (out_dir / "slack-messages.json").write_text(json.dumps(result.slack, indent=2))
    with open(out_dir / "decisions.jsonl", "w") as f:
        for d in result.decisions:
            f.write(json.dumps(d) + "\n")
