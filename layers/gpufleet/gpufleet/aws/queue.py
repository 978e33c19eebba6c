"""The notification queue (SQS) and the SNS topic, as the notifier and its producers use them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufleet.aws.clients import chunks
from gpufleet.domain.notification import Notification

if TYPE_CHECKING:
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_sns.type_defs import MessageAttributeValueTypeDef
    from mypy_boto3_sqs import SQSClient

SQS_BATCH_MAX = 10
SQS_DELAY_MAX_S = 900


class EnqueueFailed(RuntimeError):
    pass


def enqueue_or_log(outbox: NotificationQueue | None, notes: Sequence[Notification], logger: Any, emf: Any) -> bool:
    """Producers never let a queue outage undo or block what they decided: the notifications are logged
    in full and counted (metric NotificationsNotQueued, alarmed in the template). False when they were
    not queued (a caller with an outbox keeps it, so the next invocation sends them again)."""
    from aws_lambda_powertools.metrics import MetricUnit

    if not notes or outbox is None:
        return True
    try:
        outbox.send(notes)
    except Exception:
        logger.exception(
            "notifications not queued", extra={"notifications": [n.model_dump(mode="json") for n in notes]}
        )
        emf.add_metric(name="NotificationsNotQueued", unit=MetricUnit.Count, value=len(notes))
        return False
    return True


@dataclass
class NotificationQueue:
    sqs: SQSClient
    queue_url: str
    dlq_url: str | None = None

    def send(self, notifications: Sequence[Notification]) -> None:
        """Raises EnqueueFailed naming the notifications SQS refused after boto3's retries."""
        refused: list[str] = []
        for batch in chunks(list(notifications), SQS_BATCH_MAX):
            resp = self.sqs.send_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "MessageBody": n.model_dump_json()} for i, n in enumerate(batch)],
            )
            refused += [
                f"{batch[int(f['Id'])].incident_key}: {f.get('Message', f['Code'])}" for f in resp.get("Failed", [])
            ]
        if refused:
            raise EnqueueFailed("; ".join(refused))

    def schedule_flush(self, incident_key: str, delay_s: int) -> None:
        """Ask the notifier to look at an incident again later (SQS delays at most 15 minutes)."""
        self.sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=json.dumps({"flush": incident_key}),
            DelaySeconds=max(0, min(SQS_DELAY_MAX_S, delay_s)),
        )

    def reject(self, body: str, reason: str) -> None:
        """Malformed messages go straight to the DLQ with the reason: retrying cannot fix them."""
        if not self.dlq_url:
            raise RuntimeError(f"no DLQ configured to reject a message: {reason}")
        self.sqs.send_message(
            QueueUrl=self.dlq_url,
            MessageBody=body or "(empty)",
            MessageAttributes={"rejected_reason": {"DataType": "String", "StringValue": reason[:1000]}},
        )


@dataclass
class SnsPublisher:
    sns: SNSClient
    topic_arn: str

    def publish(self, subject: str, message: str, attributes: Mapping[str, Mapping[str, str]]) -> None:
        """`attributes`: name -> {"DataType": "String", "StringValue": ...} (filter keys for subscriptions)."""
        typed: dict[str, MessageAttributeValueTypeDef] = {
            name: {"DataType": value["DataType"], "StringValue": value["StringValue"]}
            for name, value in attributes.items()
        }
        self.sns.publish(TopicArn=self.topic_arn, Subject=subject, Message=message, MessageAttributes=typed)
