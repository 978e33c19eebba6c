"""The CLI refuses what would bite: a silence kind no notification has (a typo would silence nothing), and
real AWS without --aws for commands that change it."""

from __future__ import annotations

import pytest

from gpufleet.notify.model import NotificationKind
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
