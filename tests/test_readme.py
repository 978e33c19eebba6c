"""The README's architecture tree names exactly the package's subpackages and top-level modules."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "layers" / "gpufleet" / "gpufleet"


def readme_tree() -> set[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("layers/gpufleet/gpufleet/\n", 1)[1].split("```", 1)[0]
    return {m.group(1) for m in re.finditer(r"^  ([a-z_]+(?:/|\.py))", block, re.M)}


def package_tree() -> set[str]:
    subpackages = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    modules = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    return subpackages | modules


def test_readme_tree_matches_the_package() -> None:
    assert readme_tree() == package_tree()


def test_every_module_the_tree_describes_exists() -> None:
    """Each subpackage's line names every one of its modules."""
    text = (ROOT / "README.md").read_text()
    block = text.split("layers/gpufleet/gpufleet/\n", 1)[1].split("```", 1)[0]
    for entry in re.split(r"\n(?=  [a-z_]+/)", block):
        head = re.match(r"\s*([a-z_]+)/", entry)
        if not head:
            continue
        modules = {p.stem for p in (PACKAGE / head.group(1)).glob("*.py") if p.stem != "__init__"}
        assert modules <= set(re.findall(r"[a-z_0-9]+", entry)), (
            head.group(1),
            modules - set(re.findall(r"[a-z_0-9]+", entry)),
        )
