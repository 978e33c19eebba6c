"""`make unit` runs pure tests only: no module of tests/unit imports glue (test_purity's GLUE), the AWS SDK,
moto or another library the pure cores may not use, starts processes, servers or threads, reads the
rehearsal beyond its document builders, or asks for the moto server's fixtures. A test that needs any
of those belongs in tests/adapters/ (same sub-folders), which `make test` runs.

Checked on each file's source (AST, parsed once: tests/sources.py), imports inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.sources import ROOT, parsed
from tests.unit.test_purity import SDK, SDK_STUBS, glue_entry, modules

UNIT = ROOT / "tests" / "unit"
# Glue by GLUE's letter, pure in deed: it reads the node publisher's workload model (no I/O, no clock).
PURE_GLUE = {"gpufleet_tools.report.identity": "imports gpufleet_node.workload, which is not shared"}
LIBRARIES = {*SDK, "moto", "aws_lambda_powertools", "slack_sdk", "matplotlib", "tqdm"}
PROCESSES = {"subprocess", "socket", "socketserver", "http.server", "http.client", "threading", "multiprocessing"}
PROCESSES |= {"asyncio", "urllib.request"}
REHEARSAL = {"rehearsal.kueue_objects", "rehearsal.volcano_objects"}  # the pure document builders
TESTS = {"tests.unit", "tests.sources", "tests.import_graph", "tests.profiles"}
FIXTURES = {"aws", "moto_server_url"}  # tests/conftest.py's moto server
KNOWN = set(modules())


def _within(name: str, prefixes: set[str] | dict[str, str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _imported(tree: ast.AST, known: set[str]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.append((node.lineno, full if full in known else node.module))
    return found


def problems(tree: ast.AST, where: str, known: set[str]) -> list[str]:
    """What makes a test module impure, as 'where:line: what'."""
    found = []
    for line, name in _imported(tree, known):
        top = name.split(".")[0]
        entry = glue_entry(name) if top in ("gpufleet", "gpufleet_tools") else None
        if entry and not _within(name, PURE_GLUE):
            found.append(f"{where}:{line}: imports {name} (glue: {entry})")
        elif top in LIBRARIES or top.startswith(SDK_STUBS):
            found.append(f"{where}:{line}: imports {name} (an adapter's library)")
        elif _within(name, PROCESSES):
            found.append(f"{where}:{line}: imports {name} (processes, sockets or threads)")
        elif top == "rehearsal" and not _within(name, REHEARSAL):
            found.append(f"{where}:{line}: imports {name} (the rehearsal beyond its document builders)")
        elif top == "tests" and not _within(name, TESTS):
            found.append(f"{where}:{line}: imports {name} (a test outside tests/unit)")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and {a.arg for a in node.args.args} & FIXTURES:
            found.append(f"{where}:{node.lineno}: {node.name} asks for the moto server")
        if isinstance(node, ast.Attribute) and node.attr == "executable":
            found.append(f"{where}:{node.lineno}: names an interpreter (sys.executable)")
    return found


def _files() -> list[Path]:
    return sorted(UNIT.rglob("*.py"))


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(UNIT)))
def test_unit_module_is_pure(path: Path) -> None:
    found = problems(parsed(path), str(path.relative_to(ROOT)), KNOWN)
    assert found == [], "\n".join(["a unit test is pure; move it to tests/adapters/ or split it:", *found])


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("import boto3", "imports boto3 (an adapter's library)"),
        ("from moto import mock_aws", "imports moto (an adapter's library)"),
        ("from gpufleet.aws.state import group_pk", "imports gpufleet.aws.state (glue"),
        ("from gpufleet.scaling import demand_source", "imports gpufleet.scaling.demand_source (glue"),
        ("def f():\n    import subprocess", "imports subprocess (processes"),
        ("from http.server import HTTPServer", "imports http.server (processes"),
        ("from rehearsal.scenario import POLICY", "imports rehearsal.scenario (the rehearsal"),
        ("from rehearsal.kube_api import kube_api", "imports rehearsal.kube_api (the rehearsal"),
        ("from tests.adapters.aws.test_hyperpod import REF", "imports tests.adapters.aws.test_hyperpod (a test"),
        ("def test_x(aws):\n    pass", "test_x asks for the moto server"),
        ("import sys\nx = [sys.executable]", "names an interpreter"),
    ],
)
def test_the_check_catches_each_kind_of_impurity(source: str, problem: str) -> None:
    found = problems(ast.parse(source), "t.py", KNOWN)
    assert any(problem in f for f in found), found


@pytest.mark.parametrize(
    "source",
    [
        "from gpufleet.scaling.core import decide_alarm",
        "from gpufleet_tools.report.identity import identify",
        "from rehearsal.volcano_objects import podgroup",
        "from tests.unit.test_report_records import message\nfrom tests.profiles import examples",
        "import importlib.util\nfrom hypothesis import given",
    ],
)
def test_the_check_allows_what_it_says(source: str) -> None:
    assert problems(ast.parse(source), "t.py", KNOWN) == []
