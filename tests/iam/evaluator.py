"""A small IAM policy evaluator for exactly the statement forms gpufleet's template uses.

No maintained evaluator fits (moto's ignores condition values; PMapper is unmaintained and does not
import on Python >= 3.10). Rules, from AWS's documented policy evaluation logic for identity-based
policies in one account: an explicit Deny wins; otherwise an Allow whose Action, Resource and every
Condition match allows; otherwise the request is implicitly denied.

Supported: Action/NotAction and Resource/NotResource with `*`/`?` wildcards (actions case-insensitive,
resources case-sensitive); Condition operators StringEquals, StringNotEquals, StringLike, StringNotLike,
ArnEquals, ArnLike, Bool, Null; the ForAllValues:/ForAnyValue: set qualifiers and the IfExists suffix.
Within one operator every key must match (AND); a key matches when any of its values matches (OR).

Policy variables (IAM User Guide, "IAM policy elements: Variables and tags"): `${key}` in a Resource and in
the values of string and ARN conditions is replaced by the request context's value of `key` (e.g.
`${aws:userid}`, "ROLEID:i-0123..." for an instance profile's credentials); `${*}`, `${?}` and `${$}` stand
for the literal characters. A variable the request has no value for matches nothing (AWS: "the entire
statement" may not apply), and a substituted value is literal: its `*` or `?` is no wildcard.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Statement = Mapping[str, Any]


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


# A pattern after substitution: (text, literal) pieces; literal text never holds wildcards.
Parts = list[tuple[str, bool]]
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_LITERALS = {"*": "*", "?": "?", "$": "$"}


def substitute(text: str, context: Mapping[str, Any]) -> Parts | None:
    """`text` with its policy variables replaced from the request context; None when one has no value."""
    present = {k.lower(): v for k, v in context.items()}
    parts: Parts = []
    at = 0
    for m in _VARIABLE.finditer(text):
        parts.append((text[at : m.start()], False))
        name = m.group(1).strip()
        if name in _LITERALS:
            parts.append((_LITERALS[name], True))
        elif "," in name:
            raise ValueError(f"policy variable defaults ({m.group(0)}) are not supported by this evaluator")
        else:
            value = present.get(name.lower())
            if value is None or isinstance(value, list | tuple):  # a multivalued key cannot be substituted
                return None
            parts.append((str(value), True))
        at = m.end()
    parts.append((text[at:], False))
    return parts


def _glob(pattern: str | Parts, value: str, case_sensitive: bool = True) -> bool:
    parts = [(pattern, False)] if isinstance(pattern, str) else pattern
    if not case_sensitive:
        parts, value = [(t.lower(), lit) for t, lit in parts], value.lower()
    regex = "".join(
        re.escape(text) if literal else "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)
        for text, literal in parts
    )
    return re.fullmatch(regex, value, re.DOTALL) is not None


def _match_one(operator: str, context_value: Any, policy_value: Any, context: Mapping[str, Any]) -> bool:
    c = str(context_value)
    if operator in ("StringEquals", "ArnEquals", "StringLike", "ArnLike"):
        parts = substitute(str(policy_value), context)
        if parts is None:
            return False
        if operator in ("StringEquals", "ArnEquals"):
            return c == "".join(t for t, _ in parts)
        return _glob(parts, c)
    p = str(policy_value)
    if operator == "Bool":
        return c.lower() == p.lower()
    raise ValueError(f"condition operator {operator} is not supported by this evaluator")


_NEGATED = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike"}


def _key_matches(operator: str, key: str, policy_values: list[Any], context: Mapping[str, Any]) -> bool:
    qualifier, _, op = operator.rpartition(":")
    if_exists = op.endswith("IfExists")
    op = op.removesuffix("IfExists")
    present = {k.lower(): v for k, v in context.items()}
    value = present.get(key.lower())
    if op == "Null":
        return any(str(v).lower() == ("true" if value is None else "false") for v in policy_values)
    if value is None:
        return if_exists or qualifier == "ForAllValues" or op in _NEGATED
    base = _NEGATED.get(op, op)
    values = _list(value)

    def hit(v: Any) -> bool:
        return any(_match_one(base, v, p, context) for p in policy_values)

    if qualifier == "ForAllValues":
        result = all(hit(v) for v in values)
    elif qualifier == "ForAnyValue":
        result = any(hit(v) for v in values)
    else:
        result = any(hit(v) for v in values)
    return not result if op in _NEGATED else result


def conditions_match(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, Any]) -> bool:
    return all(
        _key_matches(operator, key, _list(values), context)
        for operator, keys in conditions.items()
        for key, values in keys.items()
    )


def _resource_matches(pattern: str, resource: str, context: Mapping[str, Any]) -> bool:
    parts = substitute(pattern, context)
    return parts is not None and _glob(parts, resource)


def _applies(statement: Statement, action: str, resource: str, context: Mapping[str, Any]) -> bool:
    if "Action" in statement:
        action_ok = any(_glob(a, action, case_sensitive=False) for a in _list(statement["Action"]))
    else:
        action_ok = not any(_glob(a, action, case_sensitive=False) for a in _list(statement["NotAction"]))
    if "Resource" in statement:
        resource_ok = any(_resource_matches(r, resource, context) for r in _list(statement["Resource"]))
    else:
        resource_ok = not any(_resource_matches(r, resource, context) for r in _list(statement["NotResource"]))
    return action_ok and resource_ok


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    why: str


def evaluate(statements: Iterable[Statement], action: str, resource: str, context: Mapping[str, Any]) -> Verdict:
    """Allowed, or why not (the statements that grant the action and the condition they fail)."""
    statements = list(statements)
    for s in statements:
        if (
            s.get("Effect") == "Deny"
            and _applies(s, action, resource, context)
            and conditions_match(s.get("Condition", {}), context)
        ):
            return Verdict(False, f"explicitly denied by {s.get('Sid', 'a Deny statement')}")
    near: list[str] = []
    for s in statements:
        if s.get("Effect") != "Allow":
            continue
        if _applies(s, action, resource, context):
            if conditions_match(s.get("Condition", {}), context):
                return Verdict(True, f"allowed by {s.get('Sid', 'a statement')}")
            near.append(
                f"{s.get('Sid', 'a statement')} grants it but its condition {dict(s['Condition'])} does not hold"
            )
        elif any(_glob(a, action, case_sensitive=False) for a in _list(s.get("Action", []))):
            near.append(f"{s.get('Sid', 'a statement')} grants it on {_list(s['Resource'])} only")
    return Verdict(False, "; ".join(near) or "no statement grants this action")
