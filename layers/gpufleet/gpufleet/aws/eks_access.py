"""An EKS cluster's API endpoint and the token to get in: the `aws-iam-authenticator` token is signed
with the function's own role (botocore's SigV4 signer, no kubeconfig, no network call to make it), the
endpoint and CA come from EKS DescribeCluster (or a local override). The Kubernetes client that uses
them is `gpufleet.kubernetes.cluster`."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from botocore.signers import RequestSigner

from gpufleet.aws.clients import AWS_FAILURES, Session, error_code, is_loopback
from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.settings import KubeEndpoint

if TYPE_CHECKING:
    from mypy_boto3_eks import EKSClient

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"  # signed into the URL: the token is good for this cluster only
PRESIGN_EXPIRES_S = 60  # aws-iam-authenticator's value; STS honours the URL 15 minutes from X-Amz-Date anyway
TOKEN_LIFETIME = timedelta(minutes=14)  # those 15 minutes less the authenticator's own minute of cushion


@dataclass(frozen=True)
class Endpoint:
    """One cluster's API server: its URL, the bearer token (never shown) and the CA (base64 PEM)."""

    url: str
    token: str = field(repr=False)
    ca_data: str | None = None


@dataclass(frozen=True)
class EksToken:
    value: str = field(repr=False)
    expires_at: datetime


def eks_token(cluster: str, session: Session, sts: Any = None) -> EksToken:
    """The bearer token EKS accepts for the session's identity: `k8s-aws-v1.` + the base64url (unpadded)
    of an STS GetCallerIdentity URL presigned with the `x-k8s-aws-id: <cluster>` header signed in. Made
    locally (botocore's SigV4 signer reads the clock itself); `expires_at` is read back from the URL's
    X-Amz-Date. `sts` (a client of the session, for its regional endpoint) is made when not given."""
    sts = sts or session.client("sts")
    credentials = session.get_credentials()
    if credentials is None:
        raise ClusterUnreadable(cluster, "no AWS credentials to sign an EKS token with", "unauthorized")
    region = sts.meta.region_name
    signer = RequestSigner(sts.meta.service_model.service_id, region, "sts", "v4", credentials, sts.meta.events)
    request = {
        "method": "GET",
        "url": f"{sts.meta.endpoint_url.rstrip('/')}/?Action=GetCallerIdentity&Version=2011-06-15",
        "body": {},
        "headers": {CLUSTER_ID_HEADER: cluster},
        "context": {},
    }
    url = signer.generate_presigned_url(request, region_name=region, expires_in=PRESIGN_EXPIRES_S, operation_name="")
    signed_at = datetime.strptime(parse_qs(urlsplit(url).query)["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ")
    encoded = base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
    return EksToken(TOKEN_PREFIX + encoded, signed_at.replace(tzinfo=UTC) + TOKEN_LIFETIME)


class EksEndpoints:
    """Where one EKS cluster's API is and the token to get in: the override's URL, token and CA where
    GPUFLEET_KUBE_ENDPOINTS gives one, else DescribeCluster's endpoint and CA and a token signed with the
    function's role."""

    def __init__(self, eks: EKSClient, session: Session, overrides: Mapping[str, KubeEndpoint] | None = None) -> None:
        self.eks, self.session, self.overrides = eks, session, dict(overrides or {})
        self._sts: Any = None

    def endpoint(self, cluster: str) -> Endpoint:
        override = self.overrides.get(cluster)
        url, ca_data = (override.url, override.ca_data) if override else self._described(cluster)
        if override and override.token is not None:
            token = override.token.get_secret_value()
        elif url.startswith("http://") and not is_loopback(url):
            raise ClusterUnreadable(cluster, "an http:// endpoint gets no signed EKS token (only loopback may)", "tls")
        else:
            try:
                self._sts = self._sts or self.session.client("sts")
                token = eks_token(cluster, self.session, self._sts).value
            except AWS_FAILURES as err:  # no region, credentials that cannot be resolved, ...
                why = f"cannot sign an EKS token ({error_code(err)})"
                raise ClusterUnreadable(cluster, why, "unauthorized") from None
        return Endpoint(url, token, ca_data)

    def _described(self, cluster: str) -> tuple[str, str | None]:
        try:
            found = self.eks.describe_cluster(name=cluster)["cluster"]
        except AWS_FAILURES as err:
            raise ClusterUnreadable(cluster, f"EKS DescribeCluster failed ({error_code(err)})", "describe") from None
        endpoint = found.get("endpoint")
        if not endpoint:
            status = found.get("status", "unknown")
            raise ClusterUnreadable(cluster, f"the cluster has no API endpoint yet (status {status})", "describe")
        return endpoint, found.get("certificateAuthority", {}).get("data")
