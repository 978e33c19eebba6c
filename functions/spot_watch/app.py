"""spot_watch: failed launches (EventBridge event + describe sweep) -> classify, back off, fall back, return."""

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.domain.errors import InvalidEvent, PolicyError
from gpufleet.runtime import build_spot_watch

logger = Logger(service="spot_watch")
tracer = Tracer(service="spot_watch")
metrics = Metrics(namespace="GPUFleet/Controller", service="spot_watch")
watch = build_spot_watch(logger, metrics)


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        return watch.handle(event, now=datetime.now(UTC))
    except (InvalidEvent, PolicyError) as exc:
        logger.error("rejected event", extra={"error": str(exc)})
        raise
