"""EventBridge event-pattern matching (pure), so `gpufleet local send` delivers an event only where the
template's own rules would: a pattern that would not match a real event fails locally too.

The subset of EventBridge's content filtering the template uses, and its neighbours: exact values (any of a
list), `prefix`, `suffix`, `anything-but` (a value, a list or a prefix), `exists`, `equals-ignore-case` and
`numeric` comparisons; nested objects; an event array matches when any element does. A key the pattern
names but the event lacks matches only `{"exists": false}`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

_MISSING = object()
_NUMERIC: dict[str, Callable[[float, float], bool]] = {
    "=": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def matches(pattern: dict[str, Any], event: Any) -> bool:
    """True when `event` (a decoded JSON object) satisfies every field of `pattern`."""
    if not isinstance(event, dict):
        return False
    for key, wanted in pattern.items():
        value = event.get(key, _MISSING)
        if isinstance(wanted, dict):
            if value is _MISSING or not matches(wanted, value):
                return False
        elif not _field_matches(wanted, value):
            return False
    return True


def _field_matches(alternatives: list[Any], value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return any(_one(alt, v) for alt in alternatives for v in values)


def _one(alt: Any, value: Any) -> bool:
    if not isinstance(alt, dict):
        return value is not _MISSING and alt == value
    (op, arg), *_ = alt.items()
    if op == "exists":
        return (value is not _MISSING) is bool(arg)
    if value is _MISSING:
        return False
    if op == "prefix":
        return isinstance(value, str) and isinstance(arg, str) and value.startswith(arg)
    if op == "suffix":
        return isinstance(value, str) and isinstance(arg, str) and value.endswith(arg)
    if op == "equals-ignore-case":
        return isinstance(value, str) and isinstance(arg, str) and value.lower() == arg.lower()
    if op == "anything-but":
        if isinstance(arg, dict):
            return not _one(arg, value)
        return value not in (arg if isinstance(arg, list) else [arg])
    if op == "numeric":
        return _numeric(arg, value)
    raise ValueError(f"unsupported event pattern operator {op!r}")


def _numeric(conditions: list[Any], value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    pairs = zip(conditions[::2], conditions[1::2], strict=True)
    return all(_NUMERIC[op](float(value), float(bound)) for op, bound in pairs)
