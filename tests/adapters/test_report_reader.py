"""Reading the records (FAKE logs client here; moto server in tests/integration/test_report_moto.py):
time slices, paging with nextToken, the JSON filter for --group/--cluster, one line per failure; and the
command's own checks of its options."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, NoCredentialsError

from gpufleet_tools.cli import main
from gpufleet_tools.report.reader import ReportUnavailable, json_filter, read_usage, slices
from gpufleet_tools.report.usage import Period, Selection
from tests.unit.test_report_usage import DAY0, PERIOD


class FakeLogs:
    """FAKE FilterLogEvents: `pages` pages of `per_page` messages per slice, or `error` raised."""

    def __init__(self, pages: int = 3, per_page: int = 2, error: Exception | None = None) -> None:
        self.pages, self.per_page, self.error = pages, per_page, error
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def filter_log_events(self, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            self.calls.append(kwargs)
        if self.error:
            raise self.error
        page = int(kwargs.get("nextToken", "0"))
        events = [
            {
                "logStreamName": f"i-{i}",
                "timestamp": kwargs["startTime"],
                "message": f"{kwargs['startTime']}-{page}-{i}",
            }
            for i in range(self.per_page)
        ]
        return {"events": events, **({"nextToken": str(page + 1)} if page + 1 < self.pages else {})}


def test_a_period_is_cut_into_days_or_hours() -> None:
    assert len(slices(PERIOD)) == 3
    short = Period(DAY0, DAY0 + timedelta(minutes=100))
    start = int(DAY0.timestamp() * 1000)
    assert slices(short) == [(start, start + 3_600_000), (start + 3_600_000, start + 6_000_000)]


def test_every_page_of_every_slice_is_read_within_the_rate() -> None:
    logs, got = FakeLogs(), []
    stats = read_usage(logs, PERIOD, Selection(), lambda *event: got.append(event), workers=3, max_tps=1000)
    assert (stats.calls, stats.events, stats.slices) == (9, 18, 3)
    assert len(set(got)) == 18 and stats.bytes == sum(len(m) for _, _, m in got)
    # each record goes on with its log stream and its event's timestamp (what report.bounds checks)
    assert all(stream == f"i-{m[-1]}" and m.startswith(f"{stamp}-") for stream, stamp, m in got)
    first = [c for c in logs.calls if "nextToken" not in c]
    assert sorted((c["startTime"], c["endTime"]) for c in first) == [(s, e - 1) for s, e in slices(PERIOD)]
    assert all(c["logGroupName"] == "/gpufleet/usage" and "filterPattern" not in c for c in logs.calls)


def test_groups_and_clusters_become_a_json_filter_pattern() -> None:
    both = Selection(frozenset({"asg:train"}), frozenset({"ml"}))
    assert json_filter(both) == '{ ($.group = "asg:train") || ($.group = "eks:ml/*") }'
    assert json_filter(Selection()) is None
    assert json_filter(Selection(frozenset({'asg:we"ird'}))) is None
    logs = FakeLogs(pages=1)
    read_usage(logs, PERIOD, both, lambda *_: None, max_tps=1000)
    assert {c["filterPattern"] for c in logs.calls} == {json_filter(both)}


def _client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "nope"}}, "FilterLogEvents")


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (_client_error("ResourceNotFoundException"), 1, "no log group /gpufleet/usage: usage attribution is off"),
        (NoCredentialsError(), 2, "no AWS credentials"),
        (_client_error("AccessDeniedException"), 2, "not allowed to read /gpufleet/usage: the caller needs"),
        (_client_error("ThrottlingException"), 2, "cannot read /gpufleet/usage: ThrottlingException"),
    ],
)
def test_a_failure_is_one_line_and_an_exit_code(error: Exception, code: int, line: str) -> None:
    with pytest.raises(ReportUnavailable) as raised:
        read_usage(FakeLogs(error=error), PERIOD, Selection(), lambda *_: None, max_tps=1000)
    assert raised.value.code == code and str(raised.value).startswith(line)


def test_no_credentials_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # boto3's default session keeps the credentials it resolved for an earlier test (moto's): not ours
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    assert main(["report", "--since", "1h", "--no-progress"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: no AWS credentials")


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--end", "2026-11-02"], "error: --end needs --start"),
        (["--start", "2026-11-02", "--end", "2026-11-01"], "error: the period ends before it starts"),
        (["--group", "eks:nocluster"], "error: not a group key: 'eks:nocluster'"),
        (["--top", "0"], "error: --top and --workers are at least 1"),
    ],
)
def test_options_that_cannot_work_are_refused_in_one_line(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--endpoint", "http://127.0.0.1:1", *argv]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(error)


def test_a_policy_that_does_not_parse_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("spot: {prices: {on_demand: {g5.xlarge: cheap}}}\n")
    assert main(["report", "--policy", str(policy), "--endpoint", "http://127.0.0.1:1"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {policy}: spot.prices.on_demand.g5.xlarge")


def test_since_and_start_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--since", "1d", "--start", "2026-11-01"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_slices_are_cut_on_whole_hours_so_a_window_and_those_over_it_are_read_in_one() -> None:
    """A period from 10:05: a slice boundary at 10:05 + 1 h would split the 11:00 hour, so an hour-long
    window at 11:00 and a 5-minute one at 11:30 would be read in two slices and never judged together."""
    start = DAY0 + timedelta(hours=10, minutes=5)
    period = Period(start, start + timedelta(hours=2))
    ms = int(start.timestamp() * 1000)
    assert slices(period) == [(ms, ms + 3_300_000), (ms + 3_300_000, ms + 6_900_000), (ms + 6_900_000, ms + 7_200_000)]
    at = int((DAY0 + timedelta(hours=11)).timestamp())
    assert period.slice_of(at) == period.slice_of(at + 3599) == 1 != period.slice_of(at + 3600)


def test_each_slice_read_to_its_end_is_told() -> None:
    done: list[tuple[int, int]] = []
    read_usage(
        FakeLogs(),
        PERIOD,
        Selection(),
        lambda *event: None,
        workers=2,
        max_tps=1000,
        on_slice=lambda *s: done.append(s),
    )
    assert sorted(done) == slices(PERIOD)
