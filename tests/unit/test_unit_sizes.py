"""Units a reader can hold in one screen: no class over 200 lines, no function over 50 lines unless its
docstring says why it is long ("Long because ..."), in what ships (the layers, the functions) and in the
operator tooling."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = (
    ROOT / "layers" / "gpufleet" / "gpufleet",
    ROOT / "layers" / "node" / "gpufleet_node",
    ROOT / "functions",
    ROOT / "tools" / "gpufleet_tools",  # the operator tooling too: its units are read as often
)
MAX_CLASS = 200
MAX_FUNCTION = 50


def _units() -> list[tuple[str, ast.AST]]:
    found = []
    for base in SHIPPED:
        for path in sorted(base.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node))
    return found


def _length(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0)) - int(getattr(node, "lineno", 0)) + 1


def test_classes_fit_on_a_screen() -> None:
    big = [
        f"{where} ({_length(n)} lines)"
        for where, n in _units()
        if isinstance(n, ast.ClassDef) and _length(n) > MAX_CLASS
    ]
    assert big == []


def test_long_functions_say_why() -> None:
    unexplained = [
        f"{where} ({_length(n)} lines)"
        for where, n in _units()
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and _length(n) > MAX_FUNCTION
        and "long because" not in (ast.get_docstring(n) or "").lower()
    ]
    assert unexplained == []
