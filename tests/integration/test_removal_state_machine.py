"""The removal path as a hypothesis state machine: never remove a node that runs work, by construction.

The model world is one group of a fake kind (`ModelPool`, registered through the group seam as
tests/integration/test_new_group_kind_moto.py's pool is) with 2-6 nodes. Per node the model keeps whether
it runs work right now, its scale-in protection and whether its GPUs are busy (published to CloudWatch as
the node publisher does, read by the core). Everything above the seam is real and runs on moto server: the
scaler's `handle` (a reconcile tick, an alarm's EventBridge delivery, Powertools idempotency), its reads
(the SQS queue the group's demand comes from, the instances' GPU metrics, the alarms still firing), the
pure core (`decide_reconcile`, `decide_alarm`: bounds and windows, demand, victims), the real `Executor`
(lease, intent, replay within the minute, decided again after it), the real `LastLook`, the real
`StateStore` and audit in DynamoDB. Only the group itself is the model's. (moto is affordable here: about
0.1 s a delivery, so the ci profile's 50 examples run in about a minute.)

Each step of the machine is one delivery - a reconcile tick, the pool's idle alarm changing state, or the
last event delivered again (Lambda's retry, SQS's redelivery) - at +0.3 s, +30 s or +1..12 min, after up
to three changes of the world since the last one: work landing on a node (placed by a scheduler, on a node
a failed removal named, or during the delivery after its decision read the nodes: a pod bound by
`spec.nodeName` to a victim, a job protecting itself), work ending, protection flipping, GPUs going busy or
idle, jobs arriving on or leaving the queue, launches landing, the policy's max lowered or raised, a
schedule window's max (open the first half of every hour). A delivery's removal call may fail before it
takes effect ("error"), after removing its first victim ("partial"), after its effect with its answer lost
("lost"), or kill the invocation inside the call after its effect ("died": nothing runs after it, its lease
and idempotency record stay) - the modes of tests/crash/harness.py, and the death it cannot inject.

The moment of truth is the last look: work may land between deliveries and between the decision and the
last look (the fake's `last_look` and `shrink` read the model's live state), but not between the last look
and the removal call - that is the remaining race (docs/scaler.md), which no read can close. A removal call
made without a last look lets what was armed to land after the read land right before the call.

Invariants, checked at every call that may remove nodes (inside the fake's `shrink`, and its `grow` where
the count goes down), before anything is removed:
1. no victim runs work or is protected in the model at that moment;
2. the group's count never drops below the instances it holds less the victims named: the provider never
   chooses which node goes;
3. desired never exceeds the effective max unless held above it, and while above it never grows: checked
   at every count change, and after every fresh decision that fixes the bounds (the excess is held by
   nodes that run work, are protected or read busy, or by jobs waiting on the queue).

The tests after the machine run its rules in a fixed order: a tick removes idle nodes (the machine is not
vacuous), the checker catches a last look that sees nothing, and what the machine found: a failed
scale-out replayed after max was lowered (fixed: decided again), and a launch that lands between the read
and a lowered count (fixed: the last look reads the group again for every change that lowers its count).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_lambda_powertools import Logger, Metrics
from botocore.exceptions import ClientError, ReadTimeoutError
from hypothesis import Phase, currently_in_test_context, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from gpufleet.aws.groups.provider import NotSupported
from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind, forget, new_kind
from gpufleet.domain.models import (
    Action,
    Decision,
    GroupObservation,
    GroupRef,
    InstanceObservation,
    Trigger,
    TriggerKind,
)
from gpufleet.domain.nodes import NodeShape
from gpufleet.policy.fleet import Discovery
from gpufleet.runtime import build_scaler
from gpufleet.scaling.service import Scaler
from gpufleet_node import schema
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import fleet
from tests.crash.harness import FUNCTION_TIMEOUT
from tests.integration.conftest import NOW, TABLE, decisions, sample, tick
from tests.profiles import examples

pytestmark = pytest.mark.integration

GROUP_MAX = 8  # the pool's own max
LOOKBACK = timedelta(seconds=defaults.DEFAULT_METRIC_LOOKBACK_S)
BUSY, IDLE = (95.0, 60.0), (0.0, 1.0)  # (GPU utilization, memory) a node publishes
DELAYS = (
    timedelta(seconds=0.3),
    timedelta(seconds=30),
    timedelta(minutes=1),
    timedelta(minutes=2),
    timedelta(minutes=6),
    timedelta(minutes=12),
)
FAULTS = ("error", "partial", "lost", "died")
PICK = st.integers(0, 5)
# What may change between two deliveries (or during the next one, "after the read"), as (what, argument).
Change = tuple[str, int | None]
CHANGES: st.SearchStrategy[Change] = st.one_of(
    st.tuples(st.sampled_from(["work lands", "work ends", "protection flips", "GPUs flip"]), PICK),
    st.tuples(st.sampled_from(["work lands on a node being removed", "a node being removed protects itself"]), PICK),
    st.tuples(
        st.sampled_from(
            [
                "work lands after the read",
                "work lands on a victim after the read",
                "a victim protects itself after the read",
            ]
        ),
        PICK,
    ),
    st.tuples(st.just("jobs arrive"), st.integers(1, 3)),
    st.tuples(st.sampled_from(["jobs done", "launches land"]), st.none()),
    st.tuples(st.just("policy max"), st.integers(0, GROUP_MAX)),
    st.tuples(st.just("window max"), st.none() | st.integers(0, GROUP_MAX)),
)
CHANGE_LISTS = st.lists(CHANGES, max_size=3)
ALARM_ARN = "arn:aws:cloudwatch:us-east-1:123456789012:alarm:"
WINDOW = {"name": "half-hours", "cron": "0 * * * *", "duration_minutes": 30}  # open hh:00-hh:30 UTC


_IDS = itertools.count(1)


def new_id() -> str:
    return f"i-model{next(_IDS):012d}"


def _note(text: str) -> None:
    """Said in a failing example's report; the fixed-order tests below run the rules outside hypothesis."""
    if currently_in_test_context():
        note(text)


