"""The action scenarios the crash-point harness breaks: each builds its fleet in moto, delivers one event
to the real function, and states the invariants that must hold whatever call failed.

Invariants (all scenarios): each decision changes capacity at most once; desired never leaves bounds;
no change goes unaudited or unnotified; no critical notification is lost; a post repeats at most once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger, Metrics

from gpufleet.aws.audit import AuditLog
from gpufleet.aws.state import StateStore
from gpufleet.domain import defaults
from gpufleet.domain.models import Outcome
from gpufleet.domain.notification import Notification, NotificationKind, Severity, note
from gpufleet.runtime import build_guard, build_notifier, build_scaler, build_spot_watch
from gpufleet_node import schema
from gpufleet_node.busy import BusyMark
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import calls, fleet
from tests.crash.harness import World, client

TABLE = "gpufleet-state"
ROOT = Path(__file__).resolve().parents[2]
SPOT_FULL = (
    "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to your request "
    "configuration. Please adjust your request and try again. Launching EC2 instance failed."
)


def _logger() -> Logger:
    return Logger(service="crash", level="CRITICAL")


_BUILT: dict[tuple[str, str], Any] = {}


def warm(kind: str, env: dict[str, str], build: Any) -> Any:
    """The same function object across a scenario's runs, as a warm Lambda container (its state lives in
    moto, reset before each run). Building clients for every run would double the suite's time."""
    key = (kind, json.dumps(env, sort_keys=True))
    if key not in _BUILT:
        _BUILT[key] = build()
    return _BUILT[key]


def _event(name: str) -> dict[str, Any]:
    return dict(json.loads((ROOT / "events" / "scaler" / name).read_text()))


class _Fleet(World):
    """A managed ASG `train-spot`, the state table, the notification queue, one function's env."""

    def __init__(self, policy: str, tmp: Path, desired: int = 2, max_size: int = 8, asg: bool = True) -> None:
        self.clients = fleet.Clients.create(client)
        fleet.create_state_table(self.clients.dynamodb, TABLE)
        if asg:  # a HyperPod scenario has no ASG (tests/crash/hyperpod_scenario.py)
            fleet.create_asg(
                self.clients,
                "train-spot",
                min_size=1,
                max_size=max_size,
                desired=desired,
                tags=fleet.MANAGED_TAG,
                market="spot",
            )
        self.stack = fleet.create_notification_stack(slack_secret=None, client=client)
        self.policy = tmp / "policy.yaml"
        self.policy.write_text(policy)
        self.env = {
            defaults.ENV_STATE_TABLE: TABLE,
            defaults.ENV_POLICY_FILE: str(self.policy),
            defaults.ENV_NOTIFY_QUEUE_URL: self.stack.queue_url,
        }
        self.notes: list[Notification] = []

    def desired(self, asg: str = "train-spot") -> int:
        g = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"][0]
        return int(g["DesiredCapacity"])

    def instances(self, asg: str = "train-spot") -> list[str]:
        g = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"][0]
        return sorted(i["InstanceId"] for i in g["Instances"])

    def queued(self) -> list[Notification]:
        self.notes += [
            Notification.model_validate_json(m["Body"]) for m in fleet.drain(client("sqs"), self.stack.queue_url)
        ]
        return self.notes

    def audited(self, group: str) -> list[Any]:
        return [d for d in AuditLog(self.clients.dynamodb, TABLE).recent(group, 50) if d.outcome is Outcome.APPLIED]

    def change_told_and_audited(self, group: str) -> list[str]:
        problems = []
        if not self.audited(group):
            problems.append(f"{group}: the change was never audited")
        if not any(n.group == group or group in n.title for n in self.queued()):
            problems.append(f"{group}: the change was never told")
        state = StateStore(self.clients.dynamodb, TABLE).load([group])[group]
        if state.intent is not None or state.outbox:
            problems.append(f"{group}: left unfinished (intent {state.intent is not None}, outbox {len(state.outbox)})")
        return problems

    def put_gpus(self, readings: Iterable[tuple[str, float, float, datetime]]) -> None:
        """(instance, utilization, memory %, at) readings as the publishers sent them, in as few calls as
        CloudWatch allows: the sweep builds these worlds a thousand times."""
        data = []
        for instance_id, util, mem, at in readings:
            dims = [{"Name": schema.DIM_INSTANCE_ID, "Value": instance_id}]
            data += [
                {"MetricName": schema.GPU_UTILIZATION.name, "Dimensions": dims, "Value": util, "Timestamp": at},
                {"MetricName": schema.GPU_MEMORY_USED_PERCENT.name, "Dimensions": dims, "Value": mem, "Timestamp": at},
            ]
        fleet.put_data(self.clients.cloudwatch, data)


