"""The mutation operators every fuzz test shares (tests/unit/test_fuzz_inputs.py), and checks that they do
what a hostile probe would: lone surrogates and 4-byte characters in every string field, 300+ characters
of 4-byte text, keys dropped or renamed, wrong types, huge, negative and NaN-ish numbers, deep nesting,
extreme or naive timestamps, duplicated records, JSON inside strings mutated in place.

One set of operators, two drivers: hypothesis draws every choice (`DrawChooser`: structure-aware, it
shrinks a failure to a small example), and a seeded `random.Random` (`RandomChooser`) makes the same
choices cheaply for volume. A bulk run keeps, per distinct crash signature (exception type and the
library line that raised it), the smallest input, shrunk further by deleting what it can.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")

LONE_SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff")
FOUR_BYTE = ("\U0001f525", "\U00010348", "\U0001f600", "\U000e0041", "\U0010fffd")
LONG_4BYTE_MIN = 300  # characters, each 4 bytes in UTF-8
WEIRD_TIMES = (
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "2026-11-23T08:00:00",  # naive
    "2026-11-23T08:00:00.123456789Z",  # nanoseconds
    "1969-12-31T23:59:59Z",
    "1970-01-01T00:00:00Z",
    "2099-12-31T23:59:59-23:59",  # within range, its offset moves it past 2100
    "2100-01-01T00:00:00Z",
    "2026-02-30T00:00:00Z",
    "2026-11-23T24:00:00Z",
    "+002026-11-23T08:00:00Z",
    "2026-11-23",
    "1700000000",
    "",
)
NUMBERS: tuple[Any, ...] = (
    0,
    -1,
    -(2**63),
    2**63,
    2**64 + 1,
    10**40,
    -(10**40),
    10**4000 - 1,  # 4,000 digits: json.loads still reads it (its limit is 4,300)
    float("nan"),
    float("inf"),
    float("-inf"),
    -0.0,
    1e308,
    5e-324,
    0.5,
    True,
    "1",
    "NaN",
    "-Infinity",
)
SCALARS: tuple[Any, ...] = (None, True, False, 0, 1.5, "", "x", "EXAMPLE", "<!channel> *b* &amp;", "Records")
DEPTHS = (40, 600, 3000)  # 600: json.loads reads it (the Lambda runtime would deliver it); 3000: it would not
_TEXT = st.text(max_size=40) | st.sampled_from([*LONE_SURROGATES, *FOUR_BYTE, *WEIRD_TIMES])
JSON_VALUES = st.recursive(  # hypothesis's own JSON values: any shape, shrinkable
    st.none() | st.booleans() | st.integers(-(10**40), 10**40) | st.floats() | _TEXT | st.sampled_from(NUMBERS),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=10,
)
DEEP = "__deep__:"
SENTINELS = {f"{DEEP}{depth}": depth for depth in DEPTHS}


class Chooser(Protocol):
    def pick(self, options: Sequence[T]) -> T: ...

    def number(self, low: int, high: int) -> int: ...

    def json_value(self) -> Any: ...


class RandomChooser:
    """Choices from a seeded `random.Random`: the same inputs on every run, at volume."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def number(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def json_value(self) -> Any:
        """A small JSON value: a scalar, a hostile number or text, or a short list or object of them."""
        leaf = self.pick((self.pick(SCALARS), self.pick(NUMBERS), hostile_text("x", self)))
        return self.pick((leaf, [leaf, leaf], {hostile_text("k", self): leaf}))


class DrawChooser:
    """Choices drawn by hypothesis (inside `st.composite`), so a failure shrinks."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def pick(self, options: Sequence[T]) -> T:
        return self.draw(st.sampled_from(options))

    def number(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def json_value(self) -> Any:
        return self.draw(JSON_VALUES)


# ---- text ----


def hostile_text(original: str, c: Chooser) -> str:
    """What a probe puts in a string field: a lone surrogate or a 4-byte character somewhere in it, 300+
    characters of 4-byte text (with or without a surrogate), control characters, a weird timestamp."""
    at = c.number(0, len(original))
    kind = c.pick(("surrogate", "four-byte", "long-four-byte", "long-four-byte", "long-surrogate", "other"))
    if kind == "surrogate":
        return original[:at] + c.pick(LONE_SURROGATES) + original[at:]
    if kind == "four-byte":
        return original[:at] + c.pick(FOUR_BYTE) + original[at:]
    if kind in ("long-four-byte", "long-surrogate"):
        long = c.pick(FOUR_BYTE) * c.number(LONG_4BYTE_MIN, 1200)
        return long + (c.pick(LONE_SURROGATES) if kind == "long-surrogate" else "")
    return c.pick(
        (
            "",
            " ",
            original + "\n\r\x00\u2028\u202e",
            original.upper(),
            original * 40,
            "x" * 5000,
            "9" * 5000,
            c.pick(LONE_SURROGATES) * 3,
            c.pick(WEIRD_TIMES),
        )
    )


def is_long_four_byte(text: Any) -> bool:
    return isinstance(text, str) and sum(1 for ch in text if ord(ch) > 0xFFFF) >= LONG_4BYTE_MIN


# ---- structure ----


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document (the root is `()`), never inside a buried deep value."""
    out = [prefix]
    if len(prefix) > 12:
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


