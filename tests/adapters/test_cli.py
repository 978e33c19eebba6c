"""The CLI refuses what would bite: a silence kind no notification has (a typo would silence nothing), and
real AWS without --aws for commands that change it."""

from __future__ import annotations

import pytest

from gpufleet.domain.notification import NotificationKind
from gpufleet_tools.cli import main


def test_a_misspelled_kind_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["silence", "--kind", "scalling", "--endpoint", "http://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice: 'scalling'" in err
    assert all(f"'{k}'" in err for k in NotificationKind)


@pytest.mark.parametrize(
    "argv",
    [
        ["silence", "--kind", "scaling"],
        ["invoke", "scaler", "--event", "events/scaler/eventbridge-alarm-asg-high.json"],
        ["local", "send", "events/scaler/eventbridge-alarm-asg-high.json"],
    ],
)
def test_commands_that_change_aws_need_an_endpoint_or_aws(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Without --endpoint they would use the caller's real credentials: refused unless --aws says so."""
    assert main(argv) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {' '.join(argv[:2]) if argv[0] == 'local' else argv[0]} would use your AWS")
    assert "--aws" in line and "--endpoint" in line


def test_every_command_in_the_table_has_a_module_with_arguments_and_a_runner() -> None:
    """The command table is the CLI: each entry's module builds its parser and sets what runs."""
    import argparse
    import importlib

    from gpufleet_tools.cli import COMMANDS, build_parser

    for name, command in COMMANDS.items():
        module = importlib.import_module(f"gpufleet_tools.cli.{command.module}")
        parser = argparse.ArgumentParser(prog=name)
        module.add_arguments(parser, name)
        assert callable(parser.get_default("func")) or parser._subparsers is not None, name
    help_text = build_parser().format_help()
    assert all(name in help_text for name in COMMANDS)


def _modules_loaded_by(argv: list[str]) -> set[str]:
    """The modules a fresh interpreter has loaded after parsing `argv` (the command does not run)."""
    import json
    import subprocess
    import sys

    code = (
        f"import sys, json; from gpufleet_tools.cli import build_parser; a = {argv!r}\n"
        "try: build_parser(a).parse_args(a)\nexcept SystemExit: pass\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_commands_are_imported_lazily() -> None:
    """`gpufleet --help` imports no command; `validate-policy` imports neither boto3 nor the others."""
    top = _modules_loaded_by(["--help"])
    assert not {m for m in top if m.startswith("gpufleet_tools.cli.") and m != "gpufleet_tools.cli.__main__"}
    validate = _modules_loaded_by(["validate-policy", "policy.yaml"])
    assert "gpufleet_tools.cli.validate" in validate
    assert not {"boto3", "gpufleet_tools.cli.replay", "gpufleet_tools.cli.local", "matplotlib"} & validate


def test_replay_options_are_validated_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The replay takes a typed request: an impossible option is one clear line and exit 2, nothing run."""
    assert main(["replay", "--trace", "synthetic:bursty", "--gpus-per-node", "0", "--no-progress"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == "error: gpus_per_node: Input should be greater than or equal to 1 (got 0)"
