"""A function's environment, parsed once into one validated model (an invalid value names its variable).

The composition root (`runtime`) is the only place that passes `os.environ` here; everything else gets
typed settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.domain import defaults
from gpufleet.domain.errors import SettingsError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    state_table: str | None = Field(default=None, alias=defaults.ENV_STATE_TABLE, max_length=255)
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

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        try:
            return cls.model_validate({k: v for k, v in env.items() if k.startswith("GPUFLEET_")})
        except ValidationError as err:
            problems = []
            for e in err.errors():
                name = str(e["loc"][0]) if e["loc"] else "?"
                problems.append(f"{name}: {e['msg'].removeprefix('Value error, ')} (got {str(e.get('input'))[:60]!r})")
            raise SettingsError("invalid environment: " + "; ".join(problems)) from None

    def require(self, value: str | None, variable: str, why: str) -> str:
        if not value:
            raise SettingsError(f"{variable} is not set: {why}")
        return value