def get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    get(doc, path[:-1])[path[-1]] = value
    return doc


def _other_type(value: Any, c: Chooser) -> Any:
    """A value of another JSON type than `value` (a string where a number was, an object for a list, ...)."""
    options = [None, True, 0, 1.5, "x", [], {}, [value], {"value": value}, str(value)[:50]]
    return c.pick([o for o in options if type(o) is not type(value)])


def _embedded(text: str) -> Any:
    """The JSON document inside a string field (an SNS Message, an SQS body, a detail "{}"), if any."""
    if text[:1] not in ("{", "["):
        return None
    with contextlib.suppress(ValueError, RecursionError):
        return json.loads(text)
    return None


OPS = (
    *("delete", "text", "text", "number", "type", "time", "deep"),
    *("duplicate", "wrap", "rename", "empty", "embedded", "value"),
)


def _apply(doc: Any, path: tuple[Any, ...], op: str, c: Chooser) -> Any:
    """One change at `path`; `op` names it (see OPS)."""
    value = get(doc, path)
    parent: Any = get(doc, path[:-1]) if path else None
    if op == "delete" and path:
        del parent[path[-1]]
        return doc
    if op == "rename" and path and isinstance(parent, dict):
        key = path[-1]
        parent[hostile_text(str(key), c)] = parent.pop(key)
        return doc
    if op == "duplicate" and path and isinstance(parent, list):
        parent.insert(path[-1], copy.deepcopy(value))
        return doc
    if op == "embedded" and isinstance(value, str) and (inner := _embedded(value)) is not None:
        return _set(doc, path, json.dumps(mutate(inner, c, 1, Counter())))
    new: Callable[[], Any] = {
        "text": lambda: hostile_text(value if isinstance(value, str) else str(value)[:40], c),
        "number": lambda: c.pick(NUMBERS),
        "type": lambda: _other_type(value, c),
        "time": lambda: c.pick(WEIRD_TIMES),
        "deep": lambda: f"{DEEP}{c.pick(DEPTHS)}",
        "wrap": lambda: [value],
        "empty": lambda: c.pick(({}, [], "", None)),
    }.get(op, c.json_value)
    return _set(doc, path, new())


def _targets(doc: Any, op: str) -> list[tuple[Any, ...]]:
    """Where `op` can act: text ops on strings first (every string field is a target), renames on keys."""
    found = paths(doc)
    if op in ("text", "embedded"):
        strings = [p for p in found if isinstance(get(doc, p), str)]
        return strings or found
    if op in ("delete", "rename"):
        return [p for p in found if p] or found
    if op == "duplicate":
        return [p for p in found if p and isinstance(get(doc, p[:-1]), list)] or found
    return found


def mutate(doc: Any, c: Chooser, changes: int, tally: Counter[str]) -> Any:
    """`changes` operators applied to a copy of `doc`; `tally` counts the operators used."""
    doc = copy.deepcopy(doc)
    for _ in range(changes):
        op = c.pick(OPS)
        path = c.pick(_targets(doc, op))
        with contextlib.suppress(KeyError, IndexError, TypeError):  # an earlier change moved the path
            doc = _apply(doc, path, op, c)
            tally[op] += 1
    return doc


