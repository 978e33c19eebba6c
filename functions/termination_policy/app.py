"""termination_policy: EC2 Auto Scaling's custom termination policy - only idle GPU instances may go."""

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.domain.errors import InvalidEvent, PolicyError
from gpufleet.runtime import build_termination_policy

logger = Logger(service="termination_policy")
tracer = Tracer(service="termination_policy")
metrics = Metrics(namespace="GPUFleet/Controller", service="termination_policy")
policy = build_termination_policy(logger, metrics)


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, list[str]]:
    try:
        return policy.handle(event, now=datetime.now(UTC))
    except (InvalidEvent, PolicyError) as exc:
        logger.error("rejected event", extra={"error": str(exc)})
        raise
