"""What `sam build` puts in each function's layers: what Lambda runs, and nothing else.

Reads .aws-sam/build (make test runs `sam build` first): each function's layers hold the runtime package,
its requirements and the metric schema - no operator tooling (gpufleet_tools), no publisher or pynvml,
no botocore of their own (the runtime's boto3 brings its own) - and every import the shipped code makes
resolves to the standard library, the layers, or what the Lambda runtime provides.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / ".aws-sam" / "build"

# What the python3.13 Lambda runtime provides besides the standard library: boto3 and its dependencies.
RUNTIME_PROVIDED = {"boto3", "botocore", "s3transfer", "jmespath", "urllib3", "dateutil", "six"}
# Never in a function's layers: operator tooling and its libraries, the publisher and NVML, test tooling.
FORBIDDEN_TOPS = {
    "gpufleet_tools",
    "pynvml",
    "matplotlib",
    "tqdm",
    "moto",
    "samtranslator",
    "hypothesis",
    "pytest",
    "botocore",
    "boto3",
    "rehearsal",
    "bench",
}
SCHEMA_ONLY = {"__init__.py", "schema.py"}  # all of gpufleet_node a function may get


def _built_template() -> dict[str, Any]:
    path = BUILD / "template.yaml"
    if not path.is_file():
        if os.environ.get("GPUFLEET_REQUIRE_SAM_BUILD"):
            pytest.fail("no .aws-sam/build/template.yaml: run `make sam-build` before pytest")
        pytest.skip("sam build has not run (make test runs it first)")
    from samtranslator.yaml_helper import yaml_parse

    built: dict[str, Any] = yaml_parse(path.read_text())
    return built


def function_layers() -> dict[str, list[Path]]:
    """Each built function's name -> the python/ folders of the layers it gets (Globals included)."""
    doc = _built_template()
    resources = doc["Resources"]
    shared = doc.get("Globals", {}).get("Function", {}).get("Layers", [])
    found = {}
    for name, res in resources.items():
        if res["Type"] != "AWS::Serverless::Function":
            continue
        refs = [layer["Ref"] for layer in res["Properties"].get("Layers", shared)]
        found[name] = [BUILD / resources[r]["Properties"]["ContentUri"] / "python" for r in refs]
    return found


def _tops(folder: Path) -> set[str]:
    return {p.name.removesuffix(".py") for p in folder.iterdir() if not p.name.endswith((".dist-info", ".data"))}


def _imports(source: str) -> set[str]:
    """Top-level modules a source imports at run time (absolute imports outside `if TYPE_CHECKING:`)."""
    tree = ast.parse(source)
    type_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_every_function_gets_the_runtime_package_and_the_schema() -> None:
    layers = function_layers()
    assert len(layers) == 5, sorted(layers)
    for name, folders in layers.items():
        tops = set().union(*(_tops(f) for f in folders))
        assert {"gpufleet", "gpufleet_node", "aws_lambda_powertools", "pydantic"} <= tops, name


def test_no_tooling_publisher_or_second_botocore_in_a_function_layer() -> None:
    for name, folders in function_layers().items():
        for folder in folders:
            assert not (_tops(folder) & FORBIDDEN_TOPS), (name, folder.parent.name, _tops(folder) & FORBIDDEN_TOPS)
            node = folder / "gpufleet_node"
            if node.is_dir():
                assert {p.name for p in node.iterdir()} <= SCHEMA_ONLY, (name, sorted(p.name for p in node.iterdir()))
            tooling = [p for p in folder.rglob("*.py") if p.stem in {"cli", "local_stack", "replay", "doctor"}]
            assert tooling == [], (name, tooling)


def test_every_import_the_functions_make_resolves_in_lambda() -> None:
    """Our code in the layers and the handlers imports only the standard library, the layers' packages and
    what the runtime provides: a module moved to the tooling but still imported would fail here, not on AWS."""
    for name, folders in function_layers().items():
        available = set(sys.stdlib_module_names) | RUNTIME_PROVIDED | set().union(*(_tops(f) for f in folders))
        handler = ROOT / "functions" / name.removesuffix("Function").lower() / "app.py"
        ours = [p for f in folders for pkg in ("gpufleet", "gpufleet_node") for p in (f / pkg).rglob("*.py")]
        sources = [*ours, *((ROOT / "functions").glob("*/app.py"))]
        missing = {
            f"{p.relative_to(BUILD) if BUILD in p.parents else p.relative_to(ROOT)}: {m}"
            for p in sources
            for m in _imports(p.read_text()) - available - {"__future__"}
        }
        assert missing == set(), (name, handler.name, sorted(missing))


def test_the_layer_content_check_would_catch_tooling(tmp_path: Path) -> None:
    """The checks above see what they are meant to: a tooling import and a publisher module."""
    assert _imports("import boto3\nfrom gpufleet_tools.cli import main\n") == {"boto3", "gpufleet_tools"}
    assert _imports("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import mypy_boto3_eks\n") == {"typing"}
    (tmp_path / "gpufleet_tools").mkdir()
    (tmp_path / "pynvml.py").write_text("")
    assert _tops(tmp_path) & FORBIDDEN_TOPS == {"gpufleet_tools", "pynvml"}
