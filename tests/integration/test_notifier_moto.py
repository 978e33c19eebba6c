"""The notifier end to end over HTTP: moto server (SQS, SNS, DynamoDB, Secrets Manager) and the local
Slack-compatible receiver (rehearsal.slack, emulated), driven through the real Lambda handler."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from gpufleet.aws.queue import NotificationQueue
from gpufleet.domain import defaults
from gpufleet.domain.notification import Notification, Severity
from gpufleet.notify.render import MAYBE_DUPLICATE
from gpufleet.notify.service import TIME_RESERVE_S
from gpufleet_tools.cli import main as cli_main
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import fleet
from rehearsal.slack import SlackReceiver, slack_receiver
from tests.adapters.notify.hanging_slack import hanging_slack
from tests.conftest import ROOT

TABLE = "gpufleet-state"
WEBHOOK_SECRET_PART = "T0SECRET/B0SECRET/XOXSECRETTOKEN123"
IMMEDIATE = """
notifications:
  grouping: {group_wait_s: 0, group_interval_s: 0, repeat_interval_s: 3600}
  routes:
    - match: {severities: [info]}
      slack: true
      sns: false
"""


@dataclass
class Harness:
    stack: fleet.NotificationStack
    receiver: SlackReceiver
    app: ModuleType
    sqs: Any
    fake_time: list[float]

    def send(self, *notifications: Notification) -> None:
        NotificationQueue(self.sqs, self.stack.queue_url).send(list(notifications))

    def deliver(
        self, messages: list[dict[str, Any]] | None = None, context: LocalLambdaContext | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One Lambda invocation on what is on the queue (or on `messages`, a redelivery)."""
        messages = fleet.drain(self.sqs, self.stack.queue_url) if messages is None else messages
        response = self.app.lambda_handler(fleet.sqs_event(messages), context or LocalLambdaContext("notifier"))
        failed_ids = {f["itemIdentifier"] for f in response["batchItemFailures"]}
        return [m for m in messages if m["MessageId"] in failed_ids], response

    def sns_messages(self) -> list[dict[str, Any]]:
        return [json.loads(m["Body"]) for m in fleet.drain(self.sqs, self.stack.sns_inbox_url)]

    def dlq(self) -> list[dict[str, Any]]:
        return fleet.drain(self.sqs, self.stack.dlq_url)


