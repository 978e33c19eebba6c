"""The rehearsal's "demand you can trust" scenes (issue 28), on a fresh moto (reset after the main story)
with the real scaler and notifier, each scene its own group, policy and clock:

- (a) queue runners: asg:queue-runners (5 nodes) reads queue runner-jobs. Three runners [emulated workers]
  receive one job each (the messages are in flight) and mark their own node busy with the code
  `gpufleet-node busy -- COMMAND` runs (gpufleet_node.busy: Holders + BusyMark); every GPU reads idle (the
  runners are downloading their data). A tick protects and keeps the three and releases the two free nodes;
  when the jobs are done (messages deleted, marks deleted) the next tick releases the rest.
- (b) pods that fit no group: three serving/infer pods (cpu 4, memory 16Gi, 1 GPU each) wait in cluster
  ml [emulated Kubernetes API]; eks:ml/gpu-infer's g5.xlarge has ~3.92 CPU and ~14.5 GiB allocatable, so
  no node of it can take one: nothing is launched and on-call is told once, with the numbers.
- (c) a node that never reports its GPUs: asg:slow-boot (0 nodes) reads queue boot-jobs; one job waits,
  the group scales out 0 -> 1 and the new node comes InService, but its driver never loads [emulated
  node]: its publisher sends no GPU metric. Ticks at +5 and +10 min launch nothing more for the job
  (the node is on its way); at +16 min it is a GPU-health incident naming the instance and its age, told
  once (two more ticks: still one delivery).

The clocks [emulated]: moto stamps an instance's LaunchTime with the real wall clock, and the scaler's
GPU-ready probe measures a node's age against `now`. Each scene's clock therefore starts at what moto
reports as its nodes' LaunchTime (for (c), the new node's, read back once it is launched) and moves on
in whole simulated minutes from there; metrics are stamped on that clock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet.runtime import build_notifier, build_scaler
from gpufleet.settings import ENV_KUBE_ENDPOINTS
from gpufleet_node import schema
from gpufleet_node.busy import BusyMark, Holders
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import fleet
from rehearsal.kube_api import KubeApi, pod

TABLE = "gpufleet-state"
RUNNERS = GroupRef(kind=GroupKind.ASG, name="queue-runners")
SLOW = GroupRef(kind=GroupKind.ASG, name="slow-boot")
INFER = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="gpu-infer")
RUNNER_NODES, RUNNER_JOBS = 5, 3
JOBS_START, JOBS_DONE = 3, 6  # scene (a)'s minutes: the runners take their jobs; the jobs are done
BOOT_TICKS = (5, 10, 16, 17, 18)  # scene (c)'s ticks, in minutes after the new node's LaunchTime
INCIDENT_MINUTE = 16  # past gpu_ready_timeout_s (900 s, the default)
UNFIT_REQUESTS = {"cpu": "4", "memory": "16Gi"}  # and 1 GPU: the everyday case on a g5.xlarge
UNFIT_PODS = ("infer-0", "infer-1", "infer-2")
IDLE = 0.0  # every GPU of these scenes reads idle (runners downloading, nothing scheduled)


def runner_userid(instance_id: str) -> str:
    """[emulated] the aws:userid a runner's instance profile credentials carry: role id, then the instance."""
    return f"AROARUNNERROLEID:{instance_id}"


def _policy(rule: str) -> str:
    """Only the scene's own group: discovery off, the rule names it (no other group is touched)."""
    return (
        "version: 1\nmetric_lookback_s: 180\ndiscovery: {enabled: false}\n"
        "defaults:\n  idle: {gpu_utilization: 5, memory_percent: 10}\n"
        f"groups:\n{rule}"
    )


@dataclass
class TrustResult:
    lines: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Told:
    """One SNS delivery, as a subscriber reads it."""

    subject: str
    message: str

    @property
    def why(self) -> str:
        return next((line[5:] for line in self.message.splitlines() if line.startswith("Why: ")), "")

    @property
    def incident(self) -> str:
        last = next((line for line in self.message.splitlines() if line.startswith("Incident ")), "")
        return last.removeprefix("Incident ").rsplit(", open since ", 1)[0]


