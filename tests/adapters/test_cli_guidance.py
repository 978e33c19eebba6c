"""What a new user met (issue 23), one table per lesson: a refusal says why and what to pass, help says
what each command and argument is for, `silence` says how long and by whom, and a validation message says
what was expected instead of `(got a dict)`."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpufleet.domain.errors import describe_validation_error
from gpufleet_tools.cli import COMMANDS, DISTRIBUTION, build_parser, main
from gpufleet_tools.cli import silence as silence_cli
from tests.adapters.test_cli import _modules_loaded_by


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--high", "20", "--low", "80"],
            "error: --high 20 is below --low 80: from 20 % to 80 % both alarms fire, scaling out and in at once; "
            "pass --high above --low (defaults: --high 85 --low 20)",
        ),
        (
            ["--high", "50", "--low", "50"],
            "error: --high 50 equals --low 50: with no band between them the group scales out and in by turns; "
            "pass --high above --low (defaults: --high 85 --low 20)",
        ),
        (["--low", "90"], "error: --high 85 is below --low 90"),
        (["--high", "120"], "error: --high 120 is not a percentage: pass a value from 0 to 100"),
        (["--memory-high", "-5"], "error: --memory-high -5 is not a percentage"),
        (["--high", "20", "--low", "80", "--apply"], "error: --high 20 is below --low 80"),  # before any AWS call
    ],
)
def test_alarm_thresholds_that_cannot_work_are_refused(
    flags: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["alarms", "asg:train-spot", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(line), err


@pytest.mark.parametrize("flags", [[], ["--high", "80", "--low", "25"], ["--high", "21", "--low", "20"]])
def test_a_band_with_high_above_low_is_printed(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alarms", "asg:train-spot", *flags]) == 0
    assert "GpufleetTrainSpotGpuHigh" in capsys.readouterr().out


def test_the_top_level_help_lists_every_command_by_purpose() -> None:
    description = build_parser().description or ""
    listed = [name.strip() for line in description.splitlines()[1:] for name in line.split(":", 1)[1].split(",")]
    assert sorted(listed) == sorted(COMMANDS)
    help_text = build_parser().format_help()
    assert "--version" in help_text and "COMMAND -h" in help_text


def _arguments(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _arguments(sub, f"{path} {name}".strip())
        elif not isinstance(action, argparse._HelpAction):
            found.append((path, action))
    return found


# replay and local are checked with their own modules' changes; every other command is here.
HELPED = [name for name, c in COMMANDS.items() if c.module not in ("replay", "local")]


@pytest.mark.parametrize("command", HELPED)
def test_every_argument_says_what_it_is_for(command: str) -> None:
    bare = [f"{path} {a.option_strings or a.dest}" for path, a in _arguments(build_parser(), "") if not a.help]
    assert [b for b in bare if b.split()[0] == command] == []


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        ("validate-policy", "the fleet policy, YAML or JSON"),
        ("explain", "how many recent decisions"),
        ("silence", "(default 2h)"),
        ("alarms", "(percent, default 85; above --low)"),
    ],
)
def test_help_names_what_was_missing(command: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "-h"])
    assert needle in " ".join(capsys.readouterr().out.split())


def test_version_comes_from_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"gpufleet {version(DISTRIBUTION)}\n"


def test_version_from_an_uninstalled_checkout_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.metadata

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("gpufleet unknown (not installed: pip install")


def test_version_imports_no_command() -> None:
    loaded = _modules_loaded_by(["--version"])
    assert not {m for m in loaded if m.startswith("gpufleet_tools.cli.") and m != "gpufleet_tools.cli.__main__"}


def test_explain_refuses_a_limit_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "asg:train-spot", "--limit", "0"])
    assert exit_.value.code == 2 and "expected a whole number from 1 (got '0')" in capsys.readouterr().err


class _Store:
    def __init__(self) -> None:
        self.put: list[Any] = []

    def put_silence(self, s: Any) -> None:
        self.put.append(s)


@pytest.mark.parametrize(
    ("flags", "env_user", "login", "by", "span"),
    [
        ([], "alice", "root", "alice", "silenced for 2h (default; --for to change), until "),
        (["--for", "90m"], "alice", "root", "alice", "silenced for 90m, until "),
        (["--for", "1d", "--by", "bob"], None, "root", "bob", "silenced for 1d, until "),
        ([], None, "carol", "carol", "silenced for 2h (default"),  # no $USER: the OS login
        ([], None, OSError, "unknown (set --by or $USER)", "silenced for 2h (default"),  # no login either
    ],
)
def test_silence_says_for_how_long_and_by_whom(
    flags: list[str],
    env_user: str | None,
    login: str | type[Exception],
    by: str,
    span: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import getpass

    store = _Store()
    monkeypatch.setattr(silence_cli, "_store", lambda args: store)
    if env_user is None:
        monkeypatch.delenv("USER", raising=False)
    else:
        monkeypatch.setenv("USER", env_user)

    def getuser() -> str:
        if isinstance(login, str):
            return login
        raise login("no login name")

    monkeypatch.setattr(getpass, "getuser", getuser)
    assert main(["silence", "--kind", "scaling", "--endpoint", "http://127.0.0.1:1", *flags]) == 0
    [s] = store.put
    first, second = capsys.readouterr().out.splitlines()
    assert s.created_by == by and first == f"silence {s.silence_id} by {by}: kinds scaling (silenced from the CLI)"
    assert second.startswith(span) and second.endswith(f"(--expire {s.silence_id} ends it sooner)")
    wanted = {"90m": timedelta(minutes=90), "1d": timedelta(days=1)}.get(flags[1] if flags else "", timedelta(hours=2))
    assert s.expires_at - s.starts_at == wanted


@pytest.mark.parametrize(
    ("policy", "line"),
    [
        ("groups: {train-spot: {max: 6}}", "groups: expected a list, got a mapping {train-spot: ...}"),
        ("groups: [train-spot]", "groups[0]: expected a mapping, got 'train-spot'"),
        (
            "groups: [{name: a, kind: asg, max: {x: 1}}]",
            "groups[0] (a).max: expected an integer, got a mapping {x: ...}",
        ),
        (
            "groups: [{name: a, kind: asg, dry_run: [1, 2]}]",
            "groups[0] (a).dry_run: expected true or false, got a list of 2 items",
        ),
        (
            "notifications: {default_route: [1]}",
            "notifications.default_route: expected a mapping, got a list of 1 item",
        ),
        ("spot: {groups: [{}]}", "spot.groups[0].group: Field required"),
        ("groups: [{kind: asg}]", "groups[0]: a group rule selects by name or by tags (or both)"),
        (
            "groups: [{name: a, kind: gke}]",
            "groups[0] (a).kind: Input should be 'asg', 'eks-nodegroup' or 'hyperpod' (got 'gke')",
        ),
    ],
)
def test_validation_says_what_was_expected(
    policy: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    assert main(["validate-policy", str(path)]) == 1
    problems = [p.strip() for p in capsys.readouterr().err.splitlines()[1:]]
    assert problems == [line]


class _Event(BaseModel):
    time: datetime
    detail: dict[str, str]


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({"time": {"a": 1}, "detail": {}}, "time: Input should be a valid datetime (got a mapping {a: ...})"),
        (
            {"time": "2026-01-01T00:00:00Z", "detail": {f"k{i}\n": i for i in range(5)}},
            "detail.k0: expected a string",  # a key with a line break stays one line
        ),
        (
            {"time": "2026-01-01T00:00:00Z", "detail": ["x" * 500]},
            "detail: expected a mapping, got a list of 1 item",  # a container's content is never echoed
        ),
    ],
)
def test_an_events_problem_stays_one_short_line(data: dict[str, Any], line: str) -> None:
    with pytest.raises(ValidationError) as err:
        _Event.model_validate(data)
    [problem, *_] = describe_validation_error(err.value)
    assert problem.startswith(line) and "\n" not in problem and "x" * 100 not in problem
