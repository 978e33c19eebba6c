"""Units a reader can hold in one screen: no class over 200 lines, no function over 50 lines, unless its
docstring says why it is long ("Long because ..."), in what ships (the layers, the functions) and in the
operator tooling. The units are found once, from trees parsed once (tests/sources.py)."""

from __future__ import annotations

import ast
from functools import cache

from tests.sources import ROOT, parsed

SHIPPED = (
    ROOT / "layers" / "gpufleet" / "gpufleet",
    ROOT / "layers" / "node" / "gpufleet_node",
    ROOT / "functions",
    ROOT / "tools" / "gpufleet_tools",  # the operator tooling too: its units are read as often
)
MAX_CLASS = 200
MAX_FUNCTION = 50


@cache
def _units() -> list[tuple[str, ast.AST]]:
    found = []
    for base in SHIPPED:
        for path in sorted(base.rglob("*.py")):
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node))
    return found


def _length(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0)) - int(getattr(node, "lineno", 0)) + 1


def _says_why(node: ast.AST) -> bool:
    """Whether the unit's docstring says why it is long: a class too is shaped, not trimmed to the number."""
    if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    return "long because" in (ast.get_docstring(node) or "").lower()


def test_long_classes_say_why() -> None:
    unexplained = [
        f"{where} ({_length(n)} lines)"
        for where, n in _units()
        if isinstance(n, ast.ClassDef) and _length(n) > MAX_CLASS and not _says_why(n)
    ]
    assert unexplained == []


def test_long_functions_say_why() -> None:
    unexplained = [
        f"{where} ({_length(n)} lines)"
        for where, n in _units()
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and _length(n) > MAX_FUNCTION and not _says_why(n)
    ]
    assert unexplained == []
