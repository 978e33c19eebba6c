"""The one place the operator tooling makes AWS clients: the caller's credentials (or moto's fake ones on
loopback), standard retries, and an optional endpoint (moto server, `gpufleet local up`)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoAuthTokenError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
    SSOError,
    TokenRetrievalError,
)

from gpufleet.aws.clients import RETRY_CONFIG, error_code, is_loopback, new_session
from gpufleet.domain import defaults

LOCAL_REGION = "us-east-1"
LOCAL_UP = 'eval "$(gpufleet local up)"'
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
    session = new_session()
    return {s: session.client(s, endpoint_url=endpoint, config=RETRY_CONFIG) for s in services}


def account_id() -> str | None:
    """The account the configured credentials (or moto) answer for; None when it cannot be asked."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(client("sts").get_caller_identity()["Account"])
    except (BotoCoreError, ClientError):
        return None


_NO_CREDENTIALS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError, ProfileNotFound)
_SSO = (SSOError, TokenRetrievalError, NoAuthTokenError)
_NO_CONNECTION = (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError, ReadTimeoutError)
_REJECTED = {
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "AuthFailure",
}


def aws_trouble(exc: BaseException, endpoint: str | None) -> str | None:
    """Why no AWS call could be made at all (credentials, region, nothing listening), in one line with what
    to do; None for anything else."""
    local = f"or use --endpoint http://127.0.0.1:PORT for the local stack (`{LOCAL_UP}`)"
    if isinstance(exc, _NO_CREDENTIALS):
        return f"no AWS credentials found ({exc}): run `aws configure` or set AWS_PROFILE, {local}"
    if isinstance(exc, NoRegionError):
        return f"no AWS region set: set AWS_REGION or run `aws configure set region REGION`, {local}"
    if isinstance(exc, _SSO):
        return f"your AWS SSO login cannot be used ({exc}): run `aws sso login`, {local}"
    if isinstance(exc, _NO_CONNECTION):
        local_stack = f"is the server running? `{LOCAL_UP}` starts one" if endpoint else "check your network"
        return f"nothing answers at {endpoint or 'AWS'} ({exc}): {local_stack}"
    if isinstance(exc, ClientError) and (code := error_code(exc)) in _REJECTED:
        return f"AWS rejected your credentials ({code}): refresh them (`aws sso login`, `aws configure`), {local}"
    return None
