"""What the other controllers remember about a group, one JSON document each (GROUP#<key> / GUARD,
GROUP#<key> / SPOT), written conditionally on the version read so two overlapping runs never both act
on the same memory."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from gpufleet.aws.state import batch_get, by_group_pk, conditional, group_pk

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

Doc = TypeVar("Doc", bound=BaseModel)
GUARD_SK = "GUARD"
SPOT_SK = "SPOT"


@dataclass
class DocStore:
    dynamodb: DynamoDBClient
    table: str

    def load_docs(self, group_keys: Iterable[str], sk: str, model: type[Doc]) -> dict[str, Doc]:
        """Many groups' documents with BatchGetItem (100 keys per call); a missing one is a fresh model."""
        keys = by_group_pk(group_keys)
        docs = {k: model() for k in keys.values()}
        for item in batch_get(self.dynamodb, self.table, [(pk, sk) for pk in sorted(keys)]):
            doc = model.model_validate_json(item["doc"]["S"])
            docs[keys[item["pk"]["S"]]] = doc.model_copy(update={"version": int(item["version"]["N"])})
        return docs

    def load_doc(self, group_key: str, sk: str, model: type[Doc]) -> Doc:
        return self.load_docs([group_key], sk, model)[group_key]

    def save_changes(self, group_key: str, sk: str, before: BaseModel, after: BaseModel) -> bool:
        """Store `after` if it differs from `before` (conditional on before's version). False only when
        someone else wrote the document since it was read."""
        if after.model_dump(exclude={"version"}) == before.model_dump(exclude={"version"}):
            return True
        expected = int(getattr(before, "version", 0))
        condition: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(pk)"}
        if expected:
            values = {":v": {"N": str(expected)}}
            condition = {"ConditionExpression": "version = :v", "ExpressionAttributeValues": values}
        return conditional(
            self.dynamodb.put_item,
            TableName=self.table,
            Item={
                "pk": {"S": group_pk(group_key)},
                "sk": {"S": sk},
                "version": {"N": str(expected + 1)},
                "doc": {"S": after.model_dump_json(exclude={"version"})},
            },
            **condition,
        )
