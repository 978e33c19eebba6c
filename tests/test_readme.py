"""The README and docs/ hold together: the README stays short, every docs page is reachable from both
indexes, every relative link (and its #anchor) resolves, the architecture page's package trees name exactly
the modules of both packages, and the policy examples parse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
# The trees in docs/architecture.md, each a code block starting with the package's path.
PACKAGES = {
    "layers/gpufleet/gpufleet/": ROOT / "layers" / "gpufleet" / "gpufleet",
    "tools/gpufleet_tools/": ROOT / "tools" / "gpufleet_tools",
}
README_LIMIT_BYTES = 12_000

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def pages() -> list[Path]:
    return sorted(p for p in DOCS.glob("*.md") if p.name != "README.md")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def links(path: Path) -> list[str]:
    """Link targets outside code blocks."""
    return LINK.findall(FENCE.sub("", path.read_text()))


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_readme_stays_short() -> None:
    size = len(README.read_bytes())
    assert size < README_LIMIT_BYTES, f"README.md is {size} bytes; move depth into docs/"


def test_every_docs_page_is_in_both_indexes() -> None:
    assert pages(), "docs/ has no pages"
    index = {target.split("#")[0] for target in links(DOCS / "README.md")}
    readme = README.read_text()
    section = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    readme_index = {target.split("#")[0] for target in LINK.findall(section)}
    assert "docs/README.md" in readme_index
    for page in pages():
        assert page.name in index, f"docs/README.md does not link {page.name}"
        assert f"docs/{page.name}" in readme_index, f"the README's Documentation section does not link {page.name}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    for target in links(path):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{path.name}: {target} points to nothing"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{path.name}: {target}: no heading #{anchor} in {dest.name}"


def tree(root: str) -> str:
    text = ARCHITECTURE.read_text()
    return text.split(f"```\n{root}\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("root", PACKAGES)
def test_the_architecture_tree_matches_the_package(root: str) -> None:
    package = PACKAGES[root]
    described = {m.group(1) for m in re.finditer(r"^  ([a-z_]+(?:/|\.py))", tree(root), re.M)}
    subpackages = {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    assert described == subpackages | modules


@pytest.mark.parametrize("root", PACKAGES)
def test_each_subpackage_line_names_its_modules(root: str) -> None:
    for entry in re.split(r"\n(?=  [a-z_]+/)", tree(root)):
        head = re.match(r"\s*([a-z_]+)/", entry)
        if not head:
            continue
        words = set(re.findall(r"[a-z_0-9]+", entry))
        modules = {p.stem for p in (PACKAGES[root] / head.group(1)).glob("*.py") if p.stem != "__init__"}
        assert modules <= words, (root, head.group(1), modules - words)


def test_the_policy_examples_parse() -> None:
    """Every YAML block in docs/ is a fleet policy (or a section of one) the schema accepts; a whole policy
    (`version:` first) also passes the static checks `gpufleet validate-policy` runs."""
    from gpufleet.policy.checks import policy_problems
    from gpufleet.policy.fleet import parse_policy

    checked = 0
    for path in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"^```yaml\n(.*?)^```", path.read_text(), re.S | re.M):
            if block.startswith("#"):  # the replay's two policies side by side, not one document
                continue
            whole = block.startswith("version:")
            policy = parse_policy(block if whole else f"version: 1\n{block}", source=path.name)
            if whole:
                assert policy_problems(policy) == [], path.name
            checked += 1
    assert checked >= 5
