"""Errors every capability raises the same way: one line that says what was wrong, nothing changed."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\s]+")
ONE_LINE_MAX = 500


def one_line(text: str, limit: int = ONE_LINE_MAX) -> str:
    """Text safe for a one-line error: control characters and line breaks (an event's own keys may hold
    them) become single spaces, lone surrogates are escaped, and it is clipped, so a log line or a DLQ
    reason is never split or lost."""
    flat = _CONTROL.sub(" ", text).strip()
    flat = flat.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate would lose the log line
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class InvalidEvent(ValueError):
    """The event can't be understood; nothing was changed. The message is always one line."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class UnsupportedEvent(InvalidEvent):
    """A well-formed event of a kind this function does not handle; nothing was changed."""


class PolicyError(ValueError):
    """A fleet policy that cannot be used; `problems` are 'where: message (got value)' lines."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid fleet policy:\n  " + "\n  ".join(problems))


class SettingsError(ValueError):
    """A function's environment is missing or has an invalid value (the message names the variable)."""


class ActionFailed(RuntimeError):
    """An alarm-driven change failed after boto3's retries; raised so Lambda retries, then DLQs."""


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith("function-"):  # pydantic's validator frames add noise
            name = one_line(str(part), limit=40)  # a key is input too: it may be huge or hold line breaks
            out += f".{name}" if out else name
    return out or "(document)"


# What a wrong-typed value should have been, in the words of YAML and JSON rather than Python's.
_EXPECTED = {
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "frozen_set_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dataclass_type": "a mapping",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
}


def _shown(value: object) -> str:
    """A bad value, short: scalars as they are (clipped), a mapping by its first keys, a list by its
    length, so an error never echoes a whole event body."""
    if isinstance(value, str | int | float | bool) or value is None:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, dict):
        keys = [f"{one_line(str(k), limit=20)}: ..." for k in list(value)[:3]]
        return "a mapping {" + ", ".join(keys + (["..."] if len(value) > 3 else [])) + "}"
    if isinstance(value, list | tuple | set | frozenset):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}"


def _problem(error: Any) -> str:
    """'where: expected what, got what' for a wrong type; else 'where: message (got value)', the value left
    out where it is a container the message is about (a rule, a missing key's parent): the location names it."""
    where, value = _format_loc(error["loc"]), error.get("input")
    expected = _EXPECTED.get(error["type"])
    if expected is not None:
        return f"{where}: expected {expected}, got {_shown(value)}"
    message = error["msg"].removeprefix("Value error, ")
    wrong_type = str(error["type"]).endswith("_type")
    if error["type"] == "missing" or (not wrong_type and isinstance(value, dict | list | tuple | set | frozenset)):
        return f"{where}: {message}"
    return f"{where}: {message} (got {_shown(value)})"


def describe_validation_error(err: ValidationError, limit: int | None = None) -> list[str]:
    """One line per problem (`_problem`); `limit` keeps the first few and counts the rest."""
    problems = [_problem(e) for e in err.errors()]
    if limit is not None and len(problems) > limit:
        problems = [*problems[:limit], f"and {len(problems) - limit} more"]
    return problems


class StoreRefused(RuntimeError):
    """The state table refused a write for good (DynamoDB ValidationException): retrying cannot help, so
    the caller parks what it was writing instead of failing again and again."""


class ClusterUnreadable(RuntimeError):
    """A cluster's pods could not be read (refused, unreachable, too slow, or an answer that is not a
    PodList). One line that names the cluster and says why; callers log one WARNING and fall back to the
    utilization rules for that cluster's groups. Never carries a token."""

    def __init__(self, cluster: str, cause: str, kind: str = "unreadable") -> None:
        self.cluster = cluster
        self.cause = one_line(cause, limit=300)
        self.kind = kind  # unauthorized, forbidden, timeout, unreachable, tls, expired, http, malformed, ...
        super().__init__(f"cannot read the pods of EKS cluster {cluster}: {self.cause}")
