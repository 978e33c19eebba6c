"""Notifier: notification queue (SQS, partial batch failures) and the sweep schedule -> Slack / SNS."""

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.domain.errors import InvalidEvent
from gpufleet.notify.service import TimeBudget
from gpufleet.runtime import build_notifier

logger = Logger(service="notifier")
# Only AWS calls are traced: the Slack webhook URL is the secret, and an HTTP-library patch would record it
# (tests/integration/test_secrets_in_traces.py shows both).
tracer = Tracer(service="notifier", patch_modules=["botocore"])
metrics = Metrics(namespace="GPUFleet/Controller", service="notifier")
# Failed records are reported back, also when all fail: SQS redelivers exactly those, then the DLQ.
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
notifier = build_notifier(logger, metrics)


@tracer.capture_method
def record_handler(record: SQSRecord, lambda_context: LambdaContext) -> str:
    """Powertools passes the context to a parameter of that name: a record gets what is left of the
    invocation, so one the time no longer covers fails unattempted instead of the batch timing out."""
    logger.append_keys(message_id=record.message_id)
    budget = TimeBudget(lambda_context.get_remaining_time_in_millis)
    return notifier.handle_message(record.body, now=datetime.now(UTC), budget=budget)


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        return notifier.handle(
            event,
            now=datetime.now(UTC),
            process_batch=lambda: process_partial_response(
                event=event, record_handler=record_handler, processor=processor, context=context
            ),
            budget=TimeBudget(context.get_remaining_time_in_millis),
        )
    except InvalidEvent as exc:
        logger.error("rejected event", extra={"error": str(exc)})
        raise
