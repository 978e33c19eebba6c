"""Decide purely, act at the edge, checked on the source (AST) of every module of both packages, the
runtime `gpufleet` (layers/gpufleet) and the tooling `gpufleet_tools` (tools/), so it holds whatever the
tests happen to execute. Purity is the default: a module is pure unless GLUE names it (or its package),
with the reason it touches the world.

A pure module fails on any of these, wherever it sits in the source (functions and `if TYPE_CHECKING:`
blocks included):
- an import of a module of either package that is glue or is not a module at all (`from p import m`
  counts as importing p.m when p.m is a module), or a relative import (the check could not follow it);
- an import of any library outside the standard library except ALLOWED_THIRD_PARTY (so no boto3,
  botocore, Powertools, slack_sdk, matplotlib, ...), and of gpufleet_node other than gpufleet_node.schema;
- an import of a standard module in FORBIDDEN_STDLIB (clock, environment, randomness, processes, I/O,
  dynamic imports), or of one of their submodules;
- a call of a builtin in IO_BUILTINS (`open(...)`, `print(...)`, ...) by its bare name;
- an attribute named in ENVIRONMENT (`.environ`, `.getenv`, `.putenv`), on anything;
- `.now`, `.utcnow` or `.today` on a name or attribute called `datetime` or `date` (the clock, called
  or passed on).

Every module, glue included, also fails on:
- boto3, botocore or mypy_boto3* imported outside SDK_HOMES (the AWS adapters under gpufleet/aws/ and
  the tooling's one session factory); mypy_boto3* (type stubs, a dev dependency the Lambda layer lacks)
  only inside `if TYPE_CHECKING:` and only in SDK_HOMES too: elsewhere a client is typed `Any` or by the
  adapter that wraps it;
- (a runtime module) an import of gpufleet_tools: tooling imports the runtime, never the reverse.

GLUE and SDK_HOMES cannot rot: an entry that names no module fails, and so does a glue module in which
the purity check finds nothing (it belongs off the list, checked).

Each file is read and parsed once per session (tests/sources.py), whatever the number of tests that read it.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.sources import parsed, text, tree

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"gpufleet": ROOT / "layers" / "gpufleet" / "gpufleet", "gpufleet_tools": ROOT / "tools" / "gpufleet_tools"}

# A module, or a package with everything under it, that touches the world, and why.
GLUE: dict[str, str] = {
    "gpufleet.aws": "the AWS adapters: boto3 clients behind typed readers and writers",
    "gpufleet.kubernetes.client": "the standard-library Kubernetes API client: sockets, TLS, HTTP, the clock",
    "gpufleet.kubernetes.cluster": "lists an EKS cluster's pods, nodes and DaemonSets over HTTP, in a time budget",
    "gpufleet.kubernetes.queued_reader": "lists Kueue's and Volcano's objects over HTTP for the pure readers",
    "gpufleet.kubernetes.marks": "cordons and uncordons nodes over HTTP (the Kubernetes node marker)",
    "gpufleet.scaling.trust_reads": "reads the group and member series the metric-trust check weighs",
    "gpufleet.runtime": "the composition root: the environment, boto3 sessions, Powertools, the wiring",
    "gpufleet.policy_loading": "reads the policy from SSM or a file through Powertools, with the clock",
    "gpufleet.scaling.execution": "carries a decision out: lease, intent, Auto Scaling, audit, metrics",
    "gpufleet.scaling.last_look": "the fresh reads right before a removal call: its ASG, its cluster's pods",
    "gpufleet.scaling.busy_protection": "keeps the queue workers' busy marks as scale-in protection each tick",
    "gpufleet.scaling.service": "the scaler's glue: reads alarms, metrics and state, runs the execution",
    "gpufleet.scaling.demand_source": "the tick's demand hub: each source's reader, the GPU-ready probe, logs",
    "gpufleet.scaling.sources.base": "tells each demand source's unreadable causes once, through Powertools",
    "gpufleet.scaling.sources.kubernetes": "lists a cluster's pods and maps its GPU nodes to EC2 instances",
    "gpufleet.scaling.sources.queue": "reads an SQS queue's message counts through the adapters",
    "gpufleet.scaling.sources.metric": "reads a backlog metric's latest datum from CloudWatch",
    "gpufleet.scaling.answer": "answers a termination request or a lifecycle hook from the fleet's state",
    "gpufleet.scaling.ownership": "reads who else changed a group's size and writes the stand-aside",
    "gpufleet.capacity.service": "reads launch activities and resizes groups (the capacity function)",
    "gpufleet.capacity.warnings": "acts on spot warnings: finds the node's group, launches replacements",
    "gpufleet.capacity.reservations": "reads the reservations managed groups launch into, tells of their end",
    "gpufleet.guard.service": "the OOM guard's glue: reads metrics and state, replaces failed GPUs",
    "gpufleet.guard.screen": "reads GPU series from CloudWatch, cheapest first",
    "gpufleet.guard.hosts": "reads host memory series from CloudWatch, cheapest first",
    "gpufleet.guard.witness": "reads an instance's own namespace from CloudWatch (GPU fault corroboration)",
    "gpufleet.notify.service": "the notifier: the queue, the incident table, Slack, metrics",
    "gpufleet.notify.slack": "posts to Slack (slack_sdk, HTTP)",
    "gpufleet_tools.cli": "the command line: argv, stdout and stderr, exit codes, the environment",
    "gpufleet_tools.session": "the tooling's one boto3 session factory (endpoint and credentials from the env)",
    "gpufleet_tools.invoke": "runs a function's handler in-process: its environment, the clock, a request id",
    "gpufleet_tools.local": "reads template.yaml with the SAM translator's YAML reader",
    "gpufleet_tools.local_stack": "starts a moto server (a process, a socket, HTTP) and creates the stack in it",
    "gpufleet_tools.local_kube": "serves the local stack's Kubernetes API (a process, a socket, a pods file)",
    "gpufleet_tools.local_servers": "waits on a local server's process until it answers HTTP (a socket, the clock)",
    "gpufleet_tools.replay.service": "the replay's glue: files, CloudWatch history, matplotlib, tqdm, the clock",
    "gpufleet_tools.replay.plot": "draws the replay's capacity.png with matplotlib",
    "gpufleet_tools.doctor.service": "reads an account through the AWS adapters for the doctor's checks",
    "gpufleet_tools.doctor.queued_access": "asks a cluster's API (discovery, access reviews) for the queued-jobs check",
    "gpufleet_tools.report.reader": "reads usage records from CloudWatch Logs: threads, a rate limit, tqdm",
    "gpufleet_tools.report.identity": "the node publisher's workload model (gpufleet_node.workload, not shared)",
    "gpufleet_tools.report.chart": "draws the report's PNG with matplotlib",
}
SDK_HOMES = ("gpufleet.aws", "gpufleet_tools.session")
SDK = ("boto3", "botocore")
SDK_STUBS = "mypy_boto3"  # mypy_boto3_eks, mypy_boto3_sqs, ...

ALLOWED_THIRD_PARTY = {"pydantic", "pydantic_core", "yaml", "croniter"}  # pydantic_core: pydantic's own core (schemas)
SHARED = {"gpufleet_node.schema"}  # the metric names the node publisher and the runtime share
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
    "multiprocessing",
    "asyncio",
    "signal",
    "shutil",
    "tempfile",
    "urllib.request",
    "http",
    "logging",
    "importlib",
}
IO_BUILTINS = {"open", "print", "input", "breakpoint", "__import__", "exec", "eval"}
CLOCK_ATTRIBUTES = {"now", "utcnow", "today"}
CLOCK_OWNERS = {"datetime", "date"}
ENVIRONMENT = {"environ", "getenv", "putenv"}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def modules(packages: Mapping[str, Path] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its `__init__.py`)."""
    found = {}
    for top, base in packages.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            found[".".join((top, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def glue_entry(name: str) -> str | None:
    """The GLUE entry that makes module `name` glue, if one does."""
    return next((entry for entry in GLUE if _within(name, entry)), None)


def _imports(tree: ast.AST, known: Mapping[str, Path]) -> Iterator[tuple[ast.stmt, str]]:
    """(statement, module) for every import in the tree; `from p import m` is p.m when that is a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield node, full if full in known or full in SHARED else base


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the statements inside `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) bodies."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in (
            getattr(node.test, "id", None),
            getattr(node.test, "attr", None),
        ):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def _import_problem(module: str, known: Mapping[str, Path]) -> str | None:
    top = module.split(".")[0]
    if module.startswith("."):
        return f"imports {module} (a relative import: write it absolute so the check can follow it)"
    if top == "gpufleet_node":
        return None if module in SHARED else f"imports {module} (only gpufleet_node.schema is shared)"
    if top in PACKAGES:
        if module not in known:
            return f"imports {module} (not a module of {top})"
        entry = glue_entry(module)
        return f"imports {module} (glue: {GLUE[entry]})" if entry else None
    if any(_within(module, f) for f in FORBIDDEN_STDLIB):
        return f"imports {module} (clock, environment, randomness, processes or I/O)"
    if top in sys.stdlib_module_names or top == "__future__" or top in ALLOWED_THIRD_PARTY:
        return None
    return f"imports {module} (AWS SDK, Powertools or another library a pure module must not use)"


def violations(
    source: str | ast.Module, name: str = "gpufleet.scaling.core", known: Mapping[str, Path] | None = None
) -> list[str]:
    """Every impurity in the source (or its tree) of the pure module `name`, as 'name:line: what'; `known`
    is every module of the packages (default: as they are on disk)."""
    known = known or KNOWN
    found = []
    module_tree = tree(source) if isinstance(source, str) else source
    for node, module in _imports(module_tree, known):
        problem = _import_problem(module, known)
        if problem:
            found.append(f"{name}:{node.lineno}: {problem}")
    for node in ast.walk(module_tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IO_BUILTINS:
            found.append(f"{name}:{node.lineno}: calls {node.func.id}() (I/O or dynamic code)")
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT:
            found.append(f"{name}:{node.lineno}: reads the environment ({node.attr})")
        if isinstance(node, ast.Attribute) and node.attr in CLOCK_ATTRIBUTES:
            owner = node.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if owner_name in CLOCK_OWNERS:
                found.append(f"{name}:{node.lineno}: reads the clock ({owner_name}.{node.attr})")
    return found


def boundary_violations(source: str | ast.Module, name: str, known: Mapping[str, Path] | None = None) -> list[str]:
    """What every module, glue included, must not import: the AWS SDK outside SDK_HOMES (its type stubs
    only under TYPE_CHECKING), and gpufleet_tools from the runtime."""
    known = known or KNOWN
    module_tree = tree(source) if isinstance(source, str) else source
    type_only = _type_only(module_tree)
    home = any(_within(name, h) for h in SDK_HOMES)
    found = []
    for node, module in _imports(module_tree, known):
        top = module.split(".")[0]
        if top in SDK and not home:
            found.append(f"{name}:{node.lineno}: imports {module} (the AWS SDK belongs in {' or '.join(SDK_HOMES)})")
        if top.startswith(SDK_STUBS) and not (home and id(node) in type_only):
            found.append(f"{name}:{node.lineno}: imports {module} (stubs: only under TYPE_CHECKING in an SDK home)")
        if top == "gpufleet_tools" and _within(name, "gpufleet"):
            found.append(f"{name}:{node.lineno}: imports {module} (the runtime never imports the tooling)")
    return found


def pure_modules(packages: Mapping[str, Path] = PACKAGES) -> dict[str, Path]:
    return {name: path for name, path in modules(packages).items() if glue_entry(name) is None}


def all_violations(packages: Mapping[str, Path] = PACKAGES) -> list[str]:
    """Both checks over the packages: what `pytest` reports for them, in one list."""
    known = modules(packages)
    found = []
    for name, path in known.items():
        source = parsed(path)
        found += boundary_violations(source, name, known)
        if glue_entry(name) is None:
            found += violations(source, name, known)
    return found


KNOWN = modules()  # the packages as they are on disk, found once


def test_both_packages_have_pure_modules_to_check() -> None:
    names = set(pure_modules())
    expected = {"gpufleet.scaling.core", "gpufleet.guard.core", "gpufleet.capacity.core", "gpufleet.notify.incidents"}
    expected |= {
        "gpufleet.events.alarms",
        "gpufleet.settings",
        "gpufleet_tools.replay.core",
        "gpufleet_tools.alarm_specs",
    }
    assert expected <= names


@pytest.mark.parametrize("name", sorted(pure_modules()))
def test_module_is_pure(name: str) -> None:
    found = violations(parsed(KNOWN[name]), name)
    assert not found, "\n".join([f"{name} is pure unless GLUE says why it is glue:", *found])


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_module_keeps_to_the_boundaries(name: str) -> None:
    found = boundary_violations(parsed(KNOWN[name]), name)
    assert not found, "\n".join(found)


def test_every_glue_entry_is_a_module_that_needs_to_be_glue() -> None:
    known = KNOWN
    missing = [entry for entry in (*GLUE, *SDK_HOMES) if entry not in known]
    assert missing == [], "GLUE or SDK_HOMES names a module that is gone: drop it"
    clean = [
        entry
        for entry in GLUE
        if not any(violations(parsed(path), name, known) for name, path in known.items() if _within(name, entry))
    ]
    assert clean == [], "the purity check finds nothing in these glue modules: take them off GLUE"


def test_a_new_module_is_checked_without_touching_this_test(tmp_path: Path) -> None:
    """A module nobody listed (here scaling/forecast.py, importing boto3) is pure by default, so it fails."""
    copies = {top: tmp_path / top for top in PACKAGES}
    for top, base in PACKAGES.items():
        shutil.copytree(base, copies[top], ignore=shutil.ignore_patterns("__pycache__"))
    (copies["gpufleet"] / "scaling" / "forecast.py").write_text('"""A forecast."""\n\nimport boto3\n')
    assert "gpufleet.scaling.forecast" in pure_modules(copies)
    sdk_home = "the AWS SDK belongs in gpufleet.aws or gpufleet_tools.session"
    library = "AWS SDK, Powertools or another library a pure module must not use"
    assert [v for v in all_violations(copies) if v.startswith("gpufleet.scaling.forecast:")] == [
        f"gpufleet.scaling.forecast:3: imports boto3 ({sdk_home})",
        f"gpufleet.scaling.forecast:3: imports boto3 ({library})",
    ]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("import boto3", "imports boto3"),
        ("from botocore.exceptions import ClientError", "imports botocore.exceptions"),
        ("from aws_lambda_powertools import Logger", "imports aws_lambda_powertools"),
        ("from gpufleet.aws.state import StateStore", "imports gpufleet.aws.state (glue"),
        ("from gpufleet.aws import state", "imports gpufleet.aws.state (glue"),
        ("from gpufleet.scaling.service import Scaler", "imports gpufleet.scaling.service (glue"),
        ("from gpufleet_tools.session import client", "imports gpufleet_tools.session (glue"),
        ("from gpufleet.scaling.nothing import x", "imports gpufleet.scaling.nothing (not a module"),
        ("from . import notes", "a relative import"),
        ("from gpufleet_node.publisher import main", "only gpufleet_node.schema"),
        ("import os", "imports os"),
        ("import importlib.util", "imports importlib.util"),
        ("from urllib.request import urlopen", "imports urllib.request"),
        ("x = datetime.now()", "reads the clock (datetime.now)"),
        ("x = dt.datetime.utcnow()", "reads the clock (datetime.utcnow)"),
        ("clock = date.today", "reads the clock (date.today)"),
        ("x = env.environ['A']", "reads the environment (environ)"),
        ("x = open('f').read()", "calls open()"),
        ("print(1)", "calls print()"),
    ],
)
def test_the_check_catches_each_kind_of_impurity(line: str, problem: str) -> None:
    core = text(PACKAGES["gpufleet"] / "scaling" / "core.py")
    assert violations(core) == []
    found = violations(core + "\n" + line + "\n")
    assert any(problem in v for v in found), found


@pytest.mark.parametrize(
    ("name", "line", "problem"),
    [
        ("gpufleet.scaling.service", "import boto3", "imports boto3 (the AWS SDK belongs in"),
        ("gpufleet_tools.cli.doctor", "from botocore.config import Config", "imports botocore.config"),
        ("gpufleet.aws.fleet", "from mypy_boto3_eks import EKSClient", "stubs: only under TYPE_CHECKING"),
        (
            "gpufleet.scaling.service",
            "if TYPE_CHECKING:\n    from mypy_boto3_eks import EKSClient",
            "stubs: only under TYPE_CHECKING in an SDK home",
        ),
        ("gpufleet.runtime", "from gpufleet_tools.session import client", "the runtime never imports the tooling"),
        ("gpufleet.aws.state", "import gpufleet_tools", "the runtime never imports the tooling"),
    ],
)
def test_the_boundaries_catch_each_crossing(name: str, line: str, problem: str) -> None:
    found = boundary_violations(line + "\n", name)
    assert any(problem in v for v in found), found


@pytest.mark.parametrize(
    ("name", "source"),
    [
        (
            "gpufleet.aws.fleet",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mypy_boto3_eks import EKSClient\n",
        ),
        ("gpufleet.aws.clients", "import boto3\nfrom botocore.config import Config\n"),
        ("gpufleet_tools.session", "import boto3\n"),
        ("gpufleet_tools.replay.core", "from gpufleet.scaling.core import decide_alarm\n"),
    ],
)
def test_the_boundaries_allow_what_they_say(name: str, source: str) -> None:
    assert boundary_violations(source, name) == []
