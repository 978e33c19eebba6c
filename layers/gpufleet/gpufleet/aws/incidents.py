"""Incidents and silences in the state table, written with conditional checks on a version.

INCIDENT / <incident key>   the incident document (JSON) + version + TTL
SILENCE / <silence id>      one silence (TTL = its expiry)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from gpufleet.aws.clients import error_message, refused_for_good
from gpufleet.domain.errors import StoreRefused
from gpufleet.domain.incidents import Incident, Silence
from gpufleet.domain.keys import bounded
from gpufleet.domain.notification import IncidentState

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

INCIDENT_PK = "INCIDENT"
SILENCE_PK = "SILENCE"
OPEN_TTL = timedelta(days=30)
CLOSED_TTL = timedelta(days=1)


@dataclass
class IncidentStore:
    dynamodb: DynamoDBClient
    table: str

    def get(self, key: str) -> Incident | None:
        item = self.dynamodb.get_item(
            TableName=self.table, Key={"pk": {"S": INCIDENT_PK}, "sk": {"S": bounded(key)}}, ConsistentRead=True
        ).get("Item")
        return _incident(item) if item else None

    def put(self, incident: Incident, expected_version: int | None, now: datetime) -> Incident | None:
        """Store `incident` if nobody wrote since `expected_version` (None: must not exist yet).
        Returns the stored incident (with its new version) or None on a conflict."""
        version = 0 if expected_version is None else expected_version + 1
        stored = incident.model_copy(update={"version": version})
        closed = incident.state is IncidentState.RESOLVED and incident.last_sent_state is IncidentState.RESOLVED
        expires = now + (CLOSED_TTL if closed and incident.in_flight is None else OPEN_TTL)
        condition: dict[str, Any]
        if expected_version is None:
            condition = {"ConditionExpression": "attribute_not_exists(pk)"}
        else:
            condition = {
                "ConditionExpression": "version = :v",
                "ExpressionAttributeValues": {":v": {"N": str(expected_version)}},
            }
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": INCIDENT_PK},
                    "sk": {"S": bounded(incident.key)},
                    "version": {"N": str(version)},
                    "doc": {"S": stored.model_dump_json(exclude={"version"})},
                    "expiration": {"N": str(int(expires.timestamp()))},
                },
                **condition,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return None
            if refused_for_good(exc):
                raise StoreRefused(error_message(exc)) from None
            raise
        return stored

    def all(self) -> list[Incident]:
        return [_incident(item) for item in self._query(INCIDENT_PK)]

    # ---- silences ----

    def put_silence(self, silence: Silence) -> None:
        self.dynamodb.put_item(
            TableName=self.table,
            Item={
                "pk": {"S": SILENCE_PK},
                "sk": {"S": bounded(silence.silence_id)},
                "doc": {"S": silence.model_dump_json()},
                "expiration": {"N": str(int(silence.expires_at.timestamp()))},
            },
        )

    def silences(self, now: datetime) -> list[Silence]:
        """Silences not yet expired (DynamoDB's TTL deletes lazily, so expiry is checked here too)."""
        found = [Silence.model_validate_json(item["doc"]["S"]) for item in self._query(SILENCE_PK)]
        return [s for s in found if s.expires_at > now]

    def expire_silence(self, silence_id: str, now: datetime) -> Silence | None:
        item = self.dynamodb.get_item(
            TableName=self.table, Key={"pk": {"S": SILENCE_PK}, "sk": {"S": bounded(silence_id)}}, ConsistentRead=True
        ).get("Item")
        if not item:
            return None
        silence = Silence.model_validate_json(item["doc"]["S"]).model_copy(update={"expires_at": now})
        self.put_silence(silence)
        return silence

    def _query(self, pk: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
        }
        while True:
            resp = self.dynamodb.query(**kwargs)
            items.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return items
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def _incident(item: dict[str, Any]) -> Incident:
    return Incident.model_validate_json(item["doc"]["S"]).model_copy(update={"version": int(item["version"]["N"])})
