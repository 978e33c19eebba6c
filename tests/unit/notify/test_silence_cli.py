"""`gpufleet silence` refuses a kind no notification has (a typo would otherwise silence nothing)."""

from __future__ import annotations

import pytest

from gpufleet.cli import main
from gpufleet.notify.model import NotificationKind


def test_a_misspelled_kind_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["silence", "--kind", "scalling", "--endpoint", "http://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice: 'scalling'" in err
    assert all(f"'{k}'" in err for k in NotificationKind)
