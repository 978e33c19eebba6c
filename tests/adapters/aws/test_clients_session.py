"""new_session: sessions share one model loader, yet each reads its own credentials and region."""

from __future__ import annotations

import pytest

from gpufleet.aws.clients import client, new_session


def test_sessions_share_one_loader_and_its_search_paths_do_not_grow() -> None:
    first, second = new_session("us-east-1"), new_session("us-west-2")
    loader = first._session.get_component("data_loader")
    assert second._session.get_component("data_loader") is loader
    paths = list(loader.search_paths)
    for _ in range(5):
        new_session()
    assert loader.search_paths == paths
    assert len(paths) == len(set(paths))


def test_each_session_reads_the_environment_when_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFIRST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "one")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    first = new_session()
    assert first.get_credentials().access_key == "AKIAFIRST"  # type: ignore[union-attr]
    assert first.region_name == "eu-west-1"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECOND")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    second = new_session()
    assert second.get_credentials().access_key == "AKIASECOND"  # type: ignore[union-attr]
    assert second.region_name == "ap-south-1"
    assert client("sqs").meta.region_name == "ap-south-1"
