"""Each group's STATE item: cooldown marks, the lease, the change in progress and the outbox.

One table, keys pk/sk, TTL attribute `expiration` (shared with the audit, the controllers' documents,
the incidents and Powertools Idempotency records; `gpufleet local up` creates it from the template):
  GROUP#<key> / STATE                 version, last_scale_out_at, last_scale_in_at, lease_owner, lease_until,
                                      intent (a change begun), intent_attempts, outbox (changes not yet told),
                                      owed#<spot group> (the fallback ledger), marks_failed_at,
                                      gang_gave_back_at (gangs rest after a partial launch given back)
  GROUP#<key> / DECISION#<iso>#<id>   one decision, acted or not (aws/audit.py)
  GROUP#<key> / GUARD | SPOT          the OOM guard's and spot_watch's documents (aws/documents.py)
  INCIDENT / <key>, SILENCE / <id>    the notifier's incidents and silences (aws/incidents.py)
  IDEMPOTENCY#<function> / <hash>     Powertools Idempotency

A change is crash-consistent: `begin` takes the lease and persists the decision as the intent in one
conditional write, before any AWS call; `commit` records the cooldown mark, the ledger and the outbox
entry and clears lease and intent in one write. An invocation that dies in between leaves the intent,
and the next one `take_over`s it and finishes it (the actions are idempotent) instead of deciding anew.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from gpufleet.aws.clients import chunks
from gpufleet.domain import defaults
from gpufleet.domain.keys import joined
from gpufleet.domain.models import Decision, ForeignChange, GroupState, Outcome, TriggerKind

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

STATE_SK = "STATE"
OWED_PREFIX = "owed#"


GROUP_PK_PREFIX = "GROUP#"


def group_pk(group_key: str) -> str:
    """The group's partition key: bounded, so a group named in hundreds of four-byte characters still fits."""
    return joined(GROUP_PK_PREFIX, group_key)


def by_group_pk(group_keys: Iterable[str]) -> dict[str, str]:
    """Partition key -> group key, to read a batch's items back (a long key is not its group's name)."""
    return {group_pk(k): k for k in group_keys}


class BatchNotProcessed(RuntimeError):
    """DynamoDB kept refusing part of a batch (throttled) after every backed-off retry."""


def until_processed(
    call: Callable[..., Any],
    request: dict[str, Any],
    left_key: str,
    sleep: Callable[[float], None] | None = None,
    max_wait_s: float = defaults.BATCH_WAIT_MAX_S,
) -> list[dict[str, Any]]:
    """Send a batch request again for what DynamoDB left unprocessed, with capped, jittered exponential
    backoff ("full jitter"), at most BATCH_ATTEMPTS times and `max_wait_s` of waiting in all: a throttled
    table is waited for, not hammered in a tight loop, and one that never recovers ends in an error in
    time for the caller's own deadline (the termination policy has 2 s in all)."""
    responses, waited = [], 0.0
    for attempt in range(defaults.BATCH_ATTEMPTS):
        resp = call(RequestItems=request)
        responses.append(resp)
        request = dict(resp.get(left_key) or {})
        if not request:
            return responses
        pause = random.uniform(0, min(defaults.BATCH_BACKOFF_CAP_S, defaults.BATCH_BACKOFF_BASE_S * 2**attempt))
        if attempt == defaults.BATCH_ATTEMPTS - 1 or waited + pause > max_wait_s:
            break
        (sleep or time.sleep)(pause)
        waited += pause
    left = sum(len(v.get("Keys", v) if isinstance(v, dict) else v) for v in request.values())
    raise BatchNotProcessed(
        f"DynamoDB left {left} items unprocessed after {len(responses)} backed-off tries ({waited:.1f} s)"
    )


