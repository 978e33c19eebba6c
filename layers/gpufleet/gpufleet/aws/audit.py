"""The decision audit trail: one item per decision, acted or not (`gpufleet explain` reads it)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from gpufleet.aws.clients import chunks, error_message, refused_for_good
from gpufleet.aws.state import group_pk, until_processed
from gpufleet.domain import defaults
from gpufleet.domain.keys import joined
from gpufleet.domain.models import Decision

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

DECISION_SK_PREFIX = "DECISION#"
PARKED_SK_PREFIX = "PARKED#"
HOLD_TTL = timedelta(days=1)
PARKED_TTL = timedelta(days=30)
PARKED_SUMMARY_CHARS = 8000


@dataclass(frozen=True)
class Parked:
    """A decision record DynamoDB would not store, set aside with why."""

    group: str
    event_id: str
    reason: str
    at: datetime


def _item(d: Decision, audit_ttl_days: int) -> dict[str, Any]:
    ttl = HOLD_TTL if not d.acts else timedelta(days=audit_ttl_days)
    return {
        "pk": {"S": group_pk(d.group)},
        "sk": {"S": decision_sk(d)},
        "decision": {"S": d.model_dump_json()},
        "expiration": {"N": str(int((d.at + ttl).timestamp()))},
    }


def _parked_item(d: Decision, parked: Parked) -> dict[str, Any]:
    """What can surely be stored of it: bounded keys, the reason, the start of the record as ASCII."""
    summary = d.model_dump_json().encode("ascii", "backslashreplace").decode()[:PARKED_SUMMARY_CHARS]
    return {
        "pk": {"S": group_pk(d.group)},
        "sk": {"S": joined(PARKED_SK_PREFIX, d.at.isoformat(), d.event_id)},
        "reason": {"S": parked.reason.encode("ascii", "backslashreplace").decode()},
        "summary": {"S": summary},
        "expiration": {"N": str(int((d.at + PARKED_TTL).timestamp()))},
    }


def decision_sk(d: Decision) -> str:
    """Sorted by time; the event id (an alarm ARN, a schedule's execution id) bounded with the rest."""
    return joined(DECISION_SK_PREFIX, d.at.isoformat(), d.event_id)


@dataclass
class AuditLog:
    dynamodb: DynamoDBClient
    table: str
    max_wait_s: float = defaults.BATCH_WAIT_MAX_S  # throttled batches: how long to wait in all

    def record(self, decisions: Iterable[Decision], audit_ttl_days: int) -> list[Parked]:
        """Holds expire after a day, changes after the policy TTL. The key is the decision's time and
        event, so writing the same decision again (an outbox flushed twice) overwrites, never doubles.

        A decision DynamoDB refuses for good (ValidationException) must not block the others or every
        later flush: it is parked under PARKED#, with the reason, and returned for the caller to count
        and tell. Single-item batches keep to the one permission every function has (BatchWriteItem)."""
        items = [(d, _item(d, audit_ttl_days)) for d in decisions]
        parked: list[Parked] = []
        for batch in chunks(items, 25):
            try:
                self._write([item for _, item in batch])
            except ClientError as exc:
                if not refused_for_good(exc):
                    raise
                parked += [p for d, item in batch if (p := self._one(d, item)) is not None]
        return parked

    def _write(self, items: list[dict[str, Any]]) -> None:
        requests = [{"PutRequest": {"Item": item}} for item in items]
        until_processed(
            self.dynamodb.batch_write_item, {self.table: requests}, "UnprocessedItems", max_wait_s=self.max_wait_s
        )

    def _one(self, d: Decision, item: dict[str, Any]) -> Parked | None:
        try:
            self._write([item])
        except ClientError as exc:
            if not refused_for_good(exc):
                raise
            parked = Parked(d.group, d.event_id, error_message(exc), d.at)
            self._write([_parked_item(d, parked)])
            return parked
        return None

    def recent(self, group_key: str, limit: int = 20) -> list[Decision]:
        resp = self.dynamodb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={":pk": {"S": group_pk(group_key)}, ":prefix": {"S": DECISION_SK_PREFIX}},
            ScanIndexForward=False,
            Limit=limit,
        )
        return [Decision.model_validate(json.loads(i["decision"]["S"])) for i in resp.get("Items", [])]
