"""OOM guard: forecast GPU memory exhaustion, catch failing GPUs, act within limits (schedule + alarms)."""

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.domain.errors import InvalidEvent, PolicyError
from gpufleet.runtime import build_guard

logger = Logger(service="oom_guard")
tracer = Tracer(service="oom_guard")
metrics = Metrics(namespace="GPUFleet/Controller", service="oom_guard")
guard = build_guard(logger, metrics)


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        return guard.handle(event, now=datetime.now(UTC))
    except (InvalidEvent, PolicyError) as exc:
        logger.error("rejected event", extra={"error": str(exc)})
        raise
