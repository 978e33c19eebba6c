"""The decision audit trail: one item per decision, acted or not (`gpufleet explain` reads it)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpufleet.aws.fleet import chunks
from gpufleet.aws.state import group_pk
from gpufleet.domain.models import Decision

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

DECISION_SK_PREFIX = "DECISION#"
HOLD_TTL = timedelta(days=1)


@dataclass
class AuditLog:
    dynamodb: DynamoDBClient
    table: str

    def record(self, decisions: Iterable[Decision], audit_ttl_days: int) -> None:
        """Holds expire after a day, changes after the policy TTL. The key is the decision's time and
        event, so writing the same decision again (an outbox flushed twice) overwrites, never doubles."""
        items = []
        for d in decisions:
            ttl = HOLD_TTL if not d.changes_capacity else timedelta(days=audit_ttl_days)
            item = {
                "pk": {"S": group_pk(d.group)},
                "sk": {"S": f"{DECISION_SK_PREFIX}{d.at.isoformat()}#{d.event_id}"},
                "decision": {"S": d.model_dump_json()},
                "expiration": {"N": str(int((d.at + ttl).timestamp()))},
            }
            items.append({"PutRequest": {"Item": item}})
        for batch in chunks(items, 25):
            request: dict[str, Any] = {self.table: list(batch)}
            while request:
                resp = self.dynamodb.batch_write_item(RequestItems=request)
                request = dict(resp.get("UnprocessedItems") or {})

    def recent(self, group_key: str, limit: int = 20) -> list[Decision]:
        resp = self.dynamodb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={":pk": {"S": group_pk(group_key)}, ":prefix": {"S": DECISION_SK_PREFIX}},
            ScanIndexForward=False,
            Limit=limit,
        )
        return [Decision.model_validate(json.loads(i["decision"]["S"])) for i in resp.get("Items", [])]