def batch_get(dynamodb: DynamoDBClient, table: str, keys: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Items for (pk, sk) keys, 100 per BatchGetItem, unprocessed keys retried with backoff."""
    found: list[dict[str, Any]] = []
    for batch in chunks(keys, 100):
        request: dict[str, Any] = {
            table: {"Keys": [{"pk": {"S": pk}, "sk": {"S": sk}} for pk, sk in batch], "ConsistentRead": True}
        }
        for resp in until_processed(dynamodb.batch_get_item, request, "UnprocessedKeys"):
            found.extend(resp.get("Responses", {}).get(table, []))
    return found


def conditional(call: Any, **kwargs: Any) -> bool:
    """A conditional write: True if it happened, False if its condition did not hold."""
    try:
        call(**kwargs)
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return False
        raise
    return True


def _dt(item: dict[str, Any], name: str) -> datetime | None:
    raw = item.get(name, {}).get("S")
    return datetime.fromisoformat(raw) if raw else None


def _state(item: dict[str, Any]) -> GroupState:
    until = item.get("lease_until", {}).get("N")
    intent = item.get("intent", {}).get("S")
    return GroupState(
        version=int(item.get("version", {}).get("N", "0")),
        last_scale_out_at=_dt(item, "last_scale_out_at"),
        last_scale_out_added=int(item.get("last_scale_out_added", {}).get("N", "0")),
        last_scale_in_at=_dt(item, "last_scale_in_at"),
        lease_owner=item.get("lease_owner", {}).get("S"),
        lease_until=datetime.fromtimestamp(int(until), UTC) if until else None,
        intent=Decision.model_validate_json(intent) if intent else None,
        intent_attempts=int(item.get("intent_attempts", {}).get("N", "0")),
        outbox=tuple(Decision.model_validate_json(e["S"]) for e in item.get("outbox", {}).get("L", [])),
        owed={k.removeprefix(OWED_PREFIX): int(v["N"]) for k, v in item.items() if k.startswith(OWED_PREFIX)},
        seen_desired=int(item["seen_desired"]["N"]) if "seen_desired" in item else None,
        foreign=tuple(ForeignChange.model_validate_json(e["S"]) for e in item.get("foreign_changes", {}).get("L", [])),
        stand_aside_until=_dt(item, "stand_aside_until"),
        marks_failed_at=_dt(item, "marks_failed_at"),
        gang_gave_back_at=_dt(item, "gang_gave_back_at"),
    )


@dataclass
class StateStore:
    dynamodb: DynamoDBClient
    table: str

    def _key(self, group_key: str) -> dict[str, Any]:
        return {"pk": {"S": group_pk(group_key)}, "sk": {"S": STATE_SK}}

    def load(self, group_keys: Iterable[str]) -> dict[str, GroupState]:
        """States for the given groups (a group never seen gets a fresh GroupState)."""
        keys = by_group_pk(group_keys)
        states = {k: GroupState() for k in keys.values()}
        for item in batch_get(self.dynamodb, self.table, [(pk, STATE_SK) for pk in sorted(keys)]):
            states[keys[item["pk"]["S"]]] = _state(item)
        return states

    def begin(self, decision: Decision, owner: str, seen_version: int) -> bool:
        """Take the group's lease and persist the change as its intent, in one conditional write: only
        if the lease is free, nobody changed the group since it was read (its version) and no other
        change is in progress. Two concurrent invocations thus make one change."""
        now = int(decision.at.timestamp())
        return conditional(
            self.dynamodb.update_item,
            TableName=self.table,
            Key=self._key(decision.group),
            UpdateExpression="SET lease_owner = :o, lease_until = :u, intent = :i, intent_attempts = :one",
            ConditionExpression=(
                "(attribute_not_exists(lease_until) OR lease_until < :now) "
                "AND (attribute_not_exists(version) OR version = :v) AND attribute_not_exists(intent)"
            ),
            ExpressionAttributeValues={
                ":o": {"S": owner},
                ":u": {"N": str(now + defaults.LEASE_SECONDS)},
                ":now": {"N": str(now)},
                ":v": {"N": str(seen_version)},
                ":i": {"S": decision.model_dump_json()},
                ":one": {"N": "1"},
            },
        )

    def take_over(self, group_key: str, owner: str, event_id: str, now: datetime) -> bool:
        """Take the lease of a change begun by an invocation that did not finish it: when its lease has
        expired, or when this is a retry of the same event (its owner starts with the event id)."""
        at = int(now.timestamp())
        return conditional(
            self.dynamodb.update_item,
            TableName=self.table,
            Key=self._key(group_key),
            UpdateExpression="SET lease_owner = :o, lease_until = :u, intent_attempts = intent_attempts + :one",
            ConditionExpression=(
                "attribute_exists(intent) AND (attribute_not_exists(lease_until) OR lease_until < :now "
                "OR begins_with(lease_owner, :event))"
            ),
            ExpressionAttributeValues={
                ":o": {"S": owner},
                ":u": {"N": str(at + defaults.LEASE_SECONDS)},
                ":now": {"N": str(at)},
                ":event": {"S": f"{event_id}#"},
                ":one": {"N": "1"},
            },
        )

    def commit(self, owner: str, done: Decision) -> bool:
        """The change is done (or given up): its cooldown mark, the fallback ledger, the outbox entry,
        a new version, and the lease and intent cleared, in one write. False if the lease was lost."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {
            ":zero": {"N": "0"},
            ":one": {"N": "1"},
            ":o": {"S": owner},
            ":entry": {"L": [{"S": done.model_dump_json()}]},
            ":none": {"L": []},
        }
        sets = ["version = if_not_exists(version, :zero) + :one", "seen_desired = :seen"]
        if done.changes_capacity or not done.changes_marks:  # node marks alone start no cooldown
            names["#mark"] = "last_scale_out_at" if done.raises_capacity else "last_scale_in_at"
            values[":at"] = {"S": done.at.isoformat()}
            sets.append("#mark = :at")
        values[":seen"] = {"N": str(done.desired)}  # gpufleet's own change is never mistaken for someone else's
        if done.raises_capacity:  # the nodes on their way, for the next ticks' demand (core: on_the_way)
            sets.append("last_scale_out_added = :added")
            values[":added"] = {"N": str(max(0, done.desired - done.current))}
        sets.append("outbox = list_append(if_not_exists(outbox, :none), :entry)")
        removes = ["lease_owner", "lease_until", "intent", "intent_attempts"]
        if done.changes_marks and done.outcome is Outcome.FAILED:  # marks rest a while (scaling.consolidate)
            values[":marks_at"] = {"S": done.at.isoformat()}
            sets.append("marks_failed_at = :marks_at")
        elif done.changes_marks:
            removes.append("marks_failed_at")
        if done.trigger.kind is TriggerKind.GANG_PARTIAL and done.outcome is not Outcome.FAILED:
            values[":gang_at"] = {"S": done.at.isoformat()}  # gangs rest from now (scaling.core)
            sets.append("gang_gave_back_at = :gang_at")
        if done.owed_to:
            names["#owed"] = OWED_PREFIX + done.owed_to
            values[":delta"] = {"N": str(done.desired - done.current)}
            sets.append("#owed = if_not_exists(#owed, :zero) + :delta")
        return conditional(
            self.dynamodb.update_item,
            TableName=self.table,
            Key=self._key(done.group),
            UpdateExpression="SET " + ", ".join(sets) + " REMOVE " + ", ".join(removes),
            ConditionExpression="lease_owner = :o",
            ExpressionAttributeValues=values,
            **({"ExpressionAttributeNames": names} if names else {}),
        )

    def note_desired(self, group_key: str, before: int | None, after: GroupState) -> bool:
        """Remember the desired capacity gpufleet saw, the changes it did not make and whether it stands
        aside (`after`): only if the seen value is still `before`, so concurrent ticks note a change once."""
        values: dict[str, Any] = {
            ":seen": {"N": str(after.seen_desired)},
            ":foreign": {"L": [{"S": c.model_dump_json()} for c in after.foreign[-defaults.FOREIGN_KEPT :]]},
        }
        sets = ["seen_desired = :seen", "foreign_changes = :foreign"]
        if after.stand_aside_until is not None:
            sets.append("stand_aside_until = :until")
            values[":until"] = {"S": after.stand_aside_until.isoformat()}
        if before is None:
            condition = "attribute_not_exists(seen_desired)"
        else:
            condition = "seen_desired = :before"
            values[":before"] = {"N": str(before)}
        return conditional(
            self.dynamodb.update_item,
            TableName=self.table,
            Key=self._key(group_key),
            UpdateExpression="SET " + ", ".join(sets),
            ConditionExpression=condition,
            ExpressionAttributeValues=values,
        )

    def replace_intent(self, owner: str, decision: Decision) -> bool:
        """The change in progress rewritten before it is carried out (victims the last look kept dropped,
        or a stale change decided again), under the lease this owner holds. False if the lease was lost."""
        return conditional(
            self.dynamodb.update_item,
            TableName=self.table,
            Key=self._key(decision.group),
            UpdateExpression="SET intent = :i",
            ConditionExpression="lease_owner = :o",
            ExpressionAttributeValues={":o": {"S": owner}, ":i": {"S": decision.model_dump_json()}},
        )

    def drop_intent(self, group_key: str, owner: str) -> bool:
        """The change in progress has nothing left to do (the last look kept every victim, or deciding it
        again holds): intent and lease cleared, a new version, no cooldown mark. False if the lease was lost."""
        return conditional(
            self.dynamodb.update_item,
            TableName=self.table,
            Key=self._key(group_key),
            UpdateExpression=(
                "SET version = if_not_exists(version, :zero) + :one "
                "REMOVE lease_owner, lease_until, intent, intent_attempts"
            ),
            ConditionExpression="lease_owner = :o",
            ExpressionAttributeValues={":o": {"S": owner}, ":zero": {"N": "0"}, ":one": {"N": "1"}},
        )

    def release(self, group_key: str, owner: str) -> None:
        """Free the lease and keep the intent: the next invocation finishes the change."""
        conditional(
            self.dynamodb.update_item,
            TableName=self.table,
            Key=self._key(group_key),
            UpdateExpression="REMOVE lease_owner, lease_until",
            ConditionExpression="lease_owner = :o",
            ExpressionAttributeValues={":o": {"S": owner}},
        )

    def clear_outbox(self, group_key: str, told: int) -> bool:
        """Drop the outbox once its `told` entries were audited and queued (unless more were added)."""
        return conditional(
            self.dynamodb.update_item,
            TableName=self.table,
            Key=self._key(group_key),
            UpdateExpression="REMOVE outbox",
            ConditionExpression="size(outbox) = :n",
            ExpressionAttributeValues={":n": {"N": str(told)}},
        )
