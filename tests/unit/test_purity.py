"""Decide purely, act at the edge: the pure cores import no AWS SDK, no Powertools, no adapter or
service module, and never read the clock, the environment or a random source.

A core module is every module of `domain/` and `events/`, and every `core`, `policy`, `notes`,
`targets`, `classify`, `model`, `incidents`, `render`, `simulate`, `baselines`, `traces` and `report`
module of a capability. The check reads their
source (AST), so it holds whatever the tests happen to execute.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "gpufleet" / "gpufleet"
PURE_PACKAGES = ("domain", "events")
PURE_MODULES = {
    "core",
    "alarm_specs",
    "policy",
    "notes",
    "targets",
    "classify",
    "model",
    "incidents",
    "render",
    "simulate",
    "baselines",
    "termination",
}
ALLOWED_THIRD_PARTY = {"pydantic", "yaml", "croniter", "gpufleet_node.schema"}
FORBIDDEN_STDLIB = {
    "os",
    "sys",
    "time",
    "random",
    "secrets",
    "uuid",
    "subprocess",
    "socket",
    "threading",
    "urllib.request",
}
CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}
ENVIRONMENT = {"environ", "getenv", "putenv"}


def core_modules() -> list[Path]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        capability_core = len(rel.parts) == 2 and rel.parts[0] != "aws" and path.stem in PURE_MODULES
        if rel.parts[0] in PURE_PACKAGES or capability_core:
            found.append(path)
    return found


def _pure_target(module: str) -> bool:
    """A gpufleet module a core may import: another core module."""
    parts = module.split(".")[1:]
    if not parts or parts[0] == "aws":
        return False
    if parts[0] in PURE_PACKAGES:
        return True
    return len(parts) == 2 and parts[1] in PURE_MODULES


def _import_problem(module: str) -> str | None:
    top = module.split(".")[0]
    if module.startswith("gpufleet_node"):
        return None if module == "gpufleet_node.schema" else f"imports {module} (only gpufleet_node.schema is shared)"
    if top == "gpufleet":
        return None if _pure_target(module) else f"imports {module} (not a pure core module)"
    if module in FORBIDDEN_STDLIB or top in FORBIDDEN_STDLIB:
        return f"imports {module} (clock, environment, randomness or I/O)"
    if top in sys.stdlib_module_names or top == "__future__":
        return None
    if top in ALLOWED_THIRD_PARTY:
        return None
    return f"imports {module} (AWS SDK, Powertools or another library a core must not use)"


def violations(source: str, name: str = "<module>") -> list[str]:
    """Every impurity in one module's source, as 'name:line: what'."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in ("gpufleet", "gpufleet_node"):  # `from gpufleet_node import schema`
                modules = [f"{node.module}.{a.name}" for a in node.names]
            else:
                modules = [node.module]
        for module in modules:
            problem = _import_problem(module)
            if problem:
                found.append(f"{name}:{node.lineno}: {problem}")
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT:
            found.append(f"{name}:{node.lineno}: reads the environment ({node.attr})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_CALLS:
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in {"datetime", "date", "time"}:
                found.append(f"{name}:{node.lineno}: reads the clock ({owner.id}.{node.func.attr}())")
    return found


def test_there_are_core_modules_to_check() -> None:
    names = {str(p.relative_to(PACKAGE)) for p in core_modules()}
    assert {"scaling/core.py", "guard/core.py", "capacity/core.py", "notify/incidents.py", "events/alarms.py"} <= names


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_module_is_pure(path: Path) -> None:
    assert violations(path.read_text(), str(path.relative_to(PACKAGE))) == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("import boto3", "imports boto3"),
        ("from botocore.exceptions import ClientError", "imports botocore.exceptions"),
        ("from aws_lambda_powertools import Logger", "imports aws_lambda_powertools"),
        ("from gpufleet.aws.state import StateStore", "imports gpufleet.aws.state"),
        ("from gpufleet.scaling.service import Scaler", "imports gpufleet.scaling.service"),
        ("import os", "imports os"),
        ("x = datetime.now()", "reads the clock (datetime.now())"),
        ("x = time.time()", "reads the clock (time.time())"),
        ("x = env.environ['A']", "reads the environment (environ)"),
    ],
)
def test_the_check_catches_each_kind_of_impurity(line: str, problem: str) -> None:
    core = (PACKAGE / "scaling" / "core.py").read_text()
    found = violations(core + "\n" + line + "\n")
    assert any(problem in v for v in found), found
