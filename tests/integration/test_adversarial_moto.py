"""Adversarial inputs through the scaler's and spot_watch's handlers on moto server (issue 22).

hypothesis feeds any text - lone surrogates, control characters, four-byte characters, 300 characters
(over 1,024 bytes in UTF-8) - as alarm names, group names (an alarm's AutoScalingGroupName, ClusterName
and NodegroupName dimensions), event ids, EventBridge Scheduler execution ids and a launch failure's
fields, through each function's `handle(event, now)` as its `lambda_handler` calls it (in-process, on the
real boto3 clients against moto server). Per example:

1. the handler returns, or raises the documented one-line rejection (`InvalidEvent`, `UnsupportedEvent`
   among them) having changed nothing; anything else is a crash and fails the example;
2. nothing acts twice: the same event is delivered twice, and an alarm's state change also through the
   other two paths (EventBridge, the alarm action, SNS) with cooldowns of 0; each group's desired
   capacity moves at most one step (spot_watch: the second delivery moves nothing) and stays in bounds;
3. the next tick still succeeds: a reconcile tick with a fresh execution id (and spot_watch's own
   schedule tick) returns with no failed decision.

The world (moto's groups and alarms, the state table) is built once per test; each example starts from
it again: the state table is emptied, capacities restored, what the example created deleted.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import boto3
import pytest
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig
from botocore.exceptions import ClientError, ParamValidationError
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from gpufleet.aws.audit import AuditLog
from gpufleet.capacity.service import SpotWatch
from gpufleet.domain.errors import InvalidEvent
from gpufleet.domain.models import Outcome
from gpufleet.events.queue import InvalidMessage, parse_message
from gpufleet.runtime import build_scaler, build_spot_watch
from gpufleet.scaling.service import Scaler
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import fleet
from tests.integration.conftest import NOW, TABLE, Fleet, decisions, sample, tick
from tests.integration.test_spot_watch_moto import SPOT_FULL, spot_outage
from tests.profiles import examples

pytestmark = pytest.mark.integration

STAMP = NOW - timedelta(seconds=30)  # when the alarm changed state / the launch failed
ACCOUNT, REGION = "123456789012", "us-east-1"
ALARM_ARN = f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:"
FIXTURE_ALARMS = {"gpufleet-train-gpu-high", "gpufleet-train-gpu-low", "gpufleet-infer-gpu-high"}
# Cooldowns of 0: a second action would not be held by a cooldown, only by the change being the same.
SCALER_POLICY = """
defaults: {scale_out_step: 1, scale_in_step: 1, scale_out_cooldown_s: 0, scale_in_cooldown_s: 0}
alarms:
  - {alarm: "gpufleet-*", direction: out}
"""
SPOT_POLICY = """
defaults: {scale_out_cooldown_s: 0, scale_in_cooldown_s: 0}
spot:
  groups:
    - group: asg:train-spot
      fallback: {group: asg:train-ondemand, wait_minutes: 0}
"""
TRAIN_SPOT = {"AutoScalingGroupName": "train-spot"}
BOUNDS = {"asg:train-spot": (1, 8), "eks:ml/infer-gpu": (1, 5), "asg:train-ondemand": (0, 3)}
MADE_BOUNDS = (0, 3)  # an ASG an example creates under a fuzzed name (desired 1)
SPOT_DESIRED, SPOT_HELD, ONDEMAND_MAX = 5, 3, 3

# The world is built once per test (function-scoped fixtures) and reset by each example; no explain
# phase (it replays a failure hundreds of times on moto: minutes, where the shrunk input says enough).
ADVERSARIAL: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture],
    "phases": [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
}

# ---- any text ----

ANY_CHAR = st.characters(codec=None, categories=None)  # every category, lone surrogates (Cs) included
AWS_CHAR = st.characters(codec="utf-8", exclude_categories=("Cc", "Cs"), exclude_characters="\ufffe\uffff")
FOUR_BYTE = st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF)
LONE_SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


def texts(chars: st.SearchStrategy[str], longest: int, shortest: int = 0) -> st.SearchStrategy[str]:
    """Short text, long text and long four-byte text (up to `longest` characters, four bytes each)."""
    return st.one_of(
        st.text(chars, min_size=shortest, max_size=30),
        st.text(chars, min_size=longest - 60, max_size=longest),
        st.text(FOUR_BYTE, min_size=longest - 60, max_size=longest),
    )


def pick(*strategies: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """One of `strategies`, each as likely (st.one_of flattens nested choices: their branches would count)."""
    return st.sampled_from(strategies).flatmap(lambda chosen: chosen)


def mostly(valid: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Three in four draws from `valid`, else any text: most examples get past the parser with their
    odd but valid text, and many still try what it must refuse."""
    return pick(valid, valid, valid, ANY_TEXT)


