"""The one place the operator tooling makes AWS clients: the caller's credentials (or moto's fake ones on
loopback), standard retries, and an optional endpoint (moto server, `gpufleet local up`)."""

from __future__ import annotations

import os
from typing import Any

import boto3

from gpufleet.aws.clients import RETRY_CONFIG, is_loopback
from gpufleet.domain import defaults

LOCAL_REGION = "us-east-1"
_MOTO_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def use_endpoint(endpoint: str | None) -> None:
    """Point every boto3 client made later in this process at `endpoint` (moto server); only a loopback
    one gets fake credentials, never real AWS."""
    os.environ.setdefault("AWS_DEFAULT_REGION", LOCAL_REGION)
    if endpoint:
        os.environ[defaults.ENV_ENDPOINT_URL] = endpoint
        if is_loopback(endpoint):  # moto accepts any credentials
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")


def client(service: str, endpoint: str | None = None, region: str | None = None) -> Any:
    """A client for `service`: at `endpoint` when given (a loopback one with moto's credentials), else
    wherever the environment points (AWS_ENDPOINT_URL, the caller's credentials and region)."""
    local = _MOTO_CREDENTIALS if endpoint and is_loopback(endpoint) else {}
    return boto3.client(service, endpoint_url=endpoint, region_name=region, config=RETRY_CONFIG, **local)


def clients(services: tuple[str, ...], endpoint: str | None = None) -> dict[str, Any]:
    """Several clients from one session (the replay's CloudWatch history reads four services)."""
    session = boto3.session.Session()
    return {s: session.client(s, endpoint_url=endpoint, config=RETRY_CONFIG) for s in services}


def account_id() -> str | None:
    """The account the configured credentials (or moto) answer for; None when it cannot be asked."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(client("sts").get_caller_identity()["Account"])
    except (BotoCoreError, ClientError):
        return None
