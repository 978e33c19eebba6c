"""The repository's source files, each read and parsed once per test session: the structure checks
(purity, unit sizes, the import graph, the unit suite's purity) all walk the same trees, so none re-parses
a file per test. A tree is cached by its source text too, so a copy of a file (the purity check's
new-module test copies both packages) is not parsed again; nobody may change a tree."""

from __future__ import annotations

import ast
import gc
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@cache
def text(path: Path) -> str:
    return path.read_text()


@cache
def tree(source: str) -> ast.Module:
    """The tree of a source text (shared: read it, never change it). The cyclic garbage collector is off
    while it is built: the nodes are no garbage, and its passes over them more than doubled the time."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if collecting:
            gc.enable()


@cache
def parsed(path: Path) -> ast.Module:
    try:
        return tree(text(path))
    except SyntaxError as exc:
        exc.filename = str(path)
        raise