# Any text: control characters, lone surrogates, 300 four-byte characters (1,200 bytes).
ANY_TEXT = st.one_of(
    texts(ANY_CHAR, 300),
    st.builds(lambda a, s, b: a + s + b, st.text(ANY_CHAR, max_size=8), LONE_SURROGATE, st.text(ANY_CHAR, max_size=8)),
)
# Text AWS takes in a name, as long as it allows ("gpufleet-" and 246 four-byte characters: 993 bytes).
NAME_TEXT = texts(AWS_CHAR, 246, shortest=1)
PREFIX = "gpufleet-"
ALARM_NAMES = mostly(st.builds(PREFIX.__add__, NAME_TEXT))
# The defects this suite guards, as explicit examples: keys from these were over DynamoDB's 1,024 bytes.
LONG_NAME = PREFIX + "\U0001d518" * 246  # 255 characters, 993 bytes: its alarm-action event id is 1,070
LONG_ID = "\U0001d518" * 256  # the longest event id an envelope takes: 1,024 bytes


def storable(text: str) -> bool:
    """Text AWS can be sent at all (boto3 encodes requests as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def aws_takes(name: str, max_chars: int = 255) -> bool:
    """A name AWS accepts for a resource it creates (1-255 of the characters XML can carry): moto creates
    any, then writes XML no client can read."""
    return 0 < len(name) <= max_chars and storable(name) and all(_xml_char(ord(ch)) for ch in name)


def _xml_char(code: int) -> bool:
    return code in (0x9, 0xA, 0xD) or 0x20 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or code >= 0x10000


# ---- invoking the handlers ----


def deliver(handle: Callable[[Any, datetime], dict[str, Any]], event: Any, now: datetime) -> dict[str, Any] | None:
    """One invocation: the handler's result, or None for the documented rejection. Any other exception
    is a crash and propagates (hypothesis reports it with the shrunk input)."""
    try:
        return handle(event, now)
    except InvalidEvent as exc:  # UnsupportedEvent is one
        rejection = str(exc)
    assert "\n" not in rejection, "a rejection is one line"
    return None


def clear_table(dynamodb: Any) -> None:
    """Every item of the state table deleted: the next example starts with no state, audit or records."""
    pages = dynamodb.get_paginator("scan").paginate(TableName=TABLE, ProjectionExpression="pk, sk")
    keys = [{"pk": i["pk"], "sk": i["sk"]} for page in pages for i in page["Items"]]
    for start in range(0, len(keys), 25):
        batch = [{"DeleteRequest": {"Key": k}} for k in keys[start : start + 25]]
        dynamodb.batch_write_item(RequestItems={TABLE: batch})


@dataclass(repr=False)
class World:
    """The scaler (and spot_watch) as their Lambda containers hold them: built once, warm across examples,
    telling a notification queue whose messages must all be notifications the notifier takes."""

    fleet: Fleet
    scaler: Scaler
    idempotency: IdempotencyConfig
    queue: str
    watch: SpotWatch | None = None
    ticks: Iterator[int] = field(default_factory=itertools.count)
    cleanups: list[Callable[[], Any]] = field(default_factory=list)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis prints it with a failing example
        printer.text("World(...)")

    @classmethod
    def build(cls, gpu_fleet: Fleet, policy: str) -> World:
        gpu_fleet.policy_path.write_text(policy)
        queue = boto3.client("sqs").create_queue(QueueName="gpufleet-notify")["QueueUrl"]
        logger, metrics = Logger(service="test"), Metrics(namespace="GPUFleet/Test")
        scaler, config = build_scaler(logger, metrics, env=gpu_fleet.env(notify_queue=queue))
        return cls(gpu_fleet, scaler, config, queue)

    def scale(self, event: Any, now: datetime = NOW) -> dict[str, Any] | None:
        """What the scaler's lambda_handler does per invocation: register the context, handle."""
        self.idempotency.register_lambda_context(LocalLambdaContext("scaler"))  # type: ignore[arg-type]
        return deliver(self.scaler.handle, event, now)

    def next_tick_succeeds(self) -> None:
        """A reconcile tick with a fresh execution id returns, and no group's decision failed."""
        reconcile = tick(f"adversarial-next-{next(self.ticks)}", NOW + timedelta(minutes=1))
        self.idempotency.register_lambda_context(LocalLambdaContext("scaler"))  # type: ignore[arg-type]
        result = self.scaler.handle(reconcile, NOW + timedelta(minutes=1))  # no rejection expected either
        failed = [(d["group"], d["detail"]) for d in decisions(result) if d["outcome"] == Outcome.FAILED]
        assert failed == [], "the next reconcile tick failed"
        self.told_only_notifications()

    def told_only_notifications(self) -> None:
        """Whatever was queued for on-call is a notification the notifier accepts (not a DLQ entry)."""
        for message in fleet.drain(boto3.client("sqs"), self.queue):
            try:
                parse_message(message["Body"])
            except InvalidMessage as exc:
                pytest.fail(f"queued a message the notifier rejects: {exc}")

    def reset(self, capacities: dict[str, int]) -> None:
        """Back to the world as built: no state, the capacities it started with, nothing queued."""
        clear_table(self.fleet.clients.dynamodb)
        for asg, desired in capacities.items():
            self.fleet.clients.autoscaling.set_desired_capacity(AutoScalingGroupName=asg, DesiredCapacity=desired)
        fleet.drain(boto3.client("sqs"), self.queue)

    def undo(self) -> None:
        """Delete what the example created (its alarm, its group)."""
        while self.cleanups:
            self.cleanups.pop()()


