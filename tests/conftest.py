"""Shared fixtures. Integration and e2e tests talk to a real moto server over HTTP on 127.0.0.1. The
hypothesis profile (HYPOTHESIS_PROFILE: dev, ci, deep) is loaded by tests/profiles.py, imported here first."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rehearsal.calls import CallRecorder
from rehearsal.moto import MotoServer, aws_environment
from tests import profiles

HYPOTHESIS_PROFILE = profiles.PROFILE  # loaded on import: every test module's settings see it

ROOT = Path(__file__).resolve().parents[1]
# Every AWS call the functions make in this session, for the IAM conformance test (tests/iam).
RECORDER = CallRecorder()
REHEARSAL_CALLS = ROOT / ".pytest-rehearsal-calls.jsonl"  # what the e2e rehearsal subprocess recorded


def pytest_sessionstart(session: pytest.Session) -> None:
    if not os.environ.get("GPUFLEET_KEEP_REHEARSAL_CALLS"):  # `make pytest`: the side session writes them
        REHEARSAL_CALLS.unlink(missing_ok=True)
    RECORDER.install()


def pytest_sessionfinish(session: pytest.Session) -> None:
    RECORDER.uninstall()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The IAM conformance test runs last: it evaluates the calls every other test made."""
    items.sort(key=lambda item: "tests/iam/test_conformance.py" in str(item.fspath))


@pytest.fixture(scope="session")
def moto_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def aws(moto_server_url: str) -> Iterator[str]:
    """A clean moto server (every backend reset) with boto3 pointed at it."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{moto_server_url}/moto-api/reset", method="POST"), timeout=120)
    with aws_environment(moto_server_url):
        os.environ["POWERTOOLS_TRACE_DISABLED"] = "true"
        os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"
        yield moto_server_url
