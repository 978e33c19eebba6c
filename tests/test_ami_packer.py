"""ami/gpufleet-gpu-node.pkr.hcl checked without Packer's AWS plugin or an AWS account.

What can run here: Debian's packer (1.6.6, bookworm) cannot read the template at all: `required_plugins`
needs Packer >= 1.7, and its built-in amazon-ebs builder predates `metadata_options`. `packer init`
would fetch the amazon plugin from GitHub. So the template is parsed with an HCL2 parser (python-hcl2,
a dev requirement) and checked against what a build does: every variable and local it uses is declared,
the build's source exists, every file it uploads exists, install.sh finds every file it reads next to
itself where the build puts it, and the build calls install.sh with arguments install.sh takes, with the
layer where the file provisioner puts it (a directory without a trailing slash lands as a subdirectory:
Packer's file provisioner docs). Where a packer binary is on PATH, its syntax check runs too (on the
template less its `packer {}` block, which 1.6.6 does not know). Not checked: the amazon-ebs arguments'
meaning, the source AMI filter's matches, the build itself.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest

AMI = Path(__file__).resolve().parents[1] / "ami"
TEMPLATE = AMI / "gpufleet-gpu-node.pkr.hcl"
INSTALL = AMI / "install.sh"


def unquote(value: Any) -> Any:
    """python-hcl2 keeps string literals' quotes ('"x"'); expressions come as '${...}'."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def names(blocks: list[dict[str, Any]]) -> set[str]:
    return {unquote(name) for block in blocks for name in block}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    with TEMPLATE.open() as f:
        return hcl2.load(f)


def provisioners(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    [build] = template["build"]
    return [(unquote(kind), body) for p in build["provisioner"] for kind, body in p.items()]


def uploads(template: dict[str, Any]) -> list[tuple[Path, str]]:
    """(local path, remote path) of everything the file provisioners upload, as Packer places it."""
    placed = []
    for kind, body in provisioners(template):
        if kind != "file":
            continue
        destination = unquote(body["destination"])
        for source in [body["source"]] if "source" in body else body["sources"]:
            local = AMI / unquote(source).replace("${path.root}/", "")
            remote = destination + local.name if destination.endswith("/") else destination + "/" + local.name
            placed.append((local.resolve(), remote))
    return placed


def install_commands(template: dict[str, Any]) -> list[list[str]]:
    return [
        shlex.split(unquote(line))
        for kind, body in provisioners(template)
        if kind == "shell"
        for line in body.get("inline", [])
        if "install.sh" in line
    ]


def test_every_variable_and_local_used_is_declared(template: dict[str, Any]) -> None:
    text = TEMPLATE.read_text()
    assert set(re.findall(r"\bvar\.([a-z_]+)", text)) <= names(template["variable"])
    assert set(re.findall(r"\blocal\.([a-z_]+)", text)) <= {k for block in template["locals"] for k in block} - {
        "__is_block__"
    }
    [build] = template["build"]
    declared = {
        f"source.{unquote(kind)}.{unquote(name)}" for s in template["source"] for kind, v in s.items() for name in v
    }
    assert {unquote(s) for s in build["sources"]} <= declared


def test_every_uploaded_file_exists_and_install_sh_finds_its_files_beside_it(template: dict[str, Any]) -> None:
    placed = uploads(template)
    for local, _ in placed:
        assert local.exists(), local
    [install_remote] = [remote for local, remote in placed if local == INSTALL]
    beside = {remote for _, remote in placed if remote.rsplit("/", 1)[0] == install_remote.rsplit("/", 1)[0]}
    needed = set(re.findall(r'"\$HERE/([^"]+)"', INSTALL.read_text()))
    assert needed, "install.sh reads no file beside it? the check would be empty"
    assert {install_remote.rsplit("/", 1)[0] + "/" + n for n in needed} <= beside


def test_the_build_runs_install_sh_where_it_put_it_with_arguments_it_takes(template: dict[str, Any]) -> None:
    placed = {remote: local for local, remote in uploads(template)}
    [command] = install_commands(template)
    assert command[:2] == ["sudo", "bash"] and placed[command[2]] == INSTALL
    taken = set(re.findall(r"^\s+(--[a-z-]+)\)", INSTALL.read_text(), re.M))
    flags = [a for a in command[3:] if a.startswith("--")]
    assert set(flags) <= taken and "--root" not in flags and "--no-deps" not in flags  # an AMI: real root, deps
    source = placed[command[command.index("--source") + 1]]
    assert source == (AMI.parent / "layers/node").resolve()
    assert (source / "gpufleet_node/__main__.py").is_file() and (source / "requirements.txt").is_file()


def test_install_sh_runs_after_its_uploads_and_pip_is_installed_first(template: dict[str, Any]) -> None:
    steps = provisioners(template)
    last_upload = max(i for i, (kind, _) in enumerate(steps) if kind == "file")
    [(at, shell)] = [(i, body) for i, (kind, body) in enumerate(steps) if kind == "shell" and "install.sh" in str(body)]
    lines = [unquote(line) for line in shell["inline"]]
    assert at > last_upload
    assert any("python3-pip" in line for line in lines[: next(i for i, x in enumerate(lines) if "install.sh" in x)])


@pytest.mark.skipif(shutil.which("packer") is None, reason="no packer binary here (Debian: apt-get install packer)")
def test_packer_syntax_check_where_a_packer_binary_is_at_hand(tmp_path: Path) -> None:
    text = TEMPLATE.read_text()
    start = text.index("packer {")
    end = text.index('variable "', start)
    (tmp_path / "t.pkr.hcl").write_text(text[:start] + text[end:])
    proc = subprocess.run(
        ["packer", "validate", "-syntax-only", "t.pkr.hcl"],
        cwd=tmp_path,
        env={**os.environ, "CHECKPOINT_DISABLE": "1"},  # no version check over the network
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
