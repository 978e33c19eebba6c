"""The DynamoDB state table: per-group cooldown marks and lease, and the decision audit trail.

One table, keys pk/sk, TTL attribute `expiration` (shared with Powertools Idempotency records):
  GROUP#<key> / STATE                 version, last_scale_out_at, last_scale_in_at, lease
  GROUP#<key> / DECISION#<iso>#<id>   one decision, acted or not (TTL)
  GROUP#<key> / GUARD                 the OOM guard's open risks and health findings, replacement times
  GROUP#<key> / SPOT                  spot_watch: seen activities, backoff, unavailable offerings, fallback owed
  IDEMPOTENCY#<function> / <hash>     Powertools Idempotency
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError
from pydantic import BaseModel

from gpufleet.aws.fleet import chunks
from gpufleet.domain import defaults
from gpufleet.domain.models import Decision, GroupState

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

Doc = TypeVar("Doc", bound=BaseModel)
STATE_SK = "STATE"
GUARD_SK = "GUARD"
DECISION_SK_PREFIX = "DECISION#"
HOLD_TTL = timedelta(days=1)


def group_pk(group_key: str) -> str:
    return f"GROUP#{group_key}"


def _dt(item: dict[str, Any], name: str) -> datetime | None:
    raw = item.get(name, {}).get("S")
    return datetime.fromisoformat(raw) if raw else None


@dataclass
class StateStore:
    dynamodb: DynamoDBClient
    table: str

    def load(self, group_keys: Iterable[str]) -> dict[str, GroupState]:
        """States for the given groups (a group never seen gets a fresh GroupState)."""
        keys = sorted(set(group_keys))
        states = {k: GroupState() for k in keys}
        for batch in chunks(keys, 100):
            request: dict[str, Any] = {
                self.table: {
                    "Keys": [{"pk": {"S": group_pk(k)}, "sk": {"S": STATE_SK}} for k in batch],
                    "ConsistentRead": True,
                }
            }
            while request:
                resp = self.dynamodb.batch_get_item(RequestItems=request)
                for item in resp.get("Responses", {}).get(self.table, []):
                    key = item["pk"]["S"].removeprefix("GROUP#")
                    states[key] = GroupState(
                        version=int(item.get("version", {}).get("N", "0")),
                        last_scale_out_at=_dt(item, "last_scale_out_at"),
                        last_scale_in_at=_dt(item, "last_scale_in_at"),
                    )
                request = resp.get("UnprocessedKeys") or {}
        return states

    def acquire(self, group_key: str, owner: str, seen_version: int, now: datetime) -> bool:
        """Take the group's lease if it is free and nobody changed the group since we read it.

        This is what makes two concurrent invocations produce one change: the loser sees a
        held lease or a newer version and stands down."""
        try:
            self.dynamodb.update_item(
                TableName=self.table,
                Key={"pk": {"S": group_pk(group_key)}, "sk": {"S": STATE_SK}},
                UpdateExpression="SET lease_owner = :o, lease_until = :u",
                ConditionExpression=(
                    "(attribute_not_exists(lease_until) OR lease_until < :now) "
                    "AND (attribute_not_exists(version) OR version = :v)"
                ),
                ExpressionAttributeValues={
                    ":o": {"S": owner},
                    ":u": {"N": str(int(now.timestamp()) + defaults.LEASE_SECONDS)},
                    ":now": {"N": str(int(now.timestamp()))},
                    ":v": {"N": str(seen_version)},
                },
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def commit(self, group_key: str, owner: str, decision: Decision) -> None:
        """Record the change's cooldown mark, bump the version and free the lease, in one write."""
        sets = ["version = if_not_exists(version, :zero) + :one"]
        values: dict[str, Any] = {":zero": {"N": "0"}, ":one": {"N": "1"}, ":o": {"S": owner}}
        if decision.raises_capacity:
            sets.append("last_scale_out_at = :at")
        else:
            sets.append("last_scale_in_at = :at")
        values[":at"] = {"S": decision.at.isoformat()}
        self.dynamodb.update_item(
            TableName=self.table,
            Key={"pk": {"S": group_pk(group_key)}, "sk": {"S": STATE_SK}},
            UpdateExpression="SET " + ", ".join(sets) + " REMOVE lease_owner, lease_until",
            ConditionExpression="lease_owner = :o",
            ExpressionAttributeValues=values,
        )

    def release(self, group_key: str, owner: str) -> None:
        try:
            self.dynamodb.update_item(
                TableName=self.table,
                Key={"pk": {"S": group_pk(group_key)}, "sk": {"S": STATE_SK}},
                UpdateExpression="REMOVE lease_owner, lease_until",
                ConditionExpression="lease_owner = :o",
                ExpressionAttributeValues={":o": {"S": owner}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise

    def record(self, decisions: Iterable[Decision], audit_ttl_days: int) -> None:
        """Audit items for every decision; holds expire after a day, changes after the policy TTL."""
        items = []
        for d in decisions:
            ttl = HOLD_TTL if not d.changes_capacity else timedelta(days=audit_ttl_days)
            items.append(
                {
                    "PutRequest": {
                        "Item": {
                            "pk": {"S": group_pk(d.group)},
                            "sk": {"S": f"{DECISION_SK_PREFIX}{d.at.isoformat()}#{d.event_id}"},
                            "decision": {"S": d.model_dump_json()},
                            "expiration": {"N": str(int((d.at + ttl).timestamp()))},
                        }
                    }
                }
            )
        for batch in chunks(items, 25):
            request: dict[str, Any] = {self.table: list(batch)}
            while request:
                resp = self.dynamodb.batch_write_item(RequestItems=request)
                request = resp.get("UnprocessedItems") or {}

    def recent_decisions(self, group_key: str, limit: int = 20) -> list[Decision]:
        resp = self.dynamodb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={":pk": {"S": group_pk(group_key)}, ":prefix": {"S": DECISION_SK_PREFIX}},
            ScanIndexForward=False,
            Limit=limit,
        )
        return [Decision.model_validate(json.loads(i["decision"]["S"])) for i in resp.get("Items", [])]

    # ---- what other controllers remember about a group (one document per controller) ----

    def load_doc(self, group_key: str, sk: str, model: type[Doc]) -> Doc:
        item = self.dynamodb.get_item(
            TableName=self.table, Key={"pk": {"S": group_pk(group_key)}, "sk": {"S": sk}}, ConsistentRead=True
        ).get("Item")
        if not item:
            return model()
        return model.model_validate_json(item["doc"]["S"]).model_copy(update={"version": int(item["version"]["N"])})

    def load_docs(self, group_keys: Iterable[str], sk: str, model: type[Doc]) -> dict[str, Doc]:
        """Many groups' documents with BatchGetItem (100 keys per call); a missing one is a fresh model."""
        keys = sorted(set(group_keys))
        docs = {k: model() for k in keys}
        for batch in chunks(keys, 100):
            request: dict[str, Any] = {
                self.table: {
                    "Keys": [{"pk": {"S": group_pk(k)}, "sk": {"S": sk}} for k in batch],
                    "ConsistentRead": True,
                }
            }
            while request:
                resp = self.dynamodb.batch_get_item(RequestItems=request)
                for item in resp.get("Responses", {}).get(self.table, []):
                    key = item["pk"]["S"].removeprefix("GROUP#")
                    docs[key] = model.model_validate_json(item["doc"]["S"]).model_copy(
                        update={"version": int(item["version"]["N"])}
                    )
                request = resp.get("UnprocessedKeys") or {}
        return docs

    def save_changes(self, group_key: str, sk: str, before: BaseModel, after: BaseModel) -> bool:
        """Store `after` if it differs from `before` (conditional on before's version). False only when
        someone else wrote the document since it was read."""
        if after.model_dump(exclude={"version"}) == before.model_dump(exclude={"version"}):
            return True
        return self.save_doc(group_key, sk, after, int(getattr(before, "version", 0)))

    def save_doc(self, group_key: str, sk: str, doc: BaseModel, expected_version: int) -> bool:
        """Conditional on the version read: two overlapping runs never both act on the same memory."""
        condition: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(pk)"}
        if expected_version:
            condition = {
                "ConditionExpression": "version = :v",
                "ExpressionAttributeValues": {":v": {"N": str(expected_version)}},
            }
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": group_pk(group_key)},
                    "sk": {"S": sk},
                    "version": {"N": str(expected_version + 1)},
                    "doc": {"S": doc.model_dump_json(exclude={"version"})},
                },
                **condition,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True
