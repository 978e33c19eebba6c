"""boto3 clients with standard retries. Endpoints come from the environment (AWS_ENDPOINT_URL,
honoured by boto3 itself), so the same code talks to AWS, moto server or `gpufleet invoke --endpoint`."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import botocore.loaders
import botocore.session
from boto3.session import Session as Session  # the one session type the runtime builds clients from
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.domain.errors import ONE_LINE_MAX, one_line

if TYPE_CHECKING:
    from mypy_boto3_autoscaling import AutoScalingClient
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_eks import EKSClient

RETRY_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=20)
# For an answer due within EC2 Auto Scaling's 2 seconds (the custom termination policy): one retry, short
# timeouts; a slow AWS means "none ready yet", and Auto Scaling asks again.
QUICK_CONFIG = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=0.5, read_timeout=0.8)


# What an AWS call raises when AWS (or the way to it) fails; modules outside aws/ catch these instead of
# importing botocore.
AWS_FAILURES: tuple[type[Exception], ...] = (BotoCoreError, ClientError)


T = TypeVar("T")


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in slices of at most `size`: what one API call takes (DescribeAutoScalingGroups names,
    GetMetricData queries, BatchWriteItem items)."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def error_code(exc: Exception) -> str:
    """The AWS error code of a failed call ('AccessDenied', ...), or the exception's class name."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "")) or type(exc).__name__
    return type(exc).__name__


def refused_for_good(exc: Exception) -> bool:
    """AWS refused the request itself (ValidationException): sending it again cannot succeed."""
    return error_code(exc) == "ValidationException"


def error_message(exc: ClientError) -> str:
    """The AWS error message of a failed call (its code when it has none), as one clipped line."""
    return one_line(str(exc.response["Error"].get("Message", error_code(exc))), ONE_LINE_MAX)


@functools.cache
def _shared_loader() -> botocore.loaders.Loader:
    return botocore.loaders.create_loader()


def new_session(region_name: str | None = None) -> Session:
    """A fresh boto3 session (its own credentials and region, read from the environment on first use) that shares
    this process's one model loader. A session built bare parses every service model again: 13 clients
    over 9 sessions cost 2.2 s per cold start here, 0.9 s with the loader shared. The loader holds only
    the AWS API models, which never change within a process."""
    core = botocore.session.Session()
    core.register_component("data_loader", _shared_loader())
    session = Session(botocore_session=core, region_name=region_name)
    paths = _shared_loader().search_paths  # boto3 appends its own data folder to the loader per session
    paths[:] = list(dict.fromkeys(paths))
    return session


def client(name: str, session: Session | None = None) -> Any:
    return (session or new_session()).client(name, config=RETRY_CONFIG)


def is_loopback(url: str) -> bool:
    """An endpoint on this machine (moto server, a local Kubernetes API): the only place fake credentials
    go, and the only plain-http place a signed token may go."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def region_of(session: Session | None = None) -> str:
    """The region clients made from `session` (or the default session) talk to."""
    return (session or new_session()).region_name or "us-east-1"


@dataclass(frozen=True)
class AwsClients:
    autoscaling: AutoScalingClient
    eks: EKSClient
    cloudwatch: CloudWatchClient
    dynamodb: DynamoDBClient

    @classmethod
    def create(cls, session: Session | None = None, config: Config = RETRY_CONFIG) -> AwsClients:
        s = session or new_session()
        return cls(
            autoscaling=s.client("autoscaling", config=config),
            eks=s.client("eks", config=config),
            cloudwatch=s.client("cloudwatch", config=config),
            dynamodb=s.client("dynamodb", config=config),
        )
