"""The repository's import graph, read from the source (AST), and the two rules it must keep:
- no import runs up a floor of the runtime package `gpufleet` (FLOORS, lowest first);
- no import circle anywhere in the repository: runtime, tooling, node publisher, rehearsal, bench, tests.

Every import counts, those inside functions and `if TYPE_CHECKING:` blocks too: a type imported from
above is still a dependency on it, and a circle through type hints is still a circle to read.

Run it from the repository root (it prints each violation and exits 1 on any):

    .venv/bin/python -m tests.import_graph

tests/unit/test_import_graph.py runs the same checks in `make test` and `make unit`.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.sources import ROOT, parsed

# Where each top-level package's source lives (the folder its name is found in).
PACKAGE_HOMES = {
    "gpufleet": ROOT / "layers" / "gpufleet",
    "gpufleet_node": ROOT / "layers" / "node",
    "gpufleet_tools": ROOT / "tools",
    "rehearsal": ROOT,
    "bench": ROOT,
    "tests": ROOT,
    "functions": ROOT,
}

# The runtime's floors, lowest first: a module may import its own floor and those below, never above.
# A floor is one or more subpackages (or top-level modules) of `gpufleet`.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("domain",),  # shared vocabulary: models, errors, defaults, notifications, incident records, node shapes
    ("settings", "policy"),  # the environment, parsed once; the fleet policy and its sections
    ("events",),  # every inbound shape -> one typed event
    ("aws",),  # the AWS adapters (boto3 behind typed readers and writers), the group kinds' adapters
    ("kubernetes",),  # Kubernetes documents, the API client, the node marks (reaches EKS through aws)
    ("notify",),  # the notifier
    ("scaling",),  # the scaler and its executor
    ("capacity", "guard"),  # spot_watch and the OOM guard (they act through the scaler's executor)
    ("policy_loading", "runtime"),  # where the policy comes from; the composition root
)


def modules() -> dict[str, Path]:
    """Every Python module of the repository, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for top, home in PACKAGE_HOMES.items():
        for path in sorted((home / top).rglob("*.py")):
            parts = list(path.relative_to(home).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _known(name: str, known: Mapping[str, Path]) -> str | None:
    """The module an import of `name` loads, climbing to its package when `name` is an attribute."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, path: Path, known: Mapping[str, Path]) -> Iterable[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            yield from filter(None, (_known(a.name, known) for a in node.names))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found = sub if sub in known else _known(base, known)
                if found:
                    yield found


def graph() -> dict[str, set[str]]:
    """Module -> the repository's modules it imports (itself left out)."""
    known = modules()
    return {m: set(_imported(m, p, known)) - {m} for m, p in known.items()}


def floor_of(module: str) -> int | None:
    """The floor of a `gpufleet` module (its subpackage's), None outside the runtime or for the package."""
    parts = module.split(".")
    if parts[0] != "gpufleet" or len(parts) < 2:
        return None
    for level, names in enumerate(FLOORS):
        if parts[1] in names:
            return level
    raise LookupError(f"{module}: gpufleet.{parts[1]} is on no floor (add it to FLOORS in tests/import_graph.py)")


def upward_imports(edges: Mapping[str, Iterable[str]]) -> list[str]:
    """Each import from a runtime module to one on a higher floor."""
    found = []
    for module, targets in sorted(edges.items()):
        low = floor_of(module)
        for target in sorted(targets):
            high = floor_of(target)
            if low is not None and high is not None and high > low:
                found.append(f"{module} (floor {low}) imports {target} (floor {high})")
    return found


def circles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Each set of modules that import each other round a circle (strongly connected, > 1 module or a
    module importing itself), iteratively (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    members.append(top)
                    if top == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return sorted(found)


def main() -> int:
    edges = graph()
    problems = upward_imports(edges) + [" <-> ".join(c) for c in circles(edges)]
    for line in problems:
        print(line)
    runtime = sum(1 for m in edges if m.startswith("gpufleet."))
    print(f"{len(edges)} modules ({runtime} in the runtime), {sum(map(len, edges.values()))} imports: ", end="")
    print(f"{len(problems)} problem(s)" if problems else "no import runs up a floor, no import circle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