def applied_once_at_most(world: World, group_keys: list[str]) -> None:
    """The audit holds at most one applied change per group for everything delivered."""
    audit = AuditLog(world.fleet.clients.dynamodb, TABLE)
    for key in group_keys:
        applied = [d.event_id for d in audit.recent(key) if d.outcome is Outcome.APPLIED]
        assert len(applied) <= 1, f"{key} changed by {len(applied)} decisions: {applied}"


# ---- alarms: names and group dimensions, three delivery paths ----


@dataclass(frozen=True)
class Change:
    """One alarm state change, as any of its three deliveries would carry it."""

    alarm: str
    state: str
    dims: dict[str, str]
    event_id: str
    stamp: datetime = STAMP  # when CloudWatch changed its state: what every path carries

    @property
    def group_key(self) -> str | None:
        """The group its dimensions name (as `scaling.targets` reads them), or None."""
        if self.dims.get("ClusterName") and self.dims.get("NodegroupName"):
            return f"eks:{self.dims['ClusterName']}/{self.dims['NodegroupName']}"
        name = self.dims.get("AutoScalingGroupName")
        return f"asg:{name}" if name else None


def eventbridge_alarm(c: Change) -> dict[str, Any]:
    body = sample("scaler/eventbridge-alarm-asg-high.json")
    body.update(id=c.event_id, resources=[ALARM_ARN + c.alarm])
    body["detail"]["alarmName"] = c.alarm
    body["detail"]["state"].update(value=c.state, timestamp=c.stamp.isoformat())
    body["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = dict(c.dims)
    return body


def alarm_action(c: Change) -> dict[str, Any]:
    body = sample("scaler/alarm-action-asg-low.json")
    body["alarmArn"] = ALARM_ARN + c.alarm
    body["alarmData"]["alarmName"] = c.alarm
    body["alarmData"]["state"].update(value=c.state, timestamp=c.stamp.isoformat())
    body["alarmData"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = dict(c.dims)
    return body


def sns_alarm(c: Change) -> dict[str, Any]:
    body = sample("scaler/sns-alarm-eks-high.json")
    sns = body["Records"][0]["Sns"]
    message = json.loads(sns["Message"])
    message.update(
        AlarmName=c.alarm,
        AlarmArn=ALARM_ARN + c.alarm,
        NewStateValue=c.state,
        StateChangeTime=c.stamp.isoformat(),
    )
    message["Trigger"]["Dimensions"] = [{"name": k, "value": v} for k, v in c.dims.items()]
    sns.update(MessageId=c.event_id, Subject=f'{c.state}: "{c.alarm}"', Message=json.dumps(message))
    return body


PATHS: dict[str, Callable[[Change], dict[str, Any]]] = {
    "eventbridge": eventbridge_alarm,
    "alarm-action": alarm_action,
    "sns": sns_alarm,
}


@dataclass(frozen=True)
class Target:
    dims: dict[str, str]
    made: bool = False  # create a managed ASG of this name first (where AWS takes the name)


MADE = st.builds(lambda n: Target({"AutoScalingGroupName": n}, made=True), NAME_TEXT)
TARGETS = pick(
    st.just(Target(TRAIN_SPOT)),
    st.just(Target({"ClusterName": "ml", "NodegroupName": "infer-gpu"})),
    MADE,
    MADE,
    st.builds(lambda n: Target({"AutoScalingGroupName": n}), ANY_TEXT),
    st.builds(
        lambda c, n: Target({"ClusterName": c, "NodegroupName": n}), st.one_of(st.just("ml"), ANY_TEXT), ANY_TEXT
    ),
)


def make_asg(world: World, name: str) -> bool:
    """A managed ASG named `name` (min 0, desired 1, max 3), if moto takes the name; deleted after."""
    if not aws_takes(name) or name in ("train-spot", world.fleet.backing_asg):
        return False
    autoscaling = world.fleet.clients.autoscaling
    try:
        fleet.create_asg(world.fleet.clients, name, min_size=0, max_size=3, desired=1, tags=fleet.MANAGED_TAG)
    except (ClientError, ParamValidationError):
        return False
    world.cleanups.append(lambda: autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True))
    return True


def make_alarm(world: World, c: Change) -> bool:
    """The alarm in CloudWatch (tagged direction out, in the delivered state), for the SNS and alarm-action
    paths to find when they re-read it; where CloudWatch would take its name and dimensions."""
    names = [c.alarm, *c.dims, *c.dims.values()]
    if c.alarm in FIXTURE_ALARMS or not all(aws_takes(n) for n in names):
        return False
    cw = world.fleet.clients.cloudwatch
    try:
        fleet.put_gpu_alarm(cw, c.alarm, c.dims, direction="out", threshold=50, evaluation_periods=1)
    except (ClientError, ParamValidationError):
        return False
    world.cleanups.append(lambda: cw.delete_alarms(AlarmNames=[c.alarm]))
    try:
        cw.set_alarm_state(AlarmName=c.alarm, StateValue=c.state, StateReason="adversarial")
    except (ClientError, ParamValidationError):
        return False
    return True


def capacities(world: World, made: str | None) -> dict[str, int]:
    found = {"asg:train-spot": world.fleet.desired(), "eks:ml/infer-gpu": world.fleet.nodegroup_desired()}
    if made is not None:
        found[f"asg:{made}"] = world.fleet.desired(made)
    return found


def within_one_step(before: dict[str, int], after: dict[str, int]) -> None:
    for key, was in before.items():
        low, high = BOUNDS.get(key, MADE_BOUNDS)
        assert abs(after[key] - was) <= 1, f"{key} moved {was} -> {after[key]}: more than one step"
        assert low <= after[key] <= high, f"{key} left its bounds: {after[key]} not in [{low}, {high}]"


@pytest.fixture
def alarm_world(gpu_fleet: Fleet) -> World:
    return World.build(gpu_fleet, SCALER_POLICY)


@settings(max_examples=examples(80), **ADVERSARIAL)
@given(
    alarm=ALARM_NAMES,
    state=st.sampled_from(["ALARM", "ALARM", "ALARM", "OK"]),
    target=TARGETS,
    event_id=mostly(NAME_TEXT),
    order=st.permutations(list(PATHS)),
)
@example(alarm=LONG_NAME, state="ALARM", target=Target(TRAIN_SPOT), event_id=LONG_ID, order=list(PATHS))
@example(  # a node group name EKS cannot route (moto answers 404): not found, not a crash
    alarm=PREFIX + "0",
    state="ALARM",
    target=Target({"ClusterName": "ml", "NodegroupName": "/"}),
    event_id="0",
    order=list(PATHS),
)
@example(
    alarm=PREFIX + "x",
    state="ALARM",
    target=Target({"AutoScalingGroupName": "\U0001d518" * 255}, made=True),  # 1,020 bytes
    event_id="e",
    order=["alarm-action", "eventbridge", "sns"],
)
def test_any_alarm_name_and_group_acts_once_and_the_next_tick_succeeds(
    alarm_world: World, alarm: str, state: str, target: Target, event_id: str, order: list[str]
) -> None:
    world = alarm_world
    world.reset({"train-spot": 2})
    world.fleet.clients.eks.update_nodegroup_config(
        clusterName="ml", nodegroupName="infer-gpu", scalingConfig={"desiredSize": 2}
    )
    change = Change(alarm, state, target.dims, event_id)
    try:
        acts_once_then_ticks(world, change, target, order)
    finally:
        world.undo()


def acts_once_then_ticks(world: World, change: Change, target: Target, order: list[str]) -> None:
    name = target.dims.get("AutoScalingGroupName", "")
    made = name if target.made and make_asg(world, name) else None
    in_cloudwatch = make_alarm(world, change)
    event(f"alarm in CloudWatch: {in_cloudwatch}, group created: {made is not None}")
    if in_cloudwatch:  # every path carries CloudWatch's own time of the change, as on AWS
        change = dataclasses.replace(change, stamp=world.fleet.changed_at(change.alarm))
    before = capacities(world, made)
    # The first path's event twice (at-least-once delivery), then the same change by the other two.
    results = [world.scale(PATHS[path](change), NOW + timedelta(seconds=i)) for i, path in enumerate(order[:1] + order)]
    after = capacities(world, made)
    for path, result in zip(order[:1] + order, results, strict=True):
        event(f"{path}: {'rejected' if result is None else 'handled'}")
    event(f"capacity changed: {after != before}")
    if all(r is None for r in results):
        assert after == before, "a rejected event changed capacity"
    within_one_step(before, after)
    key = change.group_key
    if key in before and change.state == "ALARM" and change.alarm.startswith(PREFIX) and order[0] == "eventbridge":
        # EventBridge's own delivery is taken as CloudWatch said it: a gpufleet alarm on a managed group acts.
        assert results[0] is None or after[key] == before[key] + 1, f"{key} did not scale out: {results[0]}"
    applied_once_at_most(world, sorted({*before, *([key] if key else [])}))
    world.next_tick_succeeds()


# ---- reconcile ticks: execution ids (and the firing alarms a tick names in its decisions' ids) ----


def scheduled_event(event_id: str) -> dict[str, Any]:
    body = sample("scaler/eventbridge-scheduled-event.json")
    body["id"] = event_id
    return body


TICKS: dict[str, Callable[[str], dict[str, Any]]] = {
    "scheduler": partial(tick, at=NOW),
    "eventbridge-schedule": scheduled_event,
}


@pytest.fixture
def tick_world(gpu_fleet: Fleet) -> World:
    """Every tick has work: train-spot's high alarm is in ALARM (cooldowns 0: each tick may scale it)."""
    gpu_fleet.alarm_state("gpufleet-train-gpu-high", "ALARM")
    return World.build(gpu_fleet, SCALER_POLICY)


@settings(max_examples=examples(30), **ADVERSARIAL)
@given(
    execution_id=mostly(NAME_TEXT),
    shape=st.sampled_from(sorted(TICKS)),
    firing=st.one_of(st.none(), st.builds(PREFIX.__add__, NAME_TEXT)),
)
@example(execution_id=LONG_ID, shape="scheduler", firing=LONG_NAME)  # the firing alarm's decision: 2,000+ bytes
@example(execution_id="", shape="scheduler", firing=None)
def test_any_execution_id_ticks_once_and_the_next_tick_succeeds(
    tick_world: World, execution_id: str, shape: str, firing: str | None
) -> None:
    """`firing`: a second alarm on train-spot, in ALARM, with a name of any length AWS takes (a tick's
    decision for it is keyed by the execution id and the alarm's name together)."""
    world = tick_world
    world.reset({"train-spot": 2})
    try:
        if firing is not None:
            event(f"firing alarm in CloudWatch: {make_alarm(world, Change(firing, 'ALARM', TRAIN_SPOT, ''))}")
        before = capacities(world, None)
        scheduled = TICKS[shape](execution_id)
        results = [world.scale(scheduled, NOW + timedelta(seconds=i)) for i in range(2)]  # delivered twice
        after = capacities(world, None)
        event(f"{shape}: {'rejected' if results[0] is None else 'handled'}, capacity changed: {after != before}")
        if results[0] is None:
            assert after == before, "a rejected tick changed capacity"
        within_one_step(before, after)
        applied_once_at_most(world, sorted(before))
        world.next_tick_succeeds()
    finally:
        world.undo()


# ---- spot_watch: a launch failure's group, activity, message, zone and subnet ----


def launch_failure(asg: str, activity: str, message: str, zone: str, subnet: str) -> dict[str, Any]:
    body = sample("spot_watch/launch-unsuccessful-spot-capacity.json")
    body["detail"].update(
        AutoScalingGroupName=asg,
        ActivityId=activity,
        StatusMessage=message,
        Details={"Availability Zone": zone, "Subnet ID": subnet},
        StartTime=STAMP.isoformat(),
    )
    return body


@pytest.fixture
def spot_world(gpu_fleet: Fleet) -> World:
    """train-spot asked for 5 and has 2 (EC2 holds 3 back); train-ondemand (0 of max 3) is its fallback,
    raised at once (wait 0) by what spot cannot deliver."""
    world = World.build(gpu_fleet, SPOT_POLICY)
    fleet.create_asg(
        gpu_fleet.clients, "train-ondemand", min_size=0, max_size=ONDEMAND_MAX, desired=0, tags=fleet.MANAGED_TAG
    )
    spot_outage(gpu_fleet, SPOT_DESIRED)
    logger, metrics = Logger(service="test"), Metrics(namespace="GPUFleet/Test")
    world.watch = build_spot_watch(logger, metrics, env=gpu_fleet.env(notify_queue=world.queue))
    return world


def spot_sweep_succeeds(world: World) -> None:
    """spot_watch's own schedule tick (fresh execution id) returns with no group's pass failed."""
    assert world.watch is not None
    sweep = tick(f"adversarial-sweep-{next(world.ticks)}", NOW)
    [run] = world.watch.handle(sweep, NOW + timedelta(minutes=1))["results"]
    failed = [g for g in run["groups"] if "error" in g]
    assert failed == [], "the next spot_watch sweep failed"


@settings(max_examples=examples(40), **ADVERSARIAL)
@given(
    asg=mostly(st.sampled_from(["train-spot", "train-spot", "train-ondemand"])),
    activity=mostly(NAME_TEXT),
    message=mostly(st.builds(SPOT_FULL.__add__, st.one_of(st.just(""), NAME_TEXT))),
    zone=mostly(NAME_TEXT),
    subnet=mostly(NAME_TEXT),
)
@example(asg="train-spot", activity="a-1", message=SPOT_FULL, zone="us-east-1a", subnet="s")  # the sample
@example(asg="train-spot", activity="a-2", message=SPOT_FULL, zone="us-east-1a\udcff", subnet="s")  # raised, failed
@example(asg="train-spot", activity=LONG_ID[:255], message=SPOT_FULL + LONG_ID, zone=LONG_ID, subnet=LONG_ID)
def test_any_launch_failure_falls_back_once_and_the_next_ticks_succeed(
    spot_world: World, asg: str, activity: str, message: str, zone: str, subnet: str
) -> None:
    world = spot_world
    assert world.watch is not None
    world.reset({"train-ondemand": 0})
    failure = launch_failure(asg, activity, message, zone, subnet)
    before = capacities(world, "train-ondemand")
    first = deliver(world.watch.handle, failure, NOW)
    raised = capacities(world, "train-ondemand")
    again = deliver(world.watch.handle, failure, NOW + timedelta(seconds=5))  # delivered twice
    after = capacities(world, "train-ondemand")
    event(f"launch failure: {'rejected' if first is None else 'handled'}, fallback raised: {raised != before}")
    if first is None:
        assert again is None and after == before, "a rejected launch failure changed capacity"
    assert after == raised, f"the same launch failure delivered again moved capacity: {raised} -> {after}"
    assert before["asg:train-spot"] == after["asg:train-spot"] == SPOT_DESIRED, "spot_watch resized the spot group"
    assert 0 <= after["asg:train-ondemand"] <= min(ONDEMAND_MAX, SPOT_HELD), after
    if first is not None and asg == "train-spot" and message.startswith(SPOT_FULL):  # spot capacity, wait 0
        assert raised["asg:train-ondemand"] == SPOT_HELD, f"no fallback for spot's shortfall: {first}"
    applied_once_at_most(world, ["asg:train-ondemand"])
    spot_sweep_succeeds(world)
    world.next_tick_succeeds()
