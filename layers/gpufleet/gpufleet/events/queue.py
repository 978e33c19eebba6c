"""Messages on the notification queue: a `Notification` (JSON) or `{"flush": "<incident key>"}`, a
delayed nudge the notifier sends itself. Bounded in size and depth: anything else is rejected with a
reason (the notifier sends it straight to the DLQ), never retried."""

from __future__ import annotations

import json

from pydantic import ValidationError

from gpufleet.domain.errors import describe_validation_error, one_line
from gpufleet.domain.notification import Notification
from gpufleet.domain.values import is_storable

MAX_BODY = 256 * 1024  # SQS's own message limit
MAX_DEPTH = 8  # a notification is three levels deep (links); anything much deeper is not one


class InvalidMessage(ValueError):
    """A queue message that no retry can fix; the message (the DLQ reason) is always one short line."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class Flush(str):
    """The incident key of a flush nudge."""


def _depth(doc: object, limit: int) -> int:
    stack = [(doc, 1)]
    deepest = 0
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack += [(v, level + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, level + 1) for v in node]
    return deepest


def parse_message(body: str) -> Notification | Flush:
    if not isinstance(body, str) or not body:
        raise InvalidMessage("empty message body")
    if len(body) > MAX_BODY:
        raise InvalidMessage(f"message body of {len(body)} characters is larger than {MAX_BODY}")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, 4,300+ digit numbers, deep nesting
        raise InvalidMessage(f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise InvalidMessage(f"expected a JSON object, got {type(doc).__name__}")
    if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise InvalidMessage(f"nested deeper than {MAX_DEPTH} levels: not a notification")
    if set(doc) == {"flush"}:
        key = doc["flush"]
        if isinstance(key, str) and 0 < len(key) <= 400 and is_storable(key):
            return Flush(key)
        raise InvalidMessage("flush: expected an incident key (1-400 characters of valid Unicode)")
    try:
        return Notification.model_validate(doc)
    except ValidationError as err:
        raise InvalidMessage("not a notification: " + "; ".join(describe_validation_error(err, limit=3))) from None