def _event(text: str) -> None:
    if currently_in_test_context():
        event(text)


class InvocationDied(BaseException):
    """Lambda killed the invocation inside the call (timeout, out of memory): nothing after it runs, no
    handler catches it, the lease it holds stays until it expires."""


@dataclass
class Node:
    iid: str
    work: bool = False  # work is bound to it now (a pod, a job)
    protected: bool = False  # scale-in protection
    gpu_busy: bool = False
    busy_at: datetime | None = None  # the last busy datum it published

    @property
    def taken(self) -> bool:
        return self.work or self.protected

    def why(self) -> str:
        return "runs work" if self.work else "is protected from scale-in"


@dataclass(frozen=True)
class Landing:
    """Work that lands after the decision read the nodes, before the last look (or the call, if none)."""

    what: str  # "work" (a scheduler's pod, a pod with spec.nodeName), "protect" (a job protecting itself), "launch"
    on_victim: bool  # bound to a node being removed, else to any node
    pick: int


@dataclass
class World:
    """The model: the group's nodes and count, and what every removal call found."""

    name: str
    nodes: dict[str, Node]
    desired: int
    now: datetime
    policy_max: int
    window_max: int | None = None
    armed: list[Landing] = field(default_factory=list)
    fault: str | None = None
    fired: str | None = None
    removed: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    named: tuple[str, ...] = ()  # the victims the last removal call named (it may have failed)
    looks: int = 0

    def max_at(self, at: datetime) -> int:
        """The effective max as the model computes it: an open window's, else the policy's; never above the
        pool's own."""
        open_window = self.window_max is not None and at.minute < 30
        return min(GROUP_MAX, self.window_max if open_window and self.window_max is not None else self.policy_max)

    def land_launches(self) -> None:
        """Launches armed to come up after the decision's read come up now (a group read sees them)."""
        launches = [a for a in self.armed if a.what == "launch"]
        self.armed = [a for a in self.armed if a.what != "launch"]
        for _ in launches:
            if len(self.nodes) < self.desired:
                iid = new_id()
                self.nodes[iid] = Node(iid)
                self.calls.append(f"launch landed: {iid}")

    def land_armed(self, victims: Sequence[str]) -> None:
        """What was armed to land after the decision's read lands now."""
        self.land_launches()  # a launch still owed comes up
        for landing in self.armed:
            pool = [v for v in victims if v in self.nodes] if landing.on_victim else []
            pool = pool or list(self.nodes)
            if not pool:
                continue
            node = self.nodes[pool[landing.pick % len(pool)]]
            if landing.what == "work":
                node.work = True
            else:
                node.protected = True
            self.calls.append(f"{landing.what} landed on {node.iid}")
        self.armed = []

    def removal_call(self, what: str, decision: Decision, victims: Sequence[str]) -> None:
        """The invariants at a call that may remove nodes, before it removes anything."""
        self.land_armed(victims)  # no look was made since the read: the work lands right before the call
        named = [v for v in victims if v in self.nodes]
        for v in named:
            if self.nodes[v].taken:
                self.violations.append(f"{what} removes {v}, which {self.nodes[v].why()}")
        floor = len(self.nodes) - len(named)
        if decision.desired < floor:
            self.violations.append(
                f"{what} sets the count to {decision.desired}, below the {len(self.nodes)} instances held less "
                f"the {len(named)} named: the provider chooses {floor - decision.desired} node(s)"
            )
        self.count_check(what, decision.desired)

    def count_check(self, what: str, desired: int) -> None:
        top = self.max_at(self.now)
        if desired > top and desired > self.desired:
            self.violations.append(f"{what} raises the count {self.desired} -> {desired}, above max {top}")

    def set_count(self, desired: int) -> None:
        """The provider's own answer to a count below what it holds: it chooses (the newest go first)."""
        while len(self.nodes) > desired:
            iid = list(self.nodes)[-1]
            del self.nodes[iid]
            self.removed.append(iid)
        self.desired = desired

    def take_fault(self) -> str | None:
        fault, self.fault = self.fault, None
        if fault is not None:
            self.fired = fault
        return fault


def _fail_before(fault: str | None, operation: str) -> None:
    if fault == "error":
        raise ClientError({"Error": {"Code": "InternalFailure", "Message": "injected"}}, operation)


def _fail_after(fault: str | None, operation: str) -> None:
    if fault == "lost":
        raise ReadTimeoutError(endpoint_url=f"injected-after-effect:{operation}")
    if fault == "died":
        raise InvocationDied(operation)


