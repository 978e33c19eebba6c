"""The Slack webhook URL is the secret: it must reach no X-Ray trace. The deployed notifier handler runs
with tracing on, as inside Lambda, against moto and the local Slack receiver; every trace document it
emits is captured and searched for the webhook's path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest

from gpufleet.domain.notification import NotificationKind, Severity, note
from rehearsal import fleet
from rehearsal.slack import slack_receiver
from tests.integration.conftest import TABLE

PROBE = Path(__file__).with_name("xray_probe.py")
SECRET_PATH = "/services/T0SECRET/B0SECRET/xoxSecretWebhookToken"


def run_probe(mode: str, aws: str, tmp_path: Path) -> tuple[list[dict[str, object]], int]:
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    policy = tmp_path / "policy.yaml"
    policy.write_text("notifications: {grouping: {group_wait_s: 0, group_interval_s: 0}}\n")
    with slack_receiver() as (receiver, url):
        stack = fleet.create_notification_stack(slack_secret=url + SECRET_PATH)
        n = note(
            NotificationKind.SCALING,
            Severity.WARNING,
            "asg:train",
            "asg:train: scaled",
            at=datetime.now(UTC),
            source="test",
            id_parts=("trace", mode),
        )
        boto3.client("sqs").send_message(QueueUrl=stack.queue_url, MessageBody=n.model_dump_json())
        event = fleet.sqs_event(fleet.drain(boto3.client("sqs"), stack.queue_url))
        event_file = tmp_path / "event.json"
        event_file.write_text(json.dumps(event))
        env = {
            **os.environ,
            **stack.env(TABLE, str(policy)),
            "LAMBDA_TASK_ROOT": str(tmp_path),
            "_X_AMZN_TRACE_ID": "Root=1-6742f0c8-0123456789abcdef01234567;Parent=53995c3f42cd8ad8;Sampled=1",
            "AWS_LAMBDA_FUNCTION_NAME": "notifier",
        }
        env.pop("POWERTOOLS_TRACE_DISABLED", None)
        proc = subprocess.run(
            [sys.executable, str(PROBE), mode, str(event_file)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        posts = len(receiver.received)
    docs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"')]
    return docs, posts


@pytest.mark.integration
def test_the_webhook_url_reaches_no_trace(aws: str, tmp_path: Path) -> None:
    docs, posts = run_probe("deployed", aws, tmp_path)
    assert posts == 1  # the post really went out while traced
    assert docs, "no trace documents were captured"
    text = json.dumps(docs)
    assert "dynamodb" in text.lower() or "DynamoDB" in text  # AWS calls are traced...
    assert "xoxSecretWebhookToken" not in text and "T0SECRET" not in text  # ...the webhook is not


@pytest.mark.integration
def test_the_capture_would_see_a_patched_http_call(aws: str, tmp_path: Path) -> None:
    """Control: with http.client patched, the same capture finds the webhook path - so the test above
    would fail if a change (a Tracer option, a new HTTP library) started tracing the post."""
    docs, posts = run_probe("patch-httplib", aws, tmp_path)
    assert posts == 1 and "xoxSecretWebhookToken" in json.dumps(docs)
