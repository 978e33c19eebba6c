"""An invalid edit of the SSM policy parameter on moto server: the scaler keeps running on the last policy
that parsed (kept in the state table), tells on-call once (CRITICAL), and an edit that parses again takes
over; with nothing kept yet the error stands. In-process, so the IAM conformance check sees the calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import boto3
import pytest
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities import parameters

from gpufleet.domain import defaults
from gpufleet.domain.errors import PolicyError
from gpufleet.runtime import build_scaler
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import fleet
from tests.integration.conftest import POLICY, TABLE, Fleet, queued

pytestmark = pytest.mark.integration
PARAMETER = "/gpufleet/policy"
INVALID = "groups: [{name: train-spot, kind: gke}]\n"


def put_policy(text: str) -> None:
    boto3.client("ssm").put_parameter(Name=PARAMETER, Value=text, Type="String", Overwrite=True)
    parameters.clear_caches()  # Powertools keeps the parameter a minute; the test does not wait


def tick(scaler: object, minute: int) -> dict:  # type: ignore[type-arg]
    now = datetime(2026, 11, 23, 9, 0, tzinfo=UTC) + timedelta(minutes=minute)
    event = {"gpufleet": "reconcile", "execution_id": f"lkg-{minute}", "scheduled_time": now.isoformat()}
    return scaler.handle(event, now=now)  # type: ignore[attr-defined,no-any-return]


def scaler(queue: str) -> object:
    env = {
        defaults.ENV_STATE_TABLE: TABLE,
        defaults.ENV_POLICY_PARAMETER: PARAMETER,
        defaults.ENV_NOTIFY_QUEUE_URL: queue,
    }
    built, idempotency = build_scaler(Logger(service="test"), Metrics(namespace="GPUFleet/Test"), env=env)
    idempotency.register_lambda_context(LocalLambdaContext("scaler"))  # type: ignore[arg-type]
    return built


def test_an_invalid_edit_runs_on_the_last_good_policy_and_says_so_once(gpu_fleet: Fleet) -> None:
    queue = fleet.create_notification_stack(slack_secret=None).queue_url
    put_policy(POLICY)
    s = scaler(queue)
    tick(s, 0)
    kept = boto3.client("dynamodb").get_item(TableName=TABLE, Key={"pk": {"S": "POLICY"}, "sk": {"S": "LAST_GOOD"}})
    assert kept["Item"]["text"]["S"] == POLICY
    queued(queue)

    put_policy(INVALID)
    first, second = tick(s, 1), tick(s, 2)  # neither raises: both reconcile on the kept policy
    assert first["results"] and second["results"]
    [told] = [n for n in queued(queue) if n.kind == "control"]
    assert told.severity == "critical" and told.incident_key == "policy|invalid"
    assert told.title.startswith(f"fleet policy in ssm:{PARAMETER} is invalid: running on the last good one")
    assert "groups[0] (train-spot).kind" in told.reason

    fixed = POLICY + "dry_run: true\n"
    put_policy(fixed)
    tick(s, 3)
    kept = boto3.client("dynamodb").get_item(TableName=TABLE, Key={"pk": {"S": "POLICY"}, "sk": {"S": "LAST_GOOD"}})
    assert kept["Item"]["text"]["S"] == fixed


def test_with_nothing_kept_an_invalid_policy_still_fails_loudly(gpu_fleet: Fleet) -> None:
    put_policy(INVALID)
    with pytest.raises(PolicyError, match="kind"):
        tick(scaler(fleet.create_notification_stack(slack_secret=None).queue_url), 0)