class _ScalerWorld(_Fleet):
    def __init__(self, policy: str, tmp: Path, **kw: Any) -> None:
        super().__init__(policy, tmp, **kw)
        self.scaler, idem = warm(
            "scaler", self.env, lambda: build_scaler(_logger(), Metrics(namespace="Crash"), env=self.env)
        )
        idem.register_lambda_context(LocalLambdaContext("scaler", timeout_s=120))  # type: ignore[arg-type]

    def later(self, now: datetime) -> None:
        tick = {"gpufleet": "reconcile", "execution_id": f"later-{now:%H%M}", "scheduled_time": now.isoformat()}
        self.scaler.handle(tick, now)


class AlarmScaleOut(_ScalerWorld):
    def __init__(self, tmp: Path) -> None:
        super().__init__("defaults: {scale_out_step: 1, scale_out_cooldown_s: 300}\n", tmp)
        fleet.put_gpu_alarm(
            self.clients.cloudwatch,
            "gpufleet-train-gpu-high",
            {"AutoScalingGroupName": "train-spot"},
            direction="out",
            threshold=85,
            evaluation_periods=1,
        )

    def deliver(self, now: datetime) -> None:
        self.scaler.handle(_event("eventbridge-alarm-asg-high.json"), now)

    def violations(self) -> list[str]:
        got = self.desired()
        return (
            [f"desired {got}, expected exactly one step 2 -> 3"] if got != 3 else []
        ) + self.change_told_and_audited("asg:train-spot")


class ScaleInTwoVictims(_ScalerWorld):
    def __init__(self, tmp: Path, now: datetime) -> None:
        policy = (
            "defaults: {scale_in_step: 2, scale_in_cooldown_s: 300, idle: {gpu_utilization: 5, memory_percent: 10}}\n"
        )
        super().__init__(policy, tmp, desired=4)
        fleet.put_gpu_alarm(
            self.clients.cloudwatch,
            "gpufleet-train-gpu-low",
            {"AutoScalingGroupName": "train-spot"},
            direction="in",
            threshold=20,
            evaluation_periods=1,
        )
        # In ALARM, as CloudWatch has it when it runs the alarm action (the scaler re-reads it).
        self.clients.cloudwatch.set_alarm_state(AlarmName="gpufleet-train-gpu-low", StateValue="ALARM", StateReason="t")
        ids = self.instances()
        self.busy, self.idle = ids[:2], ids[2:]
        self.put_gpus(
            (iid, 0 if iid in self.idle else 90, 1 if iid in self.idle else 70, now - timedelta(minutes=minute))
            for minute in range(1, 4)
            for iid in ids
        )

    def deliver(self, now: datetime) -> None:
        self.scaler.handle(_event("alarm-action-asg-low.json"), now)

    def later(self, now: datetime) -> None:
        """The nodes still there kept publishing (a later tick reads this minute's metrics, not the first)."""
        with calls.unrecorded():
            left = self.instances()
            self.put_gpus(
                (iid, 90 if iid in self.busy else 0, 70 if iid in self.busy else 1, now - timedelta(minutes=minute))
                for minute in range(1, 4)
                for iid in left
            )
        super().later(now)

    def violations(self) -> list[str]:
        problems = self.change_told_and_audited("asg:train-spot")
        if self.instances() != sorted(self.busy) or self.desired() != 2:
            problems.append(
                f"expected exactly the two idle instances removed: left {self.instances()}, desired {self.desired()}"
            )
        return problems