@dataclass
class ModelPool:
    """The fake kind's adapter: the model's group, read and changed where the model says (its live state)."""

    kind_word: GroupKind
    world: World | None = None
    blind: bool = False  # a broken last look that sees nothing (the checker's own test)
    # A scale-out's call fails too (its replay must keep the bounds as well: a max lowered since re-decides it).
    scale_out_faults: bool = True

    @property
    def kind(self) -> GroupKind:
        return self.kind_word

    def _world(self) -> World:
        assert self.world is not None, "no model world"
        return self.world

    def _observation(self, ref: GroupRef) -> GroupObservation:
        w = self._world()
        return GroupObservation(
            ref=ref,
            min_size=0,
            max_size=GROUP_MAX,
            desired=w.desired,
            instances=tuple(
                InstanceObservation(instance_id=n.iid, instance_type="p5.48xlarge", protected_from_scale_in=n.protected)
                for n in w.nodes.values()
            ),
            instance_types=("p5.48xlarge",),
            tags={defaults.TAG_MANAGED: defaults.TAG_MANAGED_VALUE},
        )

    def observe(
        self, discovery: Discovery, named: Sequence[GroupRef], attrition: Collection[str]
    ) -> list[GroupObservation]:
        return [self._observation(ref) for ref in named if self.world is not None and ref.name == self.world.name]

    def observe_one(self, ref: GroupRef) -> GroupObservation | None:
        """The group read now: a launch armed to come up after the decision's read has come up by then."""
        if self.world is None or ref.name != self.world.name:
            return None
        self.world.land_launches()
        return self._observation(ref)

    def every_group(self) -> list[GroupObservation]:
        return []

    def work_marks(
        self, observations: Sequence[GroupObservation], now: datetime, candidates: Mapping[str, Collection[str]] | None
    ) -> list[GroupObservation]:
        """What the kind knows of which nodes run work, read now (the decision's read)."""
        w = self._world()
        out = []
        for obs in observations:
            marked = tuple(
                i.model_copy(update={"runs_work": i.instance_id in w.nodes and w.nodes[i.instance_id].work})
                for i in obs.instances
            )
            out.append(obs.model_copy(update={"instances": marked}))
        return out

    def prepare(self, obs: GroupObservation) -> None:
        pass

    def grow(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        """Set the count (a lower count than the nodes held: the provider chooses which go)."""
        w = self._world()
        w.calls.append(f"set count {w.desired} -> {decision.desired}")
        fault = w.take_fault() if decision.desired < w.desired or self.scale_out_faults else None
        _fail_before("error" if fault == "partial" else fault, "SetCount")
        if decision.desired < w.desired:
            w.removal_call("set count", decision, ())
            w.set_count(decision.desired)
        else:
            w.count_check("set count", decision.desired)
            w.desired = decision.desired
        _fail_after(fault, "SetCount")
        return f"count {decision.desired}"

    def last_look(self, obs: GroupObservation, victims: Sequence[str]) -> dict[str, str]:
        """The moment of truth: what lands after the read has landed by now; the model's live state."""
        w = self._world()
        w.land_armed(victims)
        w.looks += 1
        w.calls.append(f"last look at {', '.join(victims)}")
        if self.blind:
            return {}
        return {v: w.nodes[v].why() for v in victims if v in w.nodes and w.nodes[v].taken}

    def shrink(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        w = self._world()
        w.calls.append(f"shrink by {', '.join(decision.victims) or 'none'} to {decision.desired}")
        w.named = decision.victims
        fault = w.take_fault()
        _fail_before(fault, "Shrink")
        w.removal_call("shrink", decision, decision.victims)
        gone = [v for v in decision.victims if v in w.nodes]
        for v in gone:
            del w.nodes[v]
            w.removed.append(v)
            w.desired -= 1  # terminated with the count decremented, one by one
            if fault == "partial":  # the first went, the call failed before the others
                raise ClientError({"Error": {"Code": "InternalFailure", "Message": "injected"}}, "Shrink")
        w.set_count(decision.desired)
        _fail_after(fault, "Shrink")
        return f"removed {', '.join(gone) or 'none'}"

    def replace_failed(self, obs: GroupObservation, instance_id: str) -> str:
        raise NotSupported("the model pool replaces its own nodes")

    def joined_cluster(self, obs: GroupObservation, named: str | None) -> tuple[str | None, str]:
        return None, "the model pool joins no EKS cluster"

    def node_shape(
        self, obs: GroupObservation, overrides: Mapping[str, str] | None, tell: Callable[[str], None] | None
    ) -> NodeShape:
        raise NotSupported("the model pool runs no pods")

    def gpus_per_node(self, obs: GroupObservation, type_gpus: Callable[[Sequence[str]], float | None]) -> float | None:
        return 8.0

    def metric_namespace(self, obs: GroupObservation, named: str) -> tuple[str | None, str]:
        return named, ""


@dataclass
class Bench:
    """What every example shares: moto server, the state table, one scaler (a warm container) and the
    fake kind registered on it."""

    scaler: Scaler
    pool: ModelPool
    policy_path: Path
    sqs: Any
    cloudwatch: Any
    dynamodb: Any
    examples: int = 0
    removed: int = 0
    deliveries: int = 0
    seconds: float = 0.0  # in the scaler's handle
    seen: Counter[str] = field(default_factory=Counter)  # what the deliveries did, over the whole run


def policy_text(w: World, queue_url: str, cooldown_s: int) -> str:
    window = ""
    if w.window_max is not None:
        window = f", schedules: [{{name: {WINDOW['name']}, cron: '{WINDOW['cron']}', duration_minutes: 30, "
        window += f"max: {w.window_max}}}]"
    return (
        "discovery: {enabled: false}\n"
        "groups:\n"
        f"  - {{kind: model-pool, name: {w.name}, min: 0, max: {w.policy_max}, scale_in_cooldown_s: {cooldown_s},\n"
        "     scale_out_cooldown_s: 0, target: {enabled: false}" + window + ",\n"
        f"     demand: {{sqs: {{queue_url: '{queue_url}', gpus_per_message: 8}}}}}}\n"
    )


def alarm_event(name: str, state: str, at: datetime) -> dict[str, Any]:
    """EventBridge's delivery of the pool's idle alarm changing state (taken as delivered: only AWS puts it)."""
    body = sample("scaler/eventbridge-alarm-asg-high.json")
    body["id"] = f"{name}-{state}-{at:%H%M%S%f}"
    body["time"] = f"{at:%Y-%m-%dT%H:%M:%SZ}"
    body["resources"] = [ALARM_ARN + name]
    detail = body["detail"]
    detail["alarmName"] = name
    detail["state"] = {"value": state, "reason": "model", "timestamp": f"{at:%Y-%m-%dT%H:%M:%S.000+0000}"}
    detail["configuration"]["metrics"][0]["metricStat"]["metric"] = {"namespace": "Jobs", "name": "IdleSlots"}
    return body


@dataclass
class Delivery:
    event: dict[str, Any]
    at: datetime  # when it was first delivered
    died: bool = False  # its invocation died: its idempotency record stays in progress


def expire_in_progress_idempotency(dynamodb: Any) -> None:
    """[emulated] as tests/crash/harness.py's namesake, on the scaler's idempotency records alone (a query,
    not a scan of a table every example adds to): a retry after the function's timeout gets through."""
    pages = dynamodb.get_paginator("query").paginate(
        TableName=TABLE,
        KeyConditionExpression="pk = :pk",
        FilterExpression="#status = :progress",
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={":pk": {"S": "IDEMPOTENCY#scaler"}, ":progress": {"S": "INPROGRESS"}},
    )
    for page in pages:
        for item in page.get("Items", []):
            dynamodb.delete_item(TableName=TABLE, Key={"pk": item["pk"], "sk": item["sk"]})


class RemovalMachine(RuleBasedStateMachine):
    """The removal path on moto (see the module's docstring): rules change the world and tick the real
    scaler; the fake's calls check the invariants as they are made."""

    bench: Bench  # set by the test before hypothesis builds the machine

    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None
        self.queue_url = ""
        self.alarm = ""
        self.alarm_firing = False
        self.cooldown_s = 0
        self.serial = 0
        self.waiting = 0  # jobs on the pool's queue
        self.last: Delivery | None = None
        self.out: list[dict[str, Any]] = []  # the group's decisions in the last delivery's answer

    # ---- the world ----

    @initialize(
        nodes=st.lists(st.sampled_from(["free", "free", "free", "work", "protected", "busy"]), min_size=2, max_size=6),
        policy_max=st.integers(0, GROUP_MAX),
        cooldown_s=st.sampled_from([0, 0, 120]),
    )
    def build(self, nodes: list[str], policy_max: int, cooldown_s: int) -> None:
        b = self.bench
        b.examples += 1
        name = f"pool-{b.examples}-{time.time_ns() % 10**9}"
        made = {}
        for what in nodes:
            iid = new_id()
            made[iid] = Node(iid, work=what == "work", protected=what == "protected", gpu_busy=what == "busy")
        self.world = World(name, made, desired=len(made), now=NOW, policy_max=policy_max)
        self.queue_url = b.sqs.create_queue(QueueName=f"{name}-jobs")["QueueUrl"]
        self.alarm = f"gpufleet-{name}-idle"
        b.cloudwatch.put_metric_alarm(
            AlarmName=self.alarm,
            Namespace="Jobs",
            MetricName="IdleSlots",
            Statistic="Average",
            Period=60,
            EvaluationPeriods=1,
            Threshold=1,
            ComparisonOperator="GreaterThanThreshold",
            Tags=[
                {"Key": defaults.TAG_ALARM_TARGET, "Value": f"model:{name}"},
                {"Key": defaults.TAG_ALARM_DIRECTION, "Value": "in"},
            ],
        )
        self.cooldown_s = cooldown_s
        b.pool.world = self.world
        self._write_policy()

    def teardown(self) -> None:
        if self.world is not None:  # what later examples would read again: the firing alarm, the queue
            self.bench.cloudwatch.delete_alarms(AlarmNames=[self.alarm])
            self.bench.sqs.delete_queue(QueueUrl=self.queue_url)
            self.bench.pool.world = None

    def _w(self) -> World:
        assert self.world is not None
        return self.world

    def _write_policy(self) -> None:
        self.bench.policy_path.write_text(policy_text(self._w(), self.queue_url, self.cooldown_s))

    def _node(self, pick: int) -> Node | None:
        nodes = list(self._w().nodes.values())
        return nodes[pick % len(nodes)] if nodes else None

    # ---- deliveries ----

    def _publish(self, at: datetime) -> None:
        """Each node's GPU datum for the seconds before the delivery, as its publisher writes it."""
        w = self._w()
        data = []
        for n in w.nodes.values():
            util, mem = BUSY if n.gpu_busy else IDLE
            if n.gpu_busy:
                n.busy_at = at
            dims = [{"Name": schema.DIM_INSTANCE_ID, "Value": n.iid}]
            stamp = at - timedelta(seconds=5)
            for metric, value in ((schema.GPU_UTILIZATION, util), (schema.GPU_MEMORY_USED_PERCENT, mem)):
                data.append({"MetricName": metric.name, "Dimensions": dims, "Value": value, "Timestamp": stamp})
        if data:
            self.bench.cloudwatch.put_metric_data(Namespace=schema.NAMESPACE, MetricData=data)

    def _deliver(self, event: dict[str, Any], delay: timedelta, fault: str | None, fresh: bool = True) -> None:
        """One invocation of the scaler at now + delay (a removal call in it fails as `fault` says)."""
        w, b = self._w(), self.bench
        w.now += delay
        w.fault, w.fired = fault, None
        self._publish(w.now)
        before = (w.desired, len(w.nodes), len(w.removed))
        b.deliveries += 1
        out: list[dict[str, Any]] = []
        started = time.perf_counter()
        try:
            out = decisions(b.scaler.handle(event, w.now))
        except InvocationDied:
            _note(f"{w.now:%H:%M:%S} the invocation died in the call")
            if self.last is not None and self.last.event is event:
                self.last.died = True
        except Exception as exc:  # an alarm whose change failed raises: Lambda delivers it again
            _note(f"{w.now:%H:%M:%S} the invocation failed: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            b.seconds += time.perf_counter() - started
            b.scaler.ctx.emf.clear_metrics()
        w.land_armed(())  # work armed for this invocation that found no look lands anyway
        w.fault = None
        removed = len(w.removed) - before[2]
        b.removed += removed
        if removed:
            _event("a delivery removed nodes")
        mine = self.out = [d for d in out if d["group"].endswith(w.name)]
        self._count(mine, removed)
        for d in mine:
            _note(f"{w.now:%H:%M:%S} {d['action']} {d['current']}->{d['desired']} {d['outcome']}: {d['reason']}")
        if fresh and fault is None:
            self._bounds_fixed(mine, before)

    def _count(self, mine: list[dict[str, Any]], removed: int) -> None:
        w, seen = self._w(), self.bench.seen
        seen["removed a node"] += removed > 0
        if w.fired is not None:
            seen[f"fault fired: {w.fired}"] += 1
        for d in mine:
            detail, reason = d.get("detail") or "", d["reason"]
            seen["replayed a change within the minute"] += detail.startswith("finished the change")
            seen["decided a stale change again"] += detail.startswith("decided again")
            seen["last look kept a victim"] += "last look kept" in reason
            seen["held above max by busy nodes"] += d.get("held_busy", 0) > 0 or "above it run work" in reason
            seen["skipped: lease held"] += d["outcome"] == "skipped-lease"
        seen["above max after"] += w.desired > w.max_at(w.now)

    def _bounds_fixed(self, mine: list[dict[str, Any]], before: tuple[int, int, int]) -> None:
        """Invariant 3's second half: after a fresh decision that fixed the bounds cleanly on a group with
        nothing owed, what is above the effective max is held there: by nodes that run work, are protected
        or read busy, or for jobs waiting on the queue (its runners take them there:
        `demand_share.split_backlog` holds the ready nodes that waiting messages will use)."""
        w = self._w()
        top = w.max_at(w.now)
        desired_before, listed_before, _ = before
        if w.desired <= top or listed_before != desired_before or len(mine) != 1:
            return
        d = mine[0]
        if d["outcome"] not in ("applied", "not-needed") or not str(d["trigger"]).startswith("bounds"):
            return
        if (d.get("detail") or "").startswith("finished the change") or d["reason"].startswith("advice only"):
            return
        horizon = w.now - LOOKBACK - timedelta(minutes=2)
        free = [
            n.iid
            for n in w.nodes.values()
            if not n.taken and not n.gpu_busy and (n.busy_at is None or n.busy_at < horizon)
        ]
        held = len(w.nodes) - len(free)  # nodes that run work, are protected or read busy
        assert w.desired - top <= held + self.waiting, (
            f"desired {w.desired} is above max {top} with only {held} node(s) busy and {self.waiting} job(s) "
            f"waiting (free: {free}) after: {d['reason']}"
        )

    # ---- the rules: each a delivery, after the world's changes since the last one ----

    def _changed(self, changes: Sequence[Change]) -> None:
        for what, arg in changes:
            self.change(what, arg)

    def _tick(self, delay: timedelta, fault: str | None) -> None:
        self.serial += 1
        w = self._w()
        event = tick(f"{w.name}-t{self.serial}", w.now + delay)
        self.last = Delivery(event, w.now + delay)
        self._deliver(event, delay, fault)

    @rule(changes=CHANGE_LISTS, delay=st.sampled_from(DELAYS))
    def reconcile(self, changes: list[Change], delay: timedelta) -> None:
        """A reconcile tick (+0.3 s or +30 s: another invocation within the minute, which replays a change left)."""
        self._changed(changes)
        self._tick(delay, None)

    @rule(changes=CHANGE_LISTS, delay=st.sampled_from(DELAYS), fault=st.sampled_from(FAULTS))
    def reconcile_with_a_failing_call(self, changes: list[Change], delay: timedelta, fault: str) -> None:
        self._changed(changes)
        self._tick(delay, fault)

    @rule(
        changes=CHANGE_LISTS,
        state=st.sampled_from(["ALARM", "ALARM", "OK"]),
        delay=st.sampled_from(DELAYS),
        fault=st.none() | st.sampled_from(FAULTS),
    )
    def idle_alarm(self, changes: list[Change], state: str, delay: timedelta, fault: str | None) -> None:
        """The pool's scale-in alarm changes state, delivered by EventBridge (`decide_alarm`); while it stays
        in ALARM each reconcile tick raises it again."""
        self._changed(changes)
        w = self._w()
        if (state == "ALARM") == self.alarm_firing:  # no change of state, nothing delivered: a tick instead
            self._tick(delay, fault)
            return
        self.bench.cloudwatch.set_alarm_state(AlarmName=self.alarm, StateValue=state, StateReason="model")
        self.alarm_firing = state == "ALARM"
        event = alarm_event(self.alarm, state, w.now + delay)
        self.last = Delivery(event, w.now + delay)
        self._deliver(event, delay, fault)

    @rule(changes=CHANGE_LISTS, delay=st.sampled_from(DELAYS))
    def delivered_again(self, changes: list[Change], delay: timedelta) -> None:
        """Lambda (or SQS) delivers the last event again: after a failure, or an invocation that died. Its
        idempotency record holds a retry off while the first attempt may still run (the function's 120 s
        timeout: emulated, as tests/crash/harness.py does, since that expiry follows the real clock)."""
        self._changed(changes)
        if self.last is None:
            self._tick(delay, None)
            return
        w = self._w()
        if self.last.died and w.now + delay - self.last.at > FUNCTION_TIMEOUT:
            expire_in_progress_idempotency(self.bench.dynamodb)
            self.last.died = False
        self._deliver(self.last.event, delay, None, fresh=False)  # an answer kept by idempotency is not new

    # ---- the world's changes ----

    def change(self, what: str, arg: int | None) -> None:
        """One change of the world between deliveries (`CHANGES` says which there are)."""
        w = self._w()
        pick = arg or 0
        if what in ("work lands after the read", "work lands on a victim after the read"):
            w.armed.append(Landing("work", on_victim="victim" in what, pick=pick))
        elif what == "a victim protects itself after the read":
            w.armed.append(Landing("protect", on_victim=True, pick=pick))
        elif what in ("work lands on a node being removed", "a node being removed protects itself"):
            self._on_a_node_being_removed("work" if what.startswith("work") else "protect", pick)
        elif what == "jobs arrive":
            entries = [{"Id": str(i), "MessageBody": "{}"} for i in range(pick)]
            self.bench.sqs.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            self.waiting += pick
        elif what == "jobs done":
            fleet.drain(self.bench.sqs, self.queue_url)
            self.waiting = 0
        elif what == "launches land":
            while len(w.nodes) < w.desired:
                iid = new_id()
                w.nodes[iid] = Node(iid)
        elif what in ("policy max", "window max"):
            if what == "policy max":
                w.policy_max = GROUP_MAX if arg is None else arg
            else:
                w.window_max = arg
            self._write_policy()
        else:
            self._on_a_node(what, pick)

    def _on_a_node(self, what: str, pick: int) -> None:
        """A scheduler places work, work ends, a job protects itself (or lets go), GPUs go busy or idle."""
        node = self._node(pick)
        if node is None:
            return
        if what == "work lands":
            node.work = True
        elif what == "work ends":
            node.work = False
        elif what == "protection flips":
            node.protected = not node.protected
        else:
            assert what == "GPUs flip", what
            node.gpu_busy = not node.gpu_busy

    def _on_a_node_being_removed(self, what: str, pick: int) -> None:
        """On a node the last removal call named and did not remove (it failed, or its invocation died):
        nothing closed it, so a scheduler may place work there, or a job protect itself."""
        w = self._w()
        left = [v for v in w.named if v in w.nodes] or list(w.nodes)
        if not left:
            return
        node = w.nodes[left[pick % len(left)]]
        if what == "work":
            node.work = True
        else:
            node.protected = True

    # ---- invariants ----

    @invariant()
    def no_removal_call_broke_a_rule(self) -> None:
        if self.world is not None:
            assert not self.world.violations, "; ".join(self.world.violations) + f" (calls: {self.world.calls[-6:]})"


@pytest.fixture
def bench(aws: str, tmp_path: Path) -> Iterator[Bench]:
    row = new_kind(
        "model-pool",
        key_prefix="model",
        label="model pool",
        in_cluster=False,
        cluster_dimension=None,
        name_dimension="ModelPoolName",
        in_asg=False,
        replaced_by_asg=False,
        demand_sources=frozenset({"sqs"}),
        knows_gpus_per_node=True,
        own_cluster_pods=False,
        closes_own_nodes=False,
        discoverable=False,
        has_own_max=False,
        console_path="/ec2/home?region={region}#Instances:tag:pool={name}",
        console_title="model pool",
    )
    try:
        clients = fleet.Clients.create()
        fleet.create_state_table(clients.dynamodb, TABLE)
        policy_path = tmp_path / "policy.yaml"
        policy_path.write_text("discovery: {enabled: false}\n")
        env = {
            defaults.ENV_STATE_TABLE: TABLE,
            defaults.ENV_POLICY_FILE: str(policy_path),
            defaults.ENV_ACCOUNT_ID: "123456789012",
        }
        quiet = Logger(service="test", level="CRITICAL")  # thousands of decisions a run: none read
        scaler, idem = build_scaler(quiet, Metrics(namespace="GPUFleet/Test"), env=env)
        idem.register_lambda_context(LocalLambdaContext("scaler"))  # type: ignore[arg-type]
        pool = ModelPool(row.kind)
        scaler.ctx.fleet.groups.register(pool)
        yield Bench(scaler, pool, policy_path, boto3.client("sqs"), clients.cloudwatch, clients.dynamodb)
    finally:
        forget(row.kind)


# 50 examples under ci (5 dev, 250 deep), each an initialize and 9 deliveries (with up to 3 changes before
# each): about a minute here under ci. No explain phase: it replays a failure hundreds of times on moto.
MACHINE = settings(
    max_examples=examples(50),
    stateful_step_count=10,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


def test_no_removal_takes_a_node_that_runs_work(bench: Bench) -> None:
    RemovalMachine.bench = bench
    run_state_machine_as_test(RemovalMachine, settings=MACHINE)
    print(
        f"{bench.examples} examples, {bench.deliveries} deliveries ({bench.seconds:.1f} s in the scaler), "
        f"{bench.removed} nodes removed; {dict(sorted(bench.seen.items()))}"
    )
    assert bench.removed > 0 or bench.examples < 20, "the machine removed no node in any example: it proves nothing"


# ---- the machine's rules in a fixed order: it removes nodes, and its checker catches what it must ----

MINUTE = timedelta(minutes=1)


def machine(bench: Bench, nodes: list[str], policy_max: int = GROUP_MAX) -> RemovalMachine:
    RemovalMachine.bench = bench
    m = RemovalMachine()
    m.build(nodes=nodes, policy_max=policy_max, cooldown_s=0)
    return m


def test_a_tick_removes_the_idle_nodes_by_name_and_only_those(bench: Bench) -> None:
    m = machine(bench, ["free", "work", "free", "protected", "busy"])
    w = m._w()
    idle = [iid for iid, n in w.nodes.items() if not n.taken and not n.gpu_busy]
    m.reconcile(changes=[], delay=MINUTE)
    m.no_removal_call_broke_a_rule()
    assert sorted(w.removed) == sorted(idle) and w.desired == 3, (w.removed, m.out)
    assert w.looks == 1  # the removal passed the last look
    m.teardown()


def test_work_that_lands_after_the_read_is_kept_by_the_last_look(bench: Bench) -> None:
    m = machine(bench, ["free", "free", "free"])
    w = m._w()
    m.reconcile(changes=[("work lands on a victim after the read", 1)], delay=MINUTE)
    m.no_removal_call_broke_a_rule()
    [kept] = w.nodes.values()
    assert kept.work and len(w.removed) == 2 and w.desired == 1, m.out
    assert "last look kept 1 victim(s)" in m.out[0]["reason"]
    m.teardown()


def test_a_failed_removal_replayed_within_the_minute_passes_the_last_look(bench: Bench) -> None:
    m = machine(bench, ["free", "free", "free"])
    w = m._w()
    m.reconcile_with_a_failing_call(changes=[], delay=MINUTE, fault="error")
    assert not w.removed and len(w.named) == 3 and m.out[0]["outcome"] == "failed"
    # Nothing closed the node the failed call named: work may land there before the next invocation.
    m.reconcile(changes=[("work lands on a node being removed", 0)], delay=timedelta(seconds=30))
    m.no_removal_call_broke_a_rule()
    assert m.out[0]["detail"].startswith("finished the change"), m.out
    [kept] = w.nodes.values()
    assert kept.work and len(w.removed) == 2 and w.desired == 1
    m.teardown()


def test_a_removal_older_than_a_tick_is_decided_again_not_replayed(bench: Bench) -> None:
    m = machine(bench, ["free", "free", "free"])
    w = m._w()
    m.reconcile_with_a_failing_call(changes=[], delay=MINUTE, fault="error")
    m.reconcile(changes=[("a node being removed protects itself", 2)], delay=timedelta(minutes=2))
    m.no_removal_call_broke_a_rule()
    assert m.out[0]["detail"].startswith("decided again, not replayed"), m.out
    [kept] = w.nodes.values()
    assert kept.protected and len(w.removed) == 2
    m.teardown()


def test_a_lost_answer_then_an_invocation_that_dies_repeat_nothing(bench: Bench) -> None:
    m = machine(bench, ["free", "free", "work"])
    w = m._w()
    m.reconcile_with_a_failing_call(changes=[], delay=MINUTE, fault="lost")  # removed, the answer lost
    assert len(w.removed) == 2 and m.out[0]["outcome"] == "failed"
    m.reconcile(changes=[("launches land", None)], delay=timedelta(seconds=0.3))  # replayed: nothing left
    m.no_removal_call_broke_a_rule()
    assert len(w.removed) == 2 and w.desired == 1, m.out
    m.idle_alarm(changes=[("work ends", 0)], state="ALARM", delay=MINUTE, fault="died")  # the alarm's step
    assert len(w.removed) == 3 and w.desired == 0 and not m.out  # it died in the call, after its effect
    m.delivered_again(changes=[], delay=timedelta(seconds=30))  # its first attempt may still run
    assert not m.out
    m.delivered_again(changes=[("jobs arrive", 1)], delay=timedelta(minutes=3))  # its own lease taken over
    m.no_removal_call_broke_a_rule()
    assert m.out and m.out[0]["detail"].startswith("decided again, not replayed"), m.out
    m.teardown()


def test_max_lowered_under_busy_nodes_removes_idle_ones_by_name_and_holds_the_rest(bench: Bench) -> None:
    m = machine(bench, ["work", "free", "protected", "free"])
    w = m._w()
    worker = next(iid for iid, n in w.nodes.items() if n.work)
    m.reconcile(changes=[("policy max", 1)], delay=MINUTE)
    m.no_removal_call_broke_a_rule()
    assert w.desired == 2 and all(n.taken for n in w.nodes.values()), m.out  # held above max by busy nodes
    m.reconcile(changes=[], delay=MINUTE)
    assert w.desired == 2, m.out  # and never grown there
    m.reconcile(changes=[("work ends", list(w.nodes).index(worker))], delay=MINUTE)
    m.no_removal_call_broke_a_rule()
    assert w.desired == 1 and worker in w.removed, m.out
    m.teardown()


def test_the_checker_catches_a_last_look_that_sees_nothing(bench: Bench) -> None:
    """The machine cannot pass vacuously: with a look that returns {}, work landed after the read is
    removed, and the invariant says so."""
    bench.pool.blind = True
    m = machine(bench, ["free", "free"])
    m.reconcile(changes=[("work lands on a victim after the read", 0)], delay=MINUTE)
    with pytest.raises(AssertionError, match=r"shrink removes i-model[0-9]+, which runs work"):
        m.no_removal_call_broke_a_rule()
    m.teardown()


def _decision(current: int, desired: int, victims: tuple[str, ...] = ()) -> Decision:
    return Decision(
        group="model:p",
        action=Action.SCALE_IN if victims else Action.SET_DESIRED,
        current=current,
        desired=desired,
        victims=victims,
        reason="test",
        trigger=Trigger(kind=TriggerKind.BOUNDS, name="policy bounds"),
        event_id="e",
        at=NOW,
    )


def test_the_checker_catches_a_count_the_provider_would_choose_from() -> None:
    nodes = {iid: Node(iid) for iid in ("i-a", "i-b", "i-c")}
    w = World("p", nodes, desired=3, now=NOW, policy_max=1)
    w.removal_call("shrink", _decision(3, 1, ("i-a", "i-b")), ("i-a", "i-b"))  # named: fine
    assert not w.violations
    w.removal_call("shrink", _decision(3, 1, ("i-a",)), ("i-a",))
    w.removal_call("set count", _decision(3, 1), ())
    assert [v.split(":")[0] for v in w.violations] == [
        "shrink sets the count to 1, below the 3 instances held less the 1 named",
        "set count sets the count to 1, below the 3 instances held less the 0 named",
    ]
    w.nodes["i-c"].work = True
    w.removal_call("shrink", _decision(3, 2, ("i-c",)), ("i-c",))
    assert w.violations[-1] == "shrink removes i-c, which runs work"
    w.desired = 1
    w.count_check("set count", 2)  # max 1: a count raised above it
    assert w.violations[-1] == "set count raises the count 1 -> 2, above max 1"


def test_a_launch_that_lands_between_the_read_and_a_lowered_count_is_not_the_providers_to_choose(
    bench: Bench,
) -> None:
    """Found by the machine: the count rule was kept on the decision's read, so a launch still owed that
    came up before a count-lowering call left the provider a node to choose. Fixed in `LastLook`."""
    m = machine(bench, ["free", "free"])
    w = m._w()
    m.reconcile(changes=[("jobs arrive", 3), ("jobs arrive", 1)], delay=MINUTE)
    assert w.desired == 4 and len(w.nodes) == 2, m.out  # two jobs fit the idle nodes, two ask for new ones
    w.armed.append(Landing("launch", on_victim=False, pick=0))  # one comes up after the next read
    m.reconcile(changes=[("policy max", 2)], delay=MINUTE)  # the launches still owed cancelled, 4 -> 2
    m.teardown()
    m.no_removal_call_broke_a_rule()
    assert "launch landed" in " ".join(w.calls) and w.desired == 3, w.calls  # seen by the look: held at 3


def test_a_failed_scale_out_replayed_after_max_was_lowered_stays_within_it(bench: Bench) -> None:
    """Found by the machine: a replay within the minute grew the group above a max lowered since. A raise
    the fresh decision's max no longer allows is decided again (`Executor.resume`)."""
    bench.pool.scale_out_faults = True
    m = machine(bench, ["free", "free"])
    w = m._w()
    m.reconcile_with_a_failing_call(changes=[("jobs arrive", 3), ("jobs arrive", 1)], delay=MINUTE, fault="error")
    assert w.desired == 2 and m.out[0]["action"] == "scale-out" and m.out[0]["outcome"] == "failed", m.out
    m.reconcile(changes=[("policy max", 2)], delay=timedelta(seconds=30))  # replayed: 2 -> 4, above max 2
    m.teardown()
    m.no_removal_call_broke_a_rule()
