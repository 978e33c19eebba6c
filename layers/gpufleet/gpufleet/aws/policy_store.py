"""The last fleet policy that parsed, kept in the state table (pk POLICY, sk LAST_GOOD): an invalid edit
of the SSM parameter does not stop the fleet; the controllers run on the last good one and say so."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

KEY = {"pk": {"S": "POLICY"}, "sk": {"S": "LAST_GOOD"}}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class LastGood:
    text: str
    source: str
    saved_at: str


@dataclass
class PolicyStore:
    dynamodb: DynamoDBClient
    table: str

    def save(self, text: str, source: str, at: datetime) -> None:
        """Written only when the text differs from what is kept (one write per policy change)."""
        item = {
            **KEY,
            "text": {"S": text},
            "source": {"S": source},
            "saved_at": {"S": at.isoformat(timespec="seconds")},
            "sha": {"S": digest(text)},
        }
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item=item,
                ConditionExpression="attribute_not_exists(sha) OR sha <> :sha",
                ExpressionAttributeValues={":sha": item["sha"]},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise

    def load(self) -> LastGood | None:
        item = self.dynamodb.get_item(TableName=self.table, Key=KEY, ConsistentRead=True).get("Item")
        if not item:
            return None
        return LastGood(item["text"]["S"], item["source"]["S"], item["saved_at"]["S"])