class ScaleInWorkLands(ScaleInTwoVictims):
    """The same scale-in, and between attempts a job takes one of the idle nodes and protects it (a queue
    worker; protection does not stop TerminateInstanceInAutoScalingGroup): whatever call failed, that
    node is never terminated afterwards, and the other idle node still goes (issue 40)."""

    def __init__(self, tmp: Path, now: datetime) -> None:
        super().__init__(tmp, now)
        self.taken: str | None = None

    def between(self) -> None:
        if self.taken is None and self.idle[0] in self.instances():
            self.taken = self.idle[0]
            self.clients.autoscaling.set_instance_protection(
                InstanceIds=[self.taken], AutoScalingGroupName="train-spot", ProtectedFromScaleIn=True
            )

    def violations(self) -> list[str]:
        left = self.instances()
        problems = []
        if self.taken is not None and self.taken not in left:
            problems.append(f"{self.taken} took a job (protected) between attempts and was terminated")
        if not set(self.busy) <= set(left):
            problems.append(f"a busy node was terminated: left {left}")
        if len(left) != self.desired():
            problems.append(f"desired {self.desired()} does not name the {len(left)} instances left")
        return problems


class DemandScaleOut(_ScalerWorld):
    """Three 8-GPU jobs wait in the group's SQS queue while the group's two nodes work on two more (in
    flight: they hold those nodes, issue 28): one reconcile tick scales 2 -> 5 in one change."""

    def __init__(self, tmp: Path) -> None:
        sqs = client("sqs")
        self.queue = queue = sqs.create_queue(QueueName="train-jobs")["QueueUrl"]
        for i in range(2):  # taken by the two runners, never deleted while the scenario runs
            sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": f"running-{i}"}))
        running = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=2, VisibilityTimeout=3600)
        assert len(running["Messages"]) == 2
        for i in range(3):
            sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": i}))
        policy = (
            "groups:\n  - {name: train-spot, kind: asg, demand: "
            f'{{sqs: {{queue_url: "{queue}", gpus_per_message: 8}}, gpus_per_node: 8}}}}\n'
        )
        super().__init__(policy, tmp)

    def deliver(self, now: datetime) -> None:
        tick = {"gpufleet": "reconcile", "execution_id": "demand-1", "scheduled_time": now.isoformat()}
        self.scaler.handle(tick, now)

    def later(self, now: datetime) -> None:
        """[emulated] once the nodes are there, workers on them take the jobs off the queue."""
        if self.desired() >= 5:
            with calls.unrecorded():
                fleet.drain(client("sqs"), self.queue)
        super().later(now)

    def violations(self) -> list[str]:
        got = self.desired()
        return ([f"desired {got}, expected 2 -> 5 in one change"] if got != 5 else []) + self.change_told_and_audited(
            "asg:train-spot"
        )


class QueueScaleIn(_ScalerWorld):
    """An SQS-driven group of four idle-reading 8-GPU nodes; one job is in flight (a runner received it and
    is still downloading, its GPUs idle) and nothing is visible. Its runner marked its node busy
    (`gpufleet-node busy`'s own BusyMark). One reconcile tick protects it (a crash anywhere in between is
    mended by the next run) and releases the three unmarked idle nodes in one change, down to the one node
    the in-flight job holds; the marked node stays."""

    def __init__(self, tmp: Path, now: datetime) -> None:
        sqs = client("sqs")
        self.queue = queue = sqs.create_queue(QueueName="train-jobs")["QueueUrl"]
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": 1}))
        taken = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, VisibilityTimeout=3600)
        assert len(taken["Messages"]) == 1  # in flight for the whole run: received, never deleted
        policy = (
            "groups:\n  - {name: train-spot, kind: asg, demand: "
            f'{{sqs: {{queue_url: "{queue}", gpus_per_message: 8}}, gpus_per_node: 8}}}}\n'
        )
        super().__init__(policy, tmp, desired=4)
        ids = self.instances()
        self.runner = ids[0]
        BusyMark(client("dynamodb"), f"AROARUNNERROLEID:{self.runner}", self.runner, "train-spot").set(True)
        # Every node reads idle, the runner's too (its job is still downloading), as their publishers keep
        # reporting through the later runs (a run that finds no fresh datum removes nobody).
        self.put_gpus((iid, 0, 1, now - timedelta(minutes=minute)) for minute in range(-25, 6) for iid in ids)

    def deliver(self, now: datetime) -> None:
        tick = {"gpufleet": "reconcile", "execution_id": "queue-in-1", "scheduled_time": now.isoformat()}
        self.scaler.handle(tick, now)

    def violations(self) -> list[str]:
        problems = self.change_told_and_audited("asg:train-spot")
        left, got = self.instances(), self.desired()
        if self.runner not in left:
            problems.append(f"the protected runner {self.runner} (its job in flight) was removed")
        if left != [self.runner] or got != 1:
            problems.append(f"expected exactly the 3 unprotected idle nodes removed: left {left}, desired {got}")
        [group] = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["train-spot"])[
            "AutoScalingGroups"
        ]
        unprotected = [i["InstanceId"] for i in group["Instances"] if not i["ProtectedFromScaleIn"]]
        if self.runner in unprotected:  # its mark is kept as protection by the run that completes
            problems.append(f"the marked runner {self.runner} is not protected from scale-in")
        # One change 4 -> 1; or, where a fault left it half done past a tick, what happened of it and then the
        # rest decided again (issue 40: a stale removal is never replayed): steps that chain 4 -> 1, each once.
        steps = sorted(
            ((d.current, d.desired) for d in self.audited("asg:train-spot") if d.changes_capacity), reverse=True
        )
        chained = bool(steps) and steps[0][0] == 4 and steps[-1][1] == 1
        chained = chained and all(a[0] > a[1] for a in steps)
        chained = chained and all(a[1] == b[0] for a, b in pairwise(steps))
        if not chained:
            problems.append(f"expected changes that take 4 -> 1 once, audited {steps}")
        return problems


