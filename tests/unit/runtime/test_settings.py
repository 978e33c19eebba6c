"""The environment, parsed once: typed values, empty optional parameters unset, bad values named."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import SettingsError
from gpufleet.settings import Settings


def test_values_are_typed_and_empty_strings_are_unset() -> None:
    s = Settings.from_env(
        {
            "GPUFLEET_STATE_TABLE": "gpufleet-state",
            "GPUFLEET_DRY_RUN": "True",
            "GPUFLEET_SLACK_SECRET_ARN": "",  # CloudFormation passes "" for an empty parameter
            "GPUFLEET_SLACK_TIMEOUT_S": "5",
            "UNRELATED": "x",
        }
    )
    assert (s.state_table, s.dry_run, s.slack_secret_arn, s.slack_timeout_s) == ("gpufleet-state", True, None, 5)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPUFLEET_DRY_RUN": "maybe"}, "GPUFLEET_DRY_RUN: expected true or false (got 'maybe')"),
        ({"GPUFLEET_SLACK_TIMEOUT_S": "600"}, "GPUFLEET_SLACK_TIMEOUT_S: Input should be less than or equal to 60"),
        ({"GPUFLEET_POLICY_PARAMETER": "gpufleet/policy"}, "GPUFLEET_POLICY_PARAMETER: String should match pattern"),
        ({"GPUFLEET_NOTIFY_TOPIC_ARN": "my-topic"}, "GPUFLEET_NOTIFY_TOPIC_ARN: String should match pattern"),
    ],
)
def test_an_invalid_value_names_its_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert message in str(err.value)


def test_a_missing_required_value_says_why() -> None:
    s = Settings.from_env({})
    with pytest.raises(SettingsError, match="GPUFLEET_STATE_TABLE is not set: the scaler needs its state table"):
        s.require(s.state_table, "GPUFLEET_STATE_TABLE", "the scaler needs its state table")


def test_local_kubernetes_endpoints_are_parsed_and_their_tokens_kept_secret() -> None:
    env = {"GPUFLEET_KUBE_ENDPOINTS": '{"ml": {"url": "http://127.0.0.1:8001", "token": "t0k3n"}}'}
    endpoint = Settings.from_env(env).kube_endpoints["ml"]
    assert endpoint.url == "http://127.0.0.1:8001"
    assert endpoint.token is not None and endpoint.token.get_secret_value() == "t0k3n"
    assert "t0k3n" not in repr(endpoint)
    assert Settings.from_env({"GPUFLEET_KUBE_ENDPOINTS": ""}).kube_endpoints == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"ml": {"url": "ftp://x", "token": "t0k3n"}}', "GPUFLEET_KUBE_ENDPOINTS.ml.url: String should match"),
        ('{"ml": {"url": "http://x", "tokn": "t0k3n"}', "GPUFLEET_KUBE_ENDPOINTS: not JSON"),
        ('{"ml": {"url": "http://x", "tokn": "t0k3n"}}', "GPUFLEET_KUBE_ENDPOINTS.ml.tokn: Extra inputs"),
        ('["t0k3n"]', "GPUFLEET_KUBE_ENDPOINTS: expected a JSON object"),
    ],
)
def test_a_bad_kubernetes_endpoint_is_named_without_its_value(value: str, message: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"GPUFLEET_KUBE_ENDPOINTS": value})
    assert message in str(err.value)
    assert "t0k3n" not in str(err.value) and "(got hidden)" in str(err.value)