def expand(doc: Any) -> Any:
    """The document with each deep sentinel replaced by a value nested that many levels."""
    if isinstance(doc, str) and doc in SENTINELS:
        return nested(SENTINELS[doc])
    if isinstance(doc, dict):
        return {k: expand(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [expand(v) for v in doc]
    return doc


def nested(depth: int) -> Any:
    node: Any = "bottom"
    for level in range(depth):
        node = {"a": node} if level % 2 else [node]
    return node


def encoded(doc: Any) -> str:
    """The document as JSON text (lone surrogates escaped, as json.dumps writes them), deep sentinels
    spliced in as text (json.dumps itself would recurse)."""
    text = json.dumps(doc)
    for depth in DEPTHS:
        text = text.replace(json.dumps(f"{DEEP}{depth}"), '[{"a": ' * (depth // 2) + "0" + "}]" * (depth // 2))
    return text


# ---- the sweep: every string field and key, each hostile text ----

PROBES: tuple[Callable[[str], str], ...] = (
    lambda s: s + LONE_SURROGATES[0],  # a lone high surrogate at the end
    lambda s: LONE_SURROGATES[2] + s,  # a lone low one in front
    lambda s: s[:1] + FOUR_BYTE[0] + s[1:],  # one 4-byte character inside
    lambda s: FOUR_BYTE[1] * LONG_4BYTE_MIN,  # 300 4-byte characters (1,200 bytes)
    lambda s: FOUR_BYTE[2] * 2 * LONG_4BYTE_MIN + LONE_SURROGATES[3],  # 600 of them, then a lone surrogate
)


def sweep(doc: Any) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(where, document) with each probe in turn in each string field and each key of `doc`, inside the
    JSON a string field holds too (an SNS Message, an SQS body): every string field, not a sample."""
    for path in paths(doc):
        value = get(doc, path)
        if isinstance(value, str) and (inner := _embedded(value)) is not None:
            for where, changed in sweep(inner):
                yield (*path, *where), _set(copy.deepcopy(doc), path, json.dumps(changed))
        elif isinstance(value, str):
            for probe in PROBES:
                yield path, _set(copy.deepcopy(doc), path, probe(value))
        if path and isinstance(get(doc, path[:-1]), dict):
            for probe in PROBES[::3]:
                changed = copy.deepcopy(doc)
                parent = get(changed, path[:-1])
                parent[probe(str(path[-1]))] = parent.pop(path[-1])
                yield (*path[:-1], "{key}"), changed


# ---- bulk runs: crash signatures and shrinking ----


def signature(exc: BaseException) -> str:
    """The exception type and the innermost frame in gpufleet's own code (else the innermost frame); for a
    value accepted but unusable, the field it is in (`where`)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/layers/" in f.filename or "/tools/" in f.filename] or frames[-1:]
    if not ours:
        return type(exc).__name__
    place = f"{'/'.join(Path(ours[-1].filename).parts[-2:])}:{ours[-1].lineno} ({ours[-1].name})"
    where = getattr(exc, "where", None)
    return f"{type(exc).__name__} at {place}" + (f": {where}" if where else "")


def _smaller_text(text: str) -> list[Any]:
    """Text one step smaller: JSON text shrunk as its document, other text by a line dropped or halved."""
    doc = _embedded(text)
    if doc is not None:
        return [json.dumps(d) for d in _smaller(doc)]
    lines = text.splitlines(keepends=True)
    dropped = ["".join(lines[:i] + lines[i + 1 :]) for i in range(len(lines))] if len(lines) > 1 else []
    halved = ["".join([*lines[:i], line[: len(line) // 2], *lines[i + 1 :]]) for i, line in enumerate(lines)]
    return dropped + [h for h in halved if h != text]


def _smaller(doc: Any) -> list[Any]:
    """Candidates one step smaller: each place deleted, each long string cut to its first 40 characters."""
    if isinstance(doc, str):
        return _smaller_text(doc)
    out = []
    for path in paths(doc):
        if not path:
            continue
        candidate = copy.deepcopy(doc)
        with contextlib.suppress(KeyError, IndexError, TypeError):
            del get(candidate, path[:-1])[path[-1]]
            out.append(candidate)
        value = get(doc, path)
        if isinstance(value, str) and len(value) > 40:
            out.append(_set(copy.deepcopy(doc), path, value[:40]))
    return out


def shrink(doc: Any, crashes_the_same: Callable[[Any], bool], budget: int = 400) -> Any:
    """Greedy: keep any one-step-smaller input that still fails with the same signature."""
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for candidate in _smaller(doc):
            tries += 1
            if crashes_the_same(candidate):
                doc, improved = candidate, True
                break
    return doc


class Crashes:
    """Distinct crash signatures of one bulk run, each with its smallest input (shrunk on report)."""

    def __init__(self) -> None:
        self.found: dict[str, Any] = {}
        self.count = 0

    def add(self, exc: BaseException, given: Any) -> None:
        self.count += 1
        key = signature(exc)
        if key not in self.found or len(repr(given)) < len(repr(self.found[key])):
            self.found[key] = given

    def report(self, check: Callable[[Any], str]) -> str:
        lines = []
        for key, given in sorted(self.found.items()):

            def same(candidate: Any, key: str = key) -> bool:
                try:
                    check(candidate)
                except Exception as exc:
                    return signature(exc) == key
                return False

            lines.append(f"{key}\n    reproducer: {shrink(given, same)!r:.1500}")
        return f"{self.count} crashes, {len(lines)} distinct:\n" + "\n".join(lines)


def bulk(
    check: Callable[[Any], str], make: Callable[[RandomChooser], Any], n: int, seed: str
) -> tuple[Counter[str], Crashes]:
    """`n` inputs from `make`, each given to `check`, which returns its outcome (accepted, rejected, ...);
    any exception it raises is a crash, kept by signature with its smallest input."""
    c = RandomChooser(random.Random(seed))
    outcomes: Counter[str] = Counter()
    crashes = Crashes()
    for _ in range(n):
        given = make(c)
        try:
            outcomes[check(given)] += 1
        except Exception as exc:
            crashes.add(exc, given)
    return outcomes, crashes


# ---- the operators do what they say ----

SAMPLE = {
    "Records": [{"Sns": {"MessageId": "m-1", "Message": json.dumps({"AlarmName": "gpu-high", "NewStateValue": "OK"})}}],
    "detail": {"Details": {"Availability Zone": "us-east-1a"}, "count": 3, "ok": True},
}


def _texts(c: Chooser, n: int) -> list[str]:
    return [hostile_text("us-east-1a", c) for _ in range(n)]


def _has_lone_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


def test_hostile_text_brings_each_probe() -> None:
    texts = _texts(RandomChooser(random.Random(1)), 400)
    assert any(_has_lone_surrogate(t) for t in texts)
    assert any(any(ord(ch) > 0xFFFF for ch in t) and not is_long_four_byte(t) for t in texts)
    long = [t for t in texts if is_long_four_byte(t)]
    assert long and all(len(t.encode("utf-8", "surrogatepass")) >= 4 * LONG_4BYTE_MIN for t in long)
    assert any(is_long_four_byte(t) and _has_lone_surrogate(t) for t in texts)
    assert set(WEIRD_TIMES) & set(texts)


def test_each_operator_changes_the_document() -> None:
    c = RandomChooser(random.Random(2))
    for op in OPS:
        changed = [_apply(copy.deepcopy(SAMPLE), c.pick(_targets(SAMPLE, op)), op, c) for _ in range(30)]
        assert any(d != SAMPLE for d in changed), op


def test_mutate_leaves_its_seed_alone_and_counts_the_operators() -> None:
    before = copy.deepcopy(SAMPLE)
    used: Counter[str] = Counter()
    c = RandomChooser(random.Random(3))
    docs = [mutate(SAMPLE, c, 3, used) for _ in range(300)]
    assert before == SAMPLE and sum(used.values()) > 0 and set(used) >= set(OPS) - {"embedded"}
    assert any(d != SAMPLE for d in docs)


def test_the_embedded_operator_mutates_json_inside_a_string_field() -> None:
    c = RandomChooser(random.Random(4))
    path = ("Records", 0, "Sns", "Message")
    inner = [_apply(copy.deepcopy(SAMPLE), path, "embedded", c) for _ in range(20)]
    messages = [get(d, path) for d in inner]
    assert all(isinstance(m, str) for m in messages) and any(m != get(SAMPLE, path) for m in messages)


def test_deep_values_nest_as_deep_as_they_say() -> None:
    for depth in DEPTHS:
        value, levels = expand({"a": f"{DEEP}{depth}"})["a"], 0
        while isinstance(value, dict | list):
            value, levels = (value["a"] if isinstance(value, dict) else value[0]), levels + 1
        assert levels == depth
        text = encoded([f"{DEEP}{depth}"])
        assert text.count("[") + text.count("{") >= depth


def test_the_sweep_reaches_every_string_field_key_and_embedded_json() -> None:
    wheres = {where for where, _ in sweep(SAMPLE)}
    assert ("detail", "Details", "Availability Zone") in wheres
    assert ("Records", 0, "Sns", "Message", "AlarmName") in wheres  # inside the JSON of a string field
    assert ("detail", "Details", "{key}") in wheres
    assert len([w for w, _ in sweep(SAMPLE) if w == ("detail", "Details", "Availability Zone")]) == len(PROBES)


def test_a_crash_is_named_by_type_and_line_and_shrunk_to_what_triggers_it() -> None:
    def check(doc: Any) -> str:
        if isinstance(doc, dict) and doc.get("bad") == 1:
            raise KeyError("bad")
        return "accepted"

    crashes = Crashes()
    for given in ({"bad": 1, "noise": [1, 2, {"x": "y" * 100}]}, {"bad": 1, "more": "z"}, {"ok": 1}):
        try:
            check(given)
        except Exception as exc:
            crashes.add(exc, given)
    assert crashes.count == 2 and len(crashes.found) == 1
    assert "KeyError at " in crashes.report(check) and "reproducer: {'bad': 1}" in crashes.report(check)