class ScheduleWindow(_ScalerWorld):
    POLICY = """
groups:
  - name: train-spot
    kind: asg
    schedules: [{name: day, cron: "0 8 * * *", timezone: UTC, duration_minutes: 600, min: 3, desired: 4}]
"""

    def __init__(self, tmp: Path) -> None:
        super().__init__(self.POLICY, tmp)

    def deliver(self, now: datetime) -> None:
        tick = {"gpufleet": "reconcile", "execution_id": "window-1", "scheduled_time": now.isoformat()}
        self.scaler.handle(tick, now)

    def violations(self) -> list[str]:
        got = self.desired()
        return ([f"desired {got}, expected the window's 4"] if got != 4 else []) + self.change_told_and_audited(
            "asg:train-spot"
        )


_SPOT_POLICY = """
defaults: {scale_out_cooldown_s: 60, scale_in_cooldown_s: 60}
groups: [{name: train-ondemand, kind: asg, target: {enabled: false}}]
spot:
  groups: [{group: asg:train-spot, fallback: {group: asg:train-ondemand, wait_minutes: 5}}]
"""


class _SpotWorld(_Fleet):
    def __init__(self, tmp: Path) -> None:
        super().__init__(_SPOT_POLICY, tmp)
        fleet.create_asg(self.clients, "train-ondemand", min_size=0, max_size=3, desired=0, tags=fleet.MANAGED_TAG)
        self.watch = warm(
            "spot_watch", self.env, lambda: build_spot_watch(_logger(), Metrics(namespace="Crash"), env=self.env)
        )

    def deliver(self, now: datetime) -> None:
        self.watch.handle({"gpufleet": "reconcile", "execution_id": "spot-1", "scheduled_time": now.isoformat()}, now)

    def later(self, now: datetime) -> None:
        self.watch.handle(
            {"gpufleet": "reconcile", "execution_id": f"spot-{now:%H%M}", "scheduled_time": now.isoformat()}, now
        )

    def owed(self) -> int:
        state = StateStore(self.clients.dynamodb, TABLE).load(["asg:train-ondemand"])["asg:train-ondemand"]
        return state.owed.get("asg:train-spot", 0)


class FallbackRaise(_SpotWorld):
    def __init__(self, tmp: Path, now: datetime, endpoint: str) -> None:
        super().__init__(tmp)
        before = set(self.instances())
        self.clients.autoscaling.set_desired_capacity(AutoScalingGroupName="train-spot", DesiredCapacity=5)
        fleet.hold_out_of_service(self.clients.autoscaling, "train-spot", sorted(set(self.instances()) - before))
        for minutes in (6, 1):
            fleet.inject_failed_launch(endpoint, "train-spot", now - timedelta(minutes=minutes), SPOT_FULL)

    def violations(self) -> list[str]:
        problems = self.change_told_and_audited("asg:train-ondemand")
        if (self.desired("train-ondemand"), self.owed()) != (3, 3):
            problems.append(f"fallback desired {self.desired('train-ondemand')}, owed {self.owed()}; expected 3 and 3")
        return problems


