"""The repository's source files, each read and parsed once per test session: the structure checks
(purity, unit sizes, the import graph) all walk the same trees, so none re-parses a file per test."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@cache
def text(path: Path) -> str:
    return path.read_text()


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(text(path), filename=str(path))
