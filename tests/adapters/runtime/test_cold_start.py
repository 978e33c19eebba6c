"""A scaler built without a notification queue says so once, at cold start (no AWS call is made)."""

from __future__ import annotations

import io
import json
import logging

import pytest
from aws_lambda_powertools import Logger, Metrics

from gpufleet.domain import defaults
from gpufleet.runtime import build_scaler


@pytest.mark.parametrize(("queue", "warned"), [(None, True), ("https://sqs.us-east-1.amazonaws.com/1/q", False)])
def test_the_scaler_warns_when_notifications_have_nowhere_to_go(
    monkeypatch: pytest.MonkeyPatch, queue: str | None, warned: bool
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    out = io.StringIO()
    logger = Logger(service=f"cold-start-{warned}", logger_handler=logging.StreamHandler(out))
    env = {defaults.ENV_STATE_TABLE: "gpufleet-state", **({defaults.ENV_NOTIFY_QUEUE_URL: queue} if queue else {})}
    build_scaler(logger, Metrics(namespace="GPUFleet/Test"), env=env)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    warnings = [r["message"] for r in lines if r["level"] == "WARNING"]
    assert bool(warnings) is warned
    if warned:
        assert warnings == [
            f"notifications have nowhere to go: {defaults.ENV_NOTIFY_QUEUE_URL} is not set; "
            "decisions are audited (gpufleet explain) but nobody is told"
        ]