class FallbackHandBack(_SpotWorld):
    def __init__(self, tmp: Path, now: datetime) -> None:
        super().__init__(tmp)
        self.clients.autoscaling.set_desired_capacity(AutoScalingGroupName="train-ondemand", DesiredCapacity=2)
        idle = self.instances("train-ondemand")  # idle, as their publishers keep reporting
        self.put_gpus((iid, 0, 1, now - timedelta(minutes=minute)) for iid in idle for minute in range(-25, 4))
        self.clients.dynamodb.put_item(
            TableName=TABLE,
            Item={
                "pk": {"S": "GROUP#asg:train-ondemand"},
                "sk": {"S": "STATE"},
                "version": {"N": "1"},
                "owed#asg:train-spot": {"N": "2"},
            },
        )
        doc = json.dumps({"streak_started_at": (now - timedelta(minutes=30)).isoformat(), "fallback_added": 2})
        self.clients.dynamodb.put_item(
            TableName=TABLE,
            Item={"pk": {"S": "GROUP#asg:train-spot"}, "sk": {"S": "SPOT"}, "version": {"N": "1"}, "doc": {"S": doc}},
        )

    def violations(self) -> list[str]:
        problems = self.change_told_and_audited("asg:train-ondemand")
        if (self.desired("train-ondemand"), self.owed()) != (0, 0):
            problems.append(f"fallback desired {self.desired('train-ondemand')}, owed {self.owed()}; expected 0 and 0")
        return problems


class InterruptionReplacement(_Fleet):
    """A spot interruption warning for a busy node with pre-launch on: the replacement launches at once;
    [emulated] EC2 reclaims the node (Unhealthy) before the later runs, which give the extra back by
    taking the reclaimed node out with a decrement. Later runs are the scaler's tick and spot_watch's
    sweep, as each minute in production (either may finish a change a crash left)."""

    later_minutes = (6, 7, 20)
    POLICY = "spot: {interruptions: {on_interruption: prelaunch}}\n"

    def __init__(self, tmp: Path, now: datetime) -> None:
        super().__init__(self.POLICY, tmp, desired=2)
        self.doomed = self.instances()[0]
        self.put_gpus((self.doomed, 93, 70, now - timedelta(minutes=minute)) for minute in range(1, 4))
        self.watch = warm(
            "spot_watch", self.env, lambda: build_spot_watch(_logger(), Metrics(namespace="Crash"), env=self.env)
        )
        self.reclaimed = False

    def deliver(self, now: datetime) -> None:
        detail = {"instance-id": self.doomed, "instance-action": "terminate"}
        event = {
            "version": "0",
            "id": "interruption-1",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "time": now.isoformat(),
            "resources": [],
            "detail": detail,
        }
        self.watch.handle(event, now)

    def later(self, now: datetime) -> None:
        if not self.reclaimed:  # [emulated] EC2 takes the spot instance; Auto Scaling marks it Unhealthy
            with calls.unrecorded():
                self.clients.autoscaling.set_instance_health(InstanceId=self.doomed, HealthStatus="Unhealthy")
            self.reclaimed = True
        tick = {"gpufleet": "reconcile", "execution_id": f"tick-{now:%H%M}", "scheduled_time": now.isoformat()}
        try:
            self.watch.scaler.handle(tick, now)
        finally:
            self.watch.handle({**tick, "execution_id": f"sweep-{now:%H%M}"}, now)

    def violations(self) -> list[str]:
        problems = []
        state = StateStore(self.clients.dynamodb, TABLE).load(["asg:train-spot"])["asg:train-spot"]
        owed = state.owed.get(f"interrupted:{self.doomed}", 0)
        if (self.desired(), owed) != (2, 0) or self.doomed in self.instances():
            still = self.doomed in self.instances()
            problems.append(f"desired {self.desired()}, owed {owed}, reclaimed node still in the group: {still}")
        if state.intent is not None or state.outbox:
            problems.append(f"left unfinished (intent {state.intent is not None}, outbox {len(state.outbox)})")
        if not any(n.kind is NotificationKind.INTERRUPTION and self.doomed in n.title for n in self.queued()):
            problems.append("the interruption was never told")
        changes = [d for d in self.audited("asg:train-spot") if d.changes_capacity]
        if sorted(d.desired - d.current for d in changes) != [-1, 1]:
            problems.append(f"expected one +1 and one -1 change, audited {[d.reason for d in changes]}")
        return problems