def load_notifier(env: dict[str, str]) -> ModuleType:
    os.environ.update(env)
    spec = importlib.util.spec_from_file_location("notifier_app_under_test", ROOT / "functions/notifier/app.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def harness(tmp_path: Path, policy: str, secret: str | None, receiver: SlackReceiver, base: str) -> Harness:
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    stack = fleet.create_notification_stack(secret.replace("{base}", base) if secret else None)
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(policy)
    env = stack.env(TABLE, str(policy_path))
    env[defaults.ENV_SLACK_API_URL] = f"{base}/api/"
    env[defaults.ENV_SLACK_TIMEOUT_S] = "1"
    return Harness(stack, receiver, load_notifier(env), boto3.client("sqs"), [0.0])


@pytest.fixture
def notify(aws: str, tmp_path: Path) -> Iterator[Harness]:
    fake_time = [0.0]
    receiver = SlackReceiver(clock=lambda: fake_time[0])
    with slack_receiver(receiver) as (rx, base):
        h = harness(tmp_path, IMMEDIATE, "{base}/services/" + WEBHOOK_SECRET_PART, rx, base)
        h.fake_time = fake_time
        yield h


def notification(n: int, severity: Severity = Severity.INFO, group: str = "asg:train", **kw: Any) -> Notification:
    return Notification(
        notification_id=f"id-{n}",
        kind="scaling",
        severity=severity,
        group=group,
        incident_key=kw.pop("incident_key", f"{group}|capacity#{n}"),
        title=f"{group}: scaled 4 -> 6 ({n})",
        facts={"capacity": "4 -> 6"},
        reason="alarm gpufleet-train-gpu-high in ALARM",
        at=datetime.now(UTC),
        **kw,
    )


def test_a_notification_reaches_slack_as_block_kit_and_sns_with_filterable_attributes(notify: Harness) -> None:
    notify.send(notification(1, Severity.CRITICAL))
    failed, _ = notify.deliver()
    assert failed == []
    [msg] = notify.receiver.received
    assert msg.path.startswith("/services/")
    assert msg.payload["blocks"][0]["type"] == "header"
    assert "scaled 4 -&gt; 6" in msg.payload["text"]  # escaped as Slack requires; shown as "->"
    [sns] = notify.sns_messages()
    assert len(sns["Subject"]) <= 100
    assert sns["MessageAttributes"]["severity"]["Value"] == "critical"
    assert sns["MessageAttributes"]["group"]["Value"] == "asg:train"


def test_duplicate_sqs_deliveries_post_once(notify: Harness) -> None:
    notify.send(notification(1))
    [message] = fleet.drain(notify.sqs, notify.stack.queue_url)
    notify.deliver([message, message])  # twice in one batch
    notify.deliver([message])  # and once more later
    assert len(notify.receiver.received) == 1


def test_malformed_messages_go_to_the_dlq_with_a_reason_and_the_rest_proceeds(notify: Harness) -> None:
    notify.sqs.send_message(QueueUrl=notify.stack.queue_url, MessageBody="{not json")
    notify.send(notification(1))
    notify.sqs.send_message(QueueUrl=notify.stack.queue_url, MessageBody=json.dumps({"kind": 3, "severity": "loud"}))
    failed, _ = notify.deliver()
    assert failed == []
    assert len(notify.receiver.received) == 1
    rejected = notify.dlq()
    assert len(rejected) == 2
    reasons = sorted(m["MessageAttributes"]["rejected_reason"]["StringValue"] for m in rejected)
    assert reasons[0].startswith("not JSON")
    assert "severity" in reasons[1] and "notification_id" in reasons[1]


def test_rate_limits_and_server_errors_are_retried_by_slack_sdk(notify: Harness) -> None:
    notify.receiver.script.extend(["429:1", "503", "ok"])
    notify.send(notification(1))
    failed, _ = notify.deliver()
    assert failed == []
    assert notify.receiver.answers == ["429:1", "503", "ok"]
    assert len(notify.receiver.received) == 1


def test_a_30s_outage_loses_nothing_and_posts_nothing_twice(notify: Harness) -> None:
    """Slack answers 503 for 30 s (on the receiver's clock). The records fail, SQS redelivers them
    after the visibility timeout (emulated by calling the handler again), everything arrives once;
    the critical one reached SNS during the outage and is not re-published on redelivery."""
    notify.receiver.down_until = 30.0
    notify.send(notification(1), notification(2, Severity.CRITICAL), notification(3))
    failed, _ = notify.deliver()
    assert len(failed) == 3
    assert notify.receiver.received == []
    assert [m["MessageAttributes"]["severity"]["Value"] for m in notify.sns_messages()] == ["critical"]
    notify.fake_time[0] = 31.0  # the outage is over when SQS redelivers
    failed, _ = notify.deliver(failed)
    assert failed == []
    titles = sorted(r.payload["text"] for r in notify.receiver.received)
    assert len(titles) == 3 and len(set(titles)) == 3
    assert notify.sns_messages() == []  # not published again
    assert notify.dlq() == []


def test_a_lost_answer_repeats_the_post_at_most_once(notify: Harness) -> None:
    """Issue 29: Slack takes every post and answers after the 1 s timeout. The record, its redelivery,
    three sweeps and a late duplicate: the post and one repeat marked as a possible duplicate; the state
    table records both unanswered attempts and holds the delivery (before: a re-post at every sweep)."""
    notify.receiver.script.extend(["stall:1.5"] * 5)  # each post lands; its answer comes too late
    notify.send(notification(1))
    [message] = fleet.drain(notify.sqs, notify.stack.queue_url)
    failed, _ = notify.deliver([message])
    assert len(failed) == 1
    failed, _ = notify.deliver(failed)  # the one repeat
    sweeps = [notify.app.lambda_handler({"gpufleet": "sweep"}, LocalLambdaContext("notifier")) for _ in range(3)]
    again, _ = notify.deliver([message])  # yet another (late) duplicate delivery: held, not posted
    assert sweeps == [{"sweep": {}}] * 3 and again == []
    posts = notify.receiver.received
    assert len(posts) == 2  # bounded: the lost one + its single repeat
    assert [p.answered for p in posts] == [False, False]
    assert MAYBE_DUPLICATE not in posts[0].payload["text"] and MAYBE_DUPLICATE in posts[1].payload["text"]
    stored = notify.app.notifier.store.get(notification(1).incident_key)
    assert stored.in_flight is not None and stored.in_flight.unanswered == 2


def test_critical_reaches_sns_when_slack_fails_even_on_a_slack_only_route(aws: str, tmp_path: Path) -> None:
    policy = IMMEDIATE.replace("severities: [info]", "severities: [critical]")
    receiver = SlackReceiver(script=__import__("collections").deque(["500"] * 10))
    with slack_receiver(receiver) as (rx, base):
        h = harness(tmp_path, policy, "{base}/services/" + WEBHOOK_SECRET_PART, rx, base)
        h.send(notification(1, Severity.CRITICAL))
        failed, _ = h.deliver()
    assert len(failed) == 1  # retried later for Slack
    [sns] = h.sns_messages()
    assert sns["MessageAttributes"]["severity"]["Value"] == "critical"


@pytest.mark.parametrize("mode", ["webhook", "bot"])
def test_a_post_slack_refuses_goes_to_the_dlq_with_the_reason_and_critical_still_reaches_sns(
    aws: str, tmp_path: Path, mode: str
) -> None:
    """A 4xx (webhook) or ok=false (Web API) is not retried: no redelivery could fix it. The rendered
    payload goes to the DLQ with Slack's error, the record succeeds, and a critical one still pages via SNS."""
    policy = IMMEDIATE.replace("severities: [info]", "severities: [critical]")
    error = "invalid_blocks" if mode == "webhook" else "channel_not_found"
    secret = (
        "{base}/services/" + WEBHOOK_SECRET_PART
        if mode == "webhook"
        else json.dumps({"bot_token": "xoxb-" + WEBHOOK_SECRET_PART, "channel": "#gone"})
    )
    receiver = SlackReceiver(script=__import__("collections").deque([f"400:{error}"]))
    with slack_receiver(receiver) as (rx, base):
        h = harness(tmp_path, policy, secret, rx, base)
        h.send(notification(1, Severity.CRITICAL))
        failed, _ = h.deliver()
        h.send(notification(2, Severity.CRITICAL))  # the next incident posts normally
        h.deliver()
    assert failed == []  # not retried
    assert rx.answers == [f"400:{error}", "ok"] and len(rx.refused) == 1 and len(rx.received) == 1
    [rejected] = h.dlq()
    reason = rejected["MessageAttributes"]["rejected_reason"]["StringValue"]
    assert reason.startswith("Slack rejected the post:") and error in reason
    assert WEBHOOK_SECRET_PART not in json.dumps(rejected)
    assert json.loads(rejected["Body"])["blocks"] == rx.refused[0].payload["blocks"]  # what was refused, kept
    # Slack-only route: the refused incident pages through SNS, the one Slack took does not.
    [sns] = h.sns_messages()
    assert sns["MessageAttributes"]["severity"]["Value"] == "critical" and "(1)" in sns["Subject"] + sns["Message"]


def test_bot_token_mode_threads_updates_under_the_first_post(aws: str, tmp_path: Path) -> None:
    secret = json.dumps({"bot_token": "xoxb-" + WEBHOOK_SECRET_PART, "channel": "#gpu-oncall"})
    with slack_receiver() as (rx, base):
        h = harness(tmp_path, IMMEDIATE, secret, rx, base)
        h.send(notification(1, incident_key="asg:train|capacity"))
        h.deliver()
        h.send(notification(2, incident_key="asg:train|capacity"))
        h.deliver()
    first, second = rx.received
    assert first.path == "/api/chat.postMessage" and first.payload["channel"] == "#gpu-oncall"
    assert "thread_ts" not in first.payload or not first.payload["thread_ts"]
    assert second.payload["thread_ts"] == "1700000000.000001"


def test_the_slack_secret_never_appears_in_logs(notify: Harness, capfd: pytest.CaptureFixture[str]) -> None:
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    handler.setFormatter(notify.app.logger.registered_formatter)
    notify.app.logger.addHandler(handler)  # every record the function logs, as JSON, in this test
    try:
        notify.receiver.script.extend(["503", "503", "503", "stall:2"])
        notify.send(notification(1), notification(2))
        failed, _ = notify.deliver()
        notify.deliver(failed)
        notify.sqs.send_message(QueueUrl=notify.stack.queue_url, MessageBody="garbage")
        notify.deliver()
    finally:
        notify.app.logger.removeHandler(handler)
    captured = capfd.readouterr()
    text = logs.getvalue() + captured.out + captured.err
    assert '"message":"posted"' in text and "rejected notification message" in text  # logs were captured
    assert "XOXSECRETTOKEN123" not in text
    assert "XOXSECRETTOKEN123" not in json.dumps(dict(os.environ))


def test_silences_from_the_cli_mute_matching_notifications(notify: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    assert (
        cli_main(["silence", "--group", "asg:train*", "--for", "1h", "--reason", "drain", "--endpoint", endpoint]) == 0
    )
    assert cli_main(["silences", "--endpoint", endpoint]) == 0
    listing = capsys.readouterr().out
    assert "groups asg:train*" in listing and "(drain)" in listing
    notify.send(notification(1), notification(2, group="asg:infer"))
    notify.deliver()
    [posted] = notify.receiver.received
    assert "asg:infer" in posted.payload["text"]


def test_grouping_schedules_a_delayed_flush_instead_of_posting(aws: str, tmp_path: Path) -> None:
    with slack_receiver() as (rx, base):
        h = harness(tmp_path, "notifications: {grouping: {group_wait_s: 30}}", "{base}/services/X", rx, base)
        h.send(notification(1, incident_key="k"), notification(2, incident_key="k"))
        failed, _ = h.deliver()
    assert failed == [] and rx.received == []
    attrs = h.sqs.get_queue_attributes(QueueUrl=h.stack.queue_url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesDelayed"] == "1"  # one nudge for the incident, not one per message


def test_a_slack_only_route_without_a_secret_says_it_delivered_nowhere(aws: str, tmp_path: Path) -> None:
    with slack_receiver(SlackReceiver()) as (rx, base):
        h = harness(tmp_path, IMMEDIATE, None, rx, base)  # no Slack secret; the route turns SNS off
        with json_logs(h.app) as records:
            h.send(notification(1))
            failed, _ = h.deliver()
    [nowhere] = [r for r in records if r["message"] == "delivered nowhere"]
    assert nowhere["level"] == "WARNING" and failed == [] and h.sns_messages() == []
    assert nowhere["why"] == (f"the route wants Slack but no Slack secret is configured ({defaults.ENV_SLACK_SECRET})")
    assert not any(r["message"] == "posted" for r in records)


@contextmanager
def json_logs(app: ModuleType) -> Iterator[list[dict[str, Any]]]:
    """Every record the function logs in the block, as the JSON Powertools writes."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(app.logger.registered_formatter)
    app.logger.addHandler(handler)
    records: list[dict[str, Any]] = []
    try:
        yield records
    finally:
        app.logger.removeHandler(handler)
        records.extend(json.loads(line) for line in stream.getvalue().splitlines())


def numbers(texts: list[str]) -> set[int]:
    """Which of `notification(0..9)` the posts were, by the "(n)" their titles end in."""
    return {n for n in range(10) for text in texts if f"({n})" in text}


def test_a_hanging_slack_costs_a_batch_its_time_budget_not_a_lambda_timeout(aws: str, tmp_path: Path) -> None:
    """Slack answers 3 posts, then takes every connection and never answers (1 s per attempt). A batch of
    10 whose invocation has 3 s left past the reserve returns within them: the 3 posted records succeed,
    those whose post timed out fail, the rest fail without being attempted, and the log says why. SQS
    redelivers only the records not posted; each is then posted (a timed-out one twice: its answer was lost)."""
    with hanging_slack(answers=3) as (slack, base):
        h = harness(tmp_path, IMMEDIATE, "{base}/services/" + WEBHOOK_SECRET_PART, SlackReceiver(), base)
        h.send(*(notification(n) for n in range(10)))
        messages = fleet.drain(h.sqs, h.stack.queue_url)
        context = LocalLambdaContext("notifier", timeout_s=int(TIME_RESERVE_S) + 3)
        with json_logs(h.app) as logs:
            failed, _ = h.deliver(messages, context)
        left_s = context.get_remaining_time_in_millis() / 1000
        posted, hung = numbers(slack.answered()), numbers(slack.hung())
        slack.answers = 100  # Slack is back when SQS redelivers
        again, _ = h.deliver(failed)
    assert left_s > TIME_RESERVE_S - 0.5  # returned within its 3 s, the reserve left for finishing
    assert len(messages) == 10 and len(posted) == 3 and 1 <= len(hung) <= 3
    failed_numbers = {int(json.loads(m["Body"])["title"].rsplit("(", 1)[1].rstrip(")")) for m in failed}
    assert failed_numbers == set(range(10)) - posted
    not_attempted = failed_numbers - hung
    assert len(not_attempted) >= 4
    [warning] = [r for r in logs if r["message"].startswith("out of time")]
    assert warning["level"] == "WARNING" and warning["not_attempted"] == len(not_attempted)
    [done] = [r["outcomes"] for r in logs if r["message"] == "batch done"]
    assert done["out-of-time"] == len(not_attempted) and done["slack-timeouts"] == len(hung)
    assert done["slack-posts"] == 3
    assert again == []
    texts = [p.text for p in slack.posts]
    assert {n: sum(f"({n})" in t for t in texts) for n in range(10)} == {n: 2 if n in hung else 1 for n in range(10)}


def test_a_sweep_out_of_time_leaves_due_posts_to_the_next_sweep(aws: str, tmp_path: Path) -> None:
    """Two posts time out against a hanging Slack, so both incidents are due again. A sweep with no time
    left past the reserve posts nothing and says so; the next sweep, with time, posts both."""
    sweep = {"gpufleet": "sweep"}
    with hanging_slack(answers=0) as (slack, base):
        h = harness(tmp_path, IMMEDIATE, "{base}/services/" + WEBHOOK_SECRET_PART, SlackReceiver(), base)
        h.send(notification(1), notification(2))
        failed, _ = h.deliver()
        with json_logs(h.app) as logs:
            spent = h.app.lambda_handler(sweep, LocalLambdaContext("notifier", timeout_s=int(TIME_RESERVE_S)))
        slack.answers = 100
        swept = h.app.lambda_handler(sweep, LocalLambdaContext("notifier"))
    assert len(failed) == 2 and len(slack.hung()) == 2
    assert spent == {"sweep": {"out-of-time": 2}}
    assert [r["not_attempted"] for r in logs if r["message"].startswith("out of time")] == [2]
    assert swept == {"sweep": {"posted-new": 2}} and numbers(slack.answered()) == {1, 2}


def test_an_incident_the_state_table_refuses_is_parked_in_the_dlq_and_the_batch_goes_on(notify: Harness) -> None:
    """Isolation (issue 22): a notification whose incident DynamoDB refuses for good (ValidationException)
    is parked in the DLQ with the reason, once; it is not retried until the DLQ and blocks no other."""
    table = notify.app.notifier.store.dynamodb

    def refuse_poisoned(params: dict[str, Any], **_: Any) -> None:
        if "poisoned" in params["Item"]["sk"]["S"]:
            error = {"Code": "ValidationException", "Message": "Item size has exceeded the maximum allowed size"}
            raise ClientError({"Error": error}, "PutItem")

    table.meta.events.register("provide-client-params.dynamodb.PutItem", refuse_poisoned)
    notify.send(notification(1, incident_key="asg:train|poisoned"), notification(2))
    failed, _ = notify.deliver()
    assert failed == []  # neither is redelivered
    assert len(notify.receiver.received) == 1  # the other one posted
    [parked] = notify.dlq()
    assert (
        "the state table refused its incident: Item size"
        in parked["MessageAttributes"]["rejected_reason"]["StringValue"]
    )
