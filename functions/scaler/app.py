"""Scaler: CloudWatch GPU alarms (EventBridge, alarm action, SNS) and reconcile ticks -> capacity."""

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.domain.errors import InvalidEvent, PolicyError
from gpufleet.runtime import build_scaler

logger = Logger(service="scaler")
tracer = Tracer(service="scaler")
metrics = Metrics(namespace="GPUFleet/Controller", service="scaler")
scaler, idempotency_config = build_scaler(logger, metrics)


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    idempotency_config.register_lambda_context(context)
    try:
        return scaler.handle(event, now=datetime.now(UTC))
    except (InvalidEvent, PolicyError) as exc:
        # Logged with what was wrong; re-raised so async retries end in the DLQ, nothing changed.
        logger.error("rejected event", extra={"error": str(exc)})
        raise