class OomReplacement(_Fleet):
    later_minutes = (1, 2, 6, 20)  # the guard runs every minute; an XID stays in its 5-minute lookback
    POLICY = "guard: {health: {replace_unhealthy: true, max_replacements_per_hour: 1, min_healthy_percent: 50}}\n"

    def __init__(self, tmp: Path, now: datetime) -> None:
        super().__init__(self.POLICY, tmp, desired=3)
        self.sick = self.instances()[0]
        self._publish(self.sick, now, lost_gpu=1)
        self.guard = warm(
            "oom_guard", self.env, lambda: build_guard(_logger(), Metrics(namespace="Crash"), env=self.env)
        )
        self.guard._gpu_inventory = None  # a new fleet: no GPU list from the previous run

    def _publish(self, instance_id: str, now: datetime, lost_gpu: int) -> None:
        """Five minutes of the real publisher (adaptive detail, as deployed): a GPU falls off the bus."""
        backend = SimulatedBackend(gpus=2)
        identity = Identity(instance_id, "us-east-1", asg_name="train-spot")
        own = f"AROACRASH:{instance_id}"  # the instance profile's aws:userid: its faults confirmed in its own namespace
        pub = Publisher(backend, identity, Sender(self.clients.cloudwatch), detail=schema.DETAIL_ADAPTIVE, caller=own)
        pub.start(xid_thread=False)
        start = now - timedelta(minutes=5)
        for m in range(5):
            if m == 3:
                backend.lost.add(lost_gpu)
                pub.record_xid(lost_gpu, 79)
            simulate(pub, start + timedelta(minutes=m), 60, every_s=10)
            pub.close_windows(start + timedelta(minutes=m, seconds=59))

    def deliver(self, now: datetime) -> None:
        self.guard.handle({"gpufleet": "reconcile", "execution_id": "guard-1", "scheduled_time": now.isoformat()}, now)

    def later(self, now: datetime) -> None:
        self.guard.handle(
            {"gpufleet": "reconcile", "execution_id": f"guard-{now:%H%M}", "scheduled_time": now.isoformat()}, now
        )

    def violations(self) -> list[str]:
        g = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["train-spot"])[
            "AutoScalingGroups"
        ][0]
        unhealthy = sorted(i["InstanceId"] for i in g["Instances"] if i["HealthStatus"].upper() == "UNHEALTHY")
        problems = [] if unhealthy == [self.sick] else [f"unhealthy {unhealthy}, expected exactly {self.sick}"]
        critical = [
            n for n in self.queued() if n.severity is Severity.CRITICAL and n.kind is NotificationKind.GPU_HEALTH
        ]
        if not critical:
            problems.append("the CRITICAL GPU failure notification was lost")
        return problems


class NotifierPost(World):
    def __init__(self, tmp: Path, now: datetime, slack: Any) -> None:
        self.receiver, url = slack
        self.receiver.received.clear()
        clients = fleet.Clients.create(client)
        fleet.create_state_table(clients.dynamodb, TABLE)
        self.stack = fleet.create_notification_stack(slack_secret=url + "/services/T0/B0/crash", client=client)
        policy = tmp / "policy.yaml"
        policy.write_text(
            "notifications: {grouping: {group_wait_s: 0, group_interval_s: 0},\n"
            "                default_route: {slack: true, sns: true}}\n"
        )
        env = self.stack.env(TABLE, str(policy))
        self.notifier = warm("notifier", env, lambda: build_notifier(_logger(), Metrics(namespace="Crash"), env=env))
        self.notifier._silences = None
        self.body = note(
            NotificationKind.SCALING,
            Severity.CRITICAL,
            "asg:train-spot",
            "asg:train-spot: failed to scale 2 -> 3",
            at=now,
            source="crash",
            id_parts=("crash", "post"),
        ).model_dump_json()

    def deliver(self, now: datetime) -> None:
        self.notifier.handle_message(self.body, now)

    def later(self, now: datetime) -> None:
        self.notifier.sweep(now)

    def violations(self) -> list[str]:
        posts = Counter(json.dumps(r.payload.get("text")) for r in self.receiver.received)
        sns = fleet.drain(client("sqs"), self.stack.sns_inbox_url)
        problems = []
        if not posts or any(n > 2 for n in posts.values()):
            problems.append(f"Slack posts {dict(posts)}: expected one, a repeat at most once")
        if not 1 <= len(sns) <= 2:
            problems.append(f"SNS published {len(sns)} times: expected one, a repeat at most once")
        return problems
