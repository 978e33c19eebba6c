"""Guards for moto blind spots the suite relies on. moto server is threaded and its DynamoDB evaluates a
ConditionExpression and writes without a lock: two concurrent conditional updates of one item could both
succeed (seen: 2 of 60 trials of 8 racing lease-style updates on plain `moto.server`), which DynamoDB never
allows and gpufleet's lease depends on. rehearsal/moto_ext serialises DynamoDB writes; this checks it."""

from __future__ import annotations

import threading

import boto3
import pytest

pytestmark = pytest.mark.integration


def test_concurrent_conditional_updates_of_one_item_have_one_winner(aws: str) -> None:
    ddb = boto3.client("dynamodb")
    ddb.create_table(
        TableName="race",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    winners_per_trial = []
    for trial in range(40):
        wins: list[int] = []
        barrier = threading.Barrier(8)

        def take(
            i: int, key: str = f"group-{trial}", wins: list[int] = wins, barrier: threading.Barrier = barrier
        ) -> None:
            client = boto3.client("dynamodb")
            barrier.wait()
            try:
                client.update_item(
                    TableName="race",
                    Key={"pk": {"S": key}},
                    UpdateExpression="SET intent = :i, lease_until = :u",
                    ConditionExpression="(attribute_not_exists(lease_until) OR lease_until < :now) "
                    "AND attribute_not_exists(intent)",
                    ExpressionAttributeValues={":i": {"S": "x" * 2000}, ":u": {"N": "5"}, ":now": {"N": "1"}},
                )
                wins.append(i)
            except client.exceptions.ConditionalCheckFailedException:
                pass

        threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners_per_trial.append(len(wins))
    assert set(winners_per_trial) == {1}, winners_per_trial
