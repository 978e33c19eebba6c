"""Errors every capability raises the same way: one line that says what was wrong, nothing changed."""

from __future__ import annotations

from pydantic import ValidationError


class InvalidEvent(ValueError):
    """The event can't be understood; nothing was changed."""


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
            out += f".{part}" if out else str(part)
    return out or "(document)"


def _shown(value: object) -> str:
    """A bad value, short: scalars as they are (clipped), containers by their type only, so an error
    never echoes a whole event body."""
    if isinstance(value, str | int | float | bool) or value is None:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"


def describe_validation_error(err: ValidationError, limit: int | None = None) -> list[str]:
    """'where: message (got value)' per problem; `limit` keeps the first few and counts the rest."""
    problems = [
        f"{_format_loc(e['loc'])}: {e['msg'].removeprefix('Value error, ')} (got {_shown(e.get('input'))})"
        for e in err.errors()
    ]
    if limit is not None and len(problems) > limit:
        problems = [*problems[:limit], f"and {len(problems) - limit} more"]
    return problems