class TrustScenes:
    """The three scenes, one after the other; `run()` returns their lines and expected outcomes."""

    def __init__(self, out: Path, kube: tuple[KubeApi, str], token: str, echo: Callable[[str], None] = print) -> None:
        self.out, (self.api, self.kube_url), self.token, self.echo = out, kube, token, echo
        self.result = TrustResult()
        self.clients = fleet.Clients.create()
        self.sqs = boto3.client("sqs")
        self.scene = ""
        self.loggers: dict[str, Logger] = {}
        self.holders: dict[str, tuple[Holders, BusyMark]] = {}  # per node: its busy job's hold

    # ---- plumbing ----

    def say(self, minute: float, text: str) -> None:
        line = f"[{self.scene} +{minute:>2g} min] {text}"
        self.result.lines.append(line)
        self.echo(line)

    def _ok(self, ok: bool, group: GroupRef, text: str, why: str) -> None:
        """An expected outcome: `text` when it happened, else the group and what happened instead."""
        if ok:
            self.result.checks.append(f"{group.key}: {text}")
        else:
            self.result.failures.append(f"{group.key}: {why}")

    def setup(self) -> None:
        fleet.create_state_table(self.clients.dynamodb, TABLE)
        self.stack = fleet.create_notification_stack(slack_secret=None)  # the names the template grants

    def _env(self, policy: Path) -> dict[str, str]:
        env = self.stack.env(TABLE, str(policy))
        env[ENV_KUBE_ENDPOINTS] = json.dumps({INFER.cluster: {"url": self.kube_url, "token": self.token}})
        return env

    def _logger(self, service: str) -> Logger:
        """One Logger per service for all scenes (Powertools keys its handler on the service's name)."""
        if service not in self.loggers:
            handler = logging.FileHandler(self.out / f"trust-{service}.log", mode="w")
            self.loggers[service] = Logger(service=f"trust-{service}", logger_handler=handler)
        return self.loggers[service]

    def _scaler(self, name: str, rule: str) -> Any:
        path = self.out / f"policy-{name}.yaml"
        path.write_text(_policy(rule))
        emf = Metrics(namespace="GPUFleet/Controller", service="scaler")
        scaler, idempotency = build_scaler(self._logger("scaler"), emf, env=self._env(path))
        idempotency.register_lambda_context(LocalLambdaContext("scaler", timeout_s=900))  # type: ignore[arg-type]
        self.notifier = build_notifier(self._logger("notifier"), Metrics(service="notifier"), env=self._env(path))
        return scaler

    def tick(self, scaler: Any, now: datetime, minute: float, group: GroupRef) -> dict[str, Any]:
        """One reconcile tick at `now`; the group's decision, shown."""
        event = {
            "gpufleet": "reconcile",
            "execution_id": f"trust-{self.scene.replace(' ', '-')}-{minute:g}",
            "scheduled_time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        out: dict[str, Any] = scaler.handle(event, now=now)
        [d] = [d for r in out["results"] for d in r["decisions"] if d["group"] == group.key]
        self.result.decisions.append(d)
        self.say(minute, f"tick: {d['group']} {d['action']} {d['outcome']} {d['current']} -> {d['desired']}: "
                 f"{d['reason']}")  # fmt: skip
        decision: dict[str, Any] = d
        return decision

    def notify(self, now: datetime) -> list[Told]:
        """[emulated SQS event source] the scaler's notifications to the notifier (its sweep too); what the
        SNS topic delivered (its subscribed inbox queue, drained)."""
        for message in fleet.drain(self.sqs, self.stack.queue_url):
            self.notifier.handle_message(message["Body"], now=now)
        self.notifier.sweep(now)
        told = []
        for m in fleet.drain(self.sqs, self.stack.sns_inbox_url):
            envelope = json.loads(m["Body"])
            told.append(Told(envelope.get("Subject", ""), envelope["Message"]))
        return told

    def instances(self, asg: str) -> list[tuple[str, datetime]]:
        """InService instances of the ASG and their LaunchTime as moto (EC2) reports it."""
        group = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])
        ids = [
            i["InstanceId"] for i in group["AutoScalingGroups"][0]["Instances"] if i["LifecycleState"] == "InService"
        ]
        if not ids:
            return []
        found = self.clients.ec2.describe_instances(InstanceIds=ids)["Reservations"]
        launched = {i["InstanceId"]: i["LaunchTime"] for r in found for i in r["Instances"]}
        return sorted(((iid, launched[iid]) for iid in ids), key=lambda x: (x[1], x[0]))

    def idle_gpus(self, instance_ids: list[str], group: GroupRef, at: datetime) -> None:
        """[simulated node publisher] one minute of idle GPUs on each node: the datums the publisher puts
        (its instance series, its group's series)."""
        data = []
        for iid in instance_ids:
            for dims in ({schema.DIM_INSTANCE_ID: iid}, group.metric_dimensions):
                for metric in (schema.GPU_UTILIZATION, schema.GPU_MEMORY_USED_PERCENT):
                    dimensions = [{"Name": k, "Value": v} for k, v in dims.items()]
                    data.append({"MetricName": metric.name, "Dimensions": dimensions, "Value": IDLE, "Timestamp": at})
        fleet.put_data(self.clients.cloudwatch, data)

    def run(self) -> TrustResult:
        self.setup()
        for scene in (self.runners, self.never_ready, self.unfit):
            scene()
        return self.result

    def _take_job(self, queue: str, iid: str, group: GroupRef) -> tuple[str, str]:
        """[emulated runner] on `iid`: receive one job (it stays in flight) and mark the node busy as
        `gpufleet-node busy -- COMMAND` does before COMMAND starts (join the node's holders; the first one
        writes the mark, keyed by the aws:userid its instance profile would have). Returns (job, receipt)."""
        [m] = self.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, VisibilityTimeout=3600)["Messages"]
        mine = Holders(str(self.out / "nodes" / iid / "gpufleet-busy"), name="runner")
        protection = BusyMark(self.clients.dynamodb, runner_userid(iid), iid, group.name)
        mine.acquire(lambda: protection.set(True))
        self.holders[iid] = (mine, protection)
        return json.loads(m["Body"])["job"], m["ReceiptHandle"]

    def _job_done(self, queue: str, iid: str, receipt: str) -> None:
        """[emulated runner] the job finished: its message deleted; the last holder deletes the mark."""
        self.sqs.delete_message(QueueUrl=queue, ReceiptHandle=receipt)
        mine, protection = self.holders.pop(iid)
        mine.release(lambda: protection.set(False))

    # ---- (a) queue runners ----

    def runners(self) -> None:
        self.scene = "queue runners"
        queue = self.sqs.create_queue(QueueName="runner-jobs")["QueueUrl"]
        fleet.create_asg(
            self.clients, RUNNERS.name, min_size=0, max_size=6, desired=RUNNER_NODES, tags=fleet.MANAGED_TAG
        )
        scaler = self._scaler(
            "runners",
            f"  - name: {RUNNERS.name}\n    kind: asg\n    min: 0\n    max: 6\n    scale_in_step: 100%\n"
            "    scale_out_cooldown_s: 0\n    scale_in_cooldown_s: 0\n    target: {low: 30, high: 85}\n"
            f'    demand: {{sqs: {{queue_url: "{queue}", gpus_per_message: 4}}, gpus_per_node: 4}}\n',
        )
        nodes = self.instances(RUNNERS.name)
        t0 = nodes[0][1]  # the scene's clock starts at its nodes' LaunchTime as moto reports it
        ids = [iid for iid, _ in nodes]
        self.say(0, f"{RUNNERS.key}: {len(ids)} x {fleet.INSTANCE_TYPE} InService ({', '.join(ids)}), 4 GPUs each; "
                 "demand: queue runner-jobs, one 4-GPU job per message")  # fmt: skip
        for minute in range(JOBS_START):
            self.idle_gpus(ids, RUNNERS, t0 + timedelta(minutes=minute))
        now = t0 + timedelta(minutes=JOBS_START, seconds=30)
        for n in range(RUNNER_JOBS):
            self.sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": f"train-{n + 1}"}))
        self.say(JOBS_START, f"{RUNNER_JOBS} jobs sent to runner-jobs")
        receipts: dict[str, str] = {}
        for iid in ids[:RUNNER_JOBS]:
            job, receipts[iid] = self._take_job(queue, iid, RUNNERS)
            self.say(JOBS_START, f"[emulated runner] {iid} received {job} (in flight) and ran `gpufleet-node busy -- "
                     "train.sh`: marked busy; downloading its data, GPUs idle")  # fmt: skip
        self.idle_gpus(ids, RUNNERS, t0 + timedelta(minutes=JOBS_START))
        kept = self.tick(scaler, now, JOBS_START, RUNNERS)
        alive = [iid for iid, _ in self.instances(RUNNERS.name)]
        runners = ids[:RUNNER_JOBS]
        free = ids[RUNNER_JOBS:]
        self.say(JOBS_START, f"kept the runners holding jobs: {', '.join(i for i in runners if i in alive)}; "
                 f"released: {', '.join(i for i in ids if i not in alive) or 'none'}")  # fmt: skip
        first_ok = (
            kept["action"] == "scale-in"
            and kept["outcome"] == "applied"
            and sorted(kept["victims"]) == sorted(free)
            and all(i in alive for i in runners)
        )
        for minute in range(JOBS_START + 1, JOBS_DONE + 1):
            self.idle_gpus(alive, RUNNERS, t0 + timedelta(minutes=minute))
        for iid in runners:
            self._job_done(queue, iid, receipts[iid])
        self.say(JOBS_DONE, f"[emulated runner] {RUNNER_JOBS} jobs done: messages deleted, `gpufleet-node busy` "
                 "deleted each node's mark")  # fmt: skip
        done = self.tick(scaler, t0 + timedelta(minutes=JOBS_DONE, seconds=30), JOBS_DONE, RUNNERS)
        left = [iid for iid, _ in self.instances(RUNNERS.name)]
        second_ok = done["action"] == "scale-in" and sorted(done["victims"]) == sorted(runners) and not left
        self._ok(
            first_ok and second_ok,
            RUNNERS,
            f"{RUNNER_JOBS} jobs in flight on {RUNNER_JOBS} of {RUNNER_NODES} nodes, every GPU idle: "
            f"the tick at minute {JOBS_START} kept the {RUNNER_JOBS} runners holding jobs and released the "
            f"{len(free)} free nodes ({kept['current']} -> {kept['desired']}); the jobs done, minute {JOBS_DONE} "
            f"released the runners ({done['current']} -> {done['desired']})",
            f"first tick {kept['action']} {kept['victims']} (runners {runners}), then {done['action']} "
            f"{done['victims']}, left {left}",
        )

    # ---- (c) a node that never reports its GPUs ----

    def never_ready(self) -> None:
        self.scene = "slow boot"
        queue = self.sqs.create_queue(QueueName="boot-jobs")["QueueUrl"]
        fleet.create_asg(self.clients, SLOW.name, min_size=0, max_size=2, desired=0, tags=fleet.MANAGED_TAG)
        scaler = self._scaler(
            "slow-boot",
            f"  - name: {SLOW.name}\n    kind: asg\n    min: 0\n    max: 2\n    scale_out_cooldown_s: 0\n"
            "    scale_in_cooldown_s: 0\n"
            f'    demand: {{sqs: {{queue_url: "{queue}", gpus_per_message: 4}}, gpus_per_node: 4}}\n',
        )
        self.sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": "finetune-1"}))
        self.say(0, f"{SLOW.key}: 0 nodes, max 2; 1 job (4 GPUs) waits on boot-jobs")
        first = self.tick(scaler, datetime.now(UTC).replace(microsecond=0), 0, SLOW)
        nodes = self.instances(SLOW.name)
        if first["action"] != "scale-out" or len(nodes) != 1:
            self._ok(False, SLOW, "", f"no scale-out for the waiting job: {first['reason']}, nodes {nodes}")
            return
        [(stuck, launched)] = nodes
        self.say(0, f"[emulated node] {stuck} InService (LaunchTime {launched:%H:%M:%S} UTC as moto reports it: the "
                 "scene's clock from here); its NVIDIA driver never loads: its publisher reports no GPUs")  # fmt: skip
        outs: list[tuple[int, int]] = []
        told: list[tuple[int, Told]] = []
        healthy: list[str] = []  # a node launched after the incident: its publisher reports its GPUs
        for minute in BOOT_TICKS:
            now = launched + timedelta(minutes=minute)  # the stuck node is exactly `minute` old
            self.idle_gpus(healthy, SLOW, now - timedelta(seconds=30))
            d = self.tick(scaler, now, minute, SLOW)
            if d["action"] == "scale-out" and d["outcome"] == "applied":
                outs.append((minute, d["desired"]))
            for iid, _ in self.instances(SLOW.name):
                if iid not in (stuck, *healthy):
                    # [emulated] its LaunchTime is moto's wall clock, minutes "older" than the scene's clock:
                    # it reports GPUs from the next minute, so its age is never what decides about it
                    healthy.append(iid)
                    self._take_job(queue, iid, SLOW)
                    self.say(minute, f"[emulated node] {iid} InService, its publisher reports 4 GPUs; [emulated "
                             "runner] it received finetune-1 under `gpufleet-node busy` (marked)")  # fmt: skip
            delivered = [n for n in self.notify(now + timedelta(seconds=50)) if n.incident.startswith("gpu-not-ready/")]
            for n in delivered:
                self.say(minute, f"[SNS] {n.subject}: {n.why} (incident {n.incident})")
            told += [(minute, n) for n in delivered]
        early = [m for m, _ in outs if m < INCIDENT_MINUTE]
        text = told[0][1].why if told else ""
        ok = (
            not early
            and len(outs) <= 1
            and len(told) == 1
            and told[0][0] in (INCIDENT_MINUTE, INCIDENT_MINUTE + 1)  # raised at +16, the notifier's 30 s group wait
            and told[0][1].incident == f"gpu-not-ready/{stuck}"
            and f"{stuck} ({SLOW.key}) launched {INCIDENT_MINUTE} min ago" in text
        )
        after = len(BOOT_TICKS) - BOOT_TICKS.index(INCIDENT_MINUTE)
        at = f" (delivered at +{told[0][0]} min)" if told else ""
        replaced = f"; its job got a new node at +{outs[0][0]} min ({outs[0][1] - 1} -> {outs[0][1]})" if outs else ""
        self._ok(
            ok,
            SLOW,
            f"{stuck} InService without a GPU metric: no second node at +5 and +10 min (on its way); at "
            f"+{INCIDENT_MINUTE} min one GPU-health incident, {told[0][1].incident if told else ''}: "
            f"'{told[0][1].subject if told else ''}'{at}, told once over {after} ticks{replaced}",
            f"scale-outs {outs}, deliveries {[(m, n.subject, n.why) for m, n in told]}",
        )

    # ---- (b) pods that fit no group ----

    def unfit(self) -> None:
        self.scene = "unfit pods"
        fleet.create_nodegroup(
            self.clients, INFER.cluster or "ml", INFER.name, min_size=0, max_size=4, desired=0,
            tags=fleet.MANAGED_TAG, instance_type="g5.xlarge",
        )  # fmt: skip
        scaler = self._scaler(
            "gpu-infer",
            f"  - name: {INFER.name}\n    cluster: {INFER.cluster}\n    kind: eks-nodegroup\n    min: 0\n    max: 4\n"
            "    scale_out_cooldown_s: 0\n    demand: {kubernetes: {}}\n",
        )
        now = datetime.now(UTC).replace(microsecond=0)
        since = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        for name in UNFIT_PODS:
            self.api.add(pod(name, "serving", gpus=1, since=since, owner="ReplicaSet", requests=UNFIT_REQUESTS))
        self.say(0, f"[emulated Kubernetes API] cluster ml: {len(UNFIT_PODS)} pods of serving/infer (cpu 4, memory "
                 f"16Gi, 1 GPU) Pending; {INFER.key}: 0 nodes, g5.xlarge")  # fmt: skip
        told: list[Told] = []
        outs = []
        for minute in (0, 1, 2):
            at = now + timedelta(minutes=minute)
            d = self.tick(scaler, at, minute, INFER)
            if d["action"] == "scale-out":
                outs.append(minute)
            found = [n for n in self.notify(at + timedelta(seconds=50)) if "fit no group" in n.message]
            for n in found:
                self.say(minute, f"[SNS] {n.subject}: {n.why} (incident {n.incident})")
            told += found
        for name in UNFIT_PODS:
            self.api.remove("serving", name)
        text = told[0].why if told else ""
        self._ok(
            not outs and len(told) == 1 and "3.92" in text and "14.5" in text,
            INFER,
            f"{len(UNFIT_PODS)} pods (cpu 4, memory 16Gi, 1 GPU) fit no g5.xlarge: nothing launched, "
            f"told once in 3 ticks: '{told[0].subject if told else ''}: {text}'",
            f"scale-outs at minutes {outs}, {len(told)} notification(s) {[n.subject for n in told]}",
        )


def run_alone(scene: type[TrustScenes], name: str) -> int:
    """`python -m rehearsal.<name>_scene [OUT]`: one scene alone on its own moto server and loopback
    Kubernetes API (a few seconds); its expected outcomes printed; 1 when one does not happen."""
    import sys

    from rehearsal.kube_api import KubeApi, kube_api
    from rehearsal.moto import moto_server

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-out")
    out.mkdir(parents=True, exist_ok=True)
    token = "gpufleet-rehearsal-token"
    with moto_server(out / f"moto-{name}.log"), kube_api(KubeApi(tokens={token})) as kube:
        result = scene(out, kube, token).run()
    for check in result.checks:
        print(f"  ok    {check}")
    for failure in result.failures:
        print(f"  FAIL  {failure}")
    return 1 if result.failures else 0
