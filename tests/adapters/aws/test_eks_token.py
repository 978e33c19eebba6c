"""The EKS bearer token, decoded the way aws-iam-authenticator's verifier reads it (pkg/token/token.go):
`k8s-aws-v1.` + unpadded base64url of an https STS GetCallerIdentity URL on the partition's STS host, path
"/", only the parameters it allows, x-k8s-aws-id among the signed headers, X-Amz-Expires within 0..900.
Made offline: a session with static credentials, botocore's signer clock pinned."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest

from gpufleet.aws.eks_access import TOKEN_PREFIX, eks_token
from gpufleet.domain.errors import ClusterUnreadable

ALLOWED = {
    "action",
    "version",
    "x-amz-algorithm",
    "x-amz-credential",
    "x-amz-date",
    "x-amz-expires",
    "x-amz-security-token",
    "x-amz-signature",
    "x-amz-signedheaders",
}
SIGNED_AT = datetime(2026, 11, 23, 9, 0, 0)


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> boto3.Session:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: SIGNED_AT)
    return boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-west-2")


def decoded(token: str) -> tuple[str, dict[str, str]]:
    assert token.startswith(TOKEN_PREFIX)
    encoded = token.removeprefix(TOKEN_PREFIX)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", encoded), "base64url without padding"
    url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    query = parse_qs(urlsplit(url).query, strict_parsing=True)
    assert all(len(v) == 1 for v in query.values())
    return url, {k: v[0] for k, v in query.items()}


def test_the_token_is_a_presigned_get_caller_identity_for_the_cluster(session: boto3.Session) -> None:
    token = eks_token("ml", session)
    url, query = decoded(token.value)
    parts = urlsplit(url)
    assert (parts.scheme, parts.hostname, parts.path) == ("https", "sts.us-west-2.amazonaws.com", "/")
    assert {k.lower() for k in query} <= ALLOWED
    assert query["Action"] == "GetCallerIdentity"
    assert query["Version"] == "2011-06-15"
    assert query["X-Amz-Expires"] == "60"
    assert query["X-Amz-SignedHeaders"].split(";") == ["host", "x-k8s-aws-id"]
    assert query["X-Amz-Credential"] == "AKIDEXAMPLE/20261123/us-west-2/sts/aws4_request"
    assert query["X-Amz-Date"] == "20261123T090000Z"
    assert token.expires_at == datetime(2026, 11, 23, 9, 14, tzinfo=UTC)  # 15 min from X-Amz-Date, less 1
    assert len(token.value) <= 4096  # the verifier's limit


def test_the_cluster_is_signed_in_and_the_token_never_shows(session: boto3.Session) -> None:
    ml, other = eks_token("ml", session), eks_token("ml-2", session)
    (_, a), (_, b) = decoded(ml.value), decoded(other.value)
    assert {k for k in a if a[k] != b[k]} == {"X-Amz-Signature"}  # same instant: only the header differs
    assert ml.value not in repr(ml)


def test_session_credentials_are_carried(session: boto3.Session) -> None:
    """A role's temporary credentials (what Lambda has) sign with their session token."""
    temporary = boto3.Session(
        aws_access_key_id="ASIAEXAMPLE", aws_secret_access_key="s", aws_session_token="tok", region_name="eu-west-1"
    )
    _, query = decoded(eks_token("ml", temporary).value)
    assert query["X-Amz-Security-Token"] == "tok"
    assert query["X-Amz-Credential"].split("/")[2] == "eu-west-1"


def test_no_credentials_is_one_line_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    with pytest.raises(ClusterUnreadable, match="cannot read the pods of EKS cluster ml: no AWS credentials"):
        eks_token("ml", boto3.Session(region_name="us-east-1"))
