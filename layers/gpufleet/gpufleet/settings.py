"""A function's environment, parsed once into one validated model (an invalid value names its variable).

The composition root (`runtime`) is the only place that passes `os.environ` here; everything else gets
typed settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from gpufleet.domain import defaults
from gpufleet.domain.errors import SettingsError

# Where a cluster's Kubernetes API is, for local runs (the way --endpoint points AWS at moto): JSON
# {"ml": {"url": "http://127.0.0.1:8001", "token": "..."}}. A cluster not named here is found through EKS
# DescribeCluster and signed for with the function's role.
ENV_KUBE_ENDPOINTS = "GPUFLEET_KUBE_ENDPOINTS"
_SECRET_VARIABLES = {ENV_KUBE_ENDPOINTS}  # an error about these never shows the value (it may hold a token)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class KubeEndpoint(BaseModel):
    """A cluster's API server given by hand: its URL, and optionally a bearer token (else an EKS token is
    signed) and the base64 PEM of its certificate authority (else DescribeCluster's, or the system's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2048)
    token: SecretStr | None = None
    ca_data: str | None = Field(default=None, max_length=65536)


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    state_table: str | None = Field(default=None, alias=defaults.ENV_STATE_TABLE, max_length=255)
    account_id: str | None = Field(default=None, alias=defaults.ENV_ACCOUNT_ID, pattern=r"^\d{12}$")
    policy_parameter: str | None = Field(
        default=None, alias=defaults.ENV_POLICY_PARAMETER, pattern=r"^/[A-Za-z0-9_./-]+$"
    )
    policy_file: str | None = Field(default=None, alias=defaults.ENV_POLICY_FILE)
    dry_run: bool = Field(default=False, alias=defaults.ENV_DRY_RUN)
    notify_queue_url: str | None = Field(default=None, alias=defaults.ENV_NOTIFY_QUEUE_URL)
    notify_dlq_url: str | None = Field(default=None, alias=defaults.ENV_NOTIFY_DLQ_URL)
    notify_topic_arn: str | None = Field(
        default=None, alias=defaults.ENV_NOTIFY_TOPIC_ARN, pattern=r"^arn:aws[a-z-]*:sns:"
    )
    slack_secret_arn: str | None = Field(default=None, alias=defaults.ENV_SLACK_SECRET)
    slack_api_url: str | None = Field(default=None, alias=defaults.ENV_SLACK_API_URL)
    slack_timeout_s: int = Field(default=defaults.SLACK_TIMEOUT_S, alias=defaults.ENV_SLACK_TIMEOUT_S, ge=1, le=60)
    kube_endpoints: dict[str, KubeEndpoint] = Field(default_factory=dict, alias=ENV_KUBE_ENDPOINTS)

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """CloudFormation passes "" for an optional parameter left empty."""
        return None if value == "" else value

    @field_validator("dry_run", mode="before")
    @classmethod
    def _boolean(cls, value: Any) -> bool:
        text = str(value if value is not None else "").strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("expected true or false")

    @field_validator("kube_endpoints", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if value is None or value == "":
            return {}
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError('not JSON: expected {"CLUSTER": {"url": "https://...", "token": "..."}}') from None
        if not isinstance(value, dict):
            raise ValueError('expected a JSON object {"CLUSTER": {"url": ...}}')
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        try:
            return cls.model_validate({k: v for k, v in env.items() if k.startswith("GPUFLEET_")})
        except ValidationError as err:
            problems = []
            for e in err.errors():
                name = str(e["loc"][0]) if e["loc"] else "?"
                where = ".".join([name, *(str(part) for part in e["loc"][1:])])
                got = "hidden" if name in _SECRET_VARIABLES else repr(str(e.get("input"))[:60])
                problems.append(f"{where}: {e['msg'].removeprefix('Value error, ')} (got {got})")
            raise SettingsError("invalid environment: " + "; ".join(problems)) from None

    def require(self, value: str | None, variable: str, why: str) -> str:
        if not value:
            raise SettingsError(f"{variable} is not set: {why}")
        return value
