"""Who this node is: instance id and region from IMDSv2, its group from the instance's tags. Cached.

IMDSv2 only (a session token on every request; no IMDSv1 fallback). Tags come from instance metadata
tags when the launch template enables them, else from ec2:DescribeTags. ASG members carry
`aws:autoscaling:groupName`; EKS managed node group members `eks:cluster-name` and `eks:nodegroup-name`.
Python >= 3.9.
"""

import json
import logging
import os
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, Optional

from gpufleet_node import schema

log = logging.getLogger("gpufleet.publisher")

IMDS_URL = "http://169.254.169.254"
TOKEN_TTL_S = 21600
TAG_ASG = "aws:autoscaling:groupName"
TAG_EKS_CLUSTER = "eks:cluster-name"
TAG_EKS_NODEGROUP = "eks:nodegroup-name"
GROUP_TAGS = (TAG_ASG, TAG_EKS_CLUSTER, TAG_EKS_NODEGROUP)


class IdentityUnavailable(RuntimeError):
    pass


class Identity:
    __slots__ = ("asg_name", "cluster_name", "instance_id", "instance_type", "nodegroup_name", "region")

    def __init__(
        self,
        instance_id: str,
        region: str,
        instance_type: str = "",
        asg_name: Optional[str] = None,
        cluster_name: Optional[str] = None,
        nodegroup_name: Optional[str] = None,
    ) -> None:
        self.instance_id = instance_id
        self.region = region
        self.instance_type = instance_type
        self.asg_name = asg_name
        self.cluster_name = cluster_name
        self.nodegroup_name = nodegroup_name

    def group_dimensions(self) -> Optional[Dict[str, str]]:
        """EKS node group when the node belongs to one (its ASG is an implementation detail), else its ASG."""
        if self.cluster_name and self.nodegroup_name:
            return schema.group_dimensions(cluster_name=self.cluster_name, nodegroup_name=self.nodegroup_name)
        if self.asg_name:
            return schema.group_dimensions(asg_name=self.asg_name)
        return None

    def to_json(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "Identity":
        return cls(**{k: doc.get(k) for k in cls.__slots__})  # type: ignore[arg-type]


class Imds:
    """A minimal IMDSv2 client (stdlib only: it must work before anything else is configured)."""

    def __init__(self, base_url: str = IMDS_URL, timeout_s: float = 2.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._token: Optional[str] = None

    def _token_header(self) -> Dict[str, str]:
        if self._token is None:
            req = urllib.request.Request(
                self.base_url + "/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                self._token = resp.read().decode()
        return {"X-aws-ec2-metadata-token": self._token}

    def get(self, path: str) -> Optional[str]:
        """The value at `path`, or None when it does not exist (404)."""
        for attempt in (1, 2):
            req = urllib.request.Request(self.base_url + path, headers=self._token_header())
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return str(resp.read().decode())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:  # token expired: fetch a new one once
                    self._token = None
                    continue
                raise
        return None


def discover(imds: Imds, ec2_client_factory: Callable[[str], Any], cache_path: Optional[str] = None) -> Identity:
    """IMDS for the instance, tags for the group; written to `cache_path` and read from it next time
    (instance identity does not change while the instance lives)."""
    if cache_path and os.path.exists(cache_path):
        try:
            with open(cache_path) as f:
                return Identity.from_json(json.load(f))
        except (OSError, ValueError, TypeError):
            log.warning("identity cache %s unreadable; asking IMDS again", cache_path)
    try:
        instance_id = imds.get("/latest/meta-data/instance-id")
        region = imds.get("/latest/meta-data/placement/region")
        instance_type = imds.get("/latest/meta-data/instance-type") or ""
    except (OSError, urllib.error.URLError) as exc:
        raise IdentityUnavailable("instance metadata (IMDSv2) unreachable: %s" % exc) from None
    if not instance_id or not region:
        raise IdentityUnavailable("instance metadata has no instance-id/region")
    tags = _tags_from_imds(imds)
    if tags is None:
        tags = _tags_from_ec2(ec2_client_factory(region), instance_id)
    identity = Identity(
        instance_id,
        region,
        instance_type,
        asg_name=tags.get(TAG_ASG),
        cluster_name=tags.get(TAG_EKS_CLUSTER),
        nodegroup_name=tags.get(TAG_EKS_NODEGROUP),
    )
    if cache_path:
        try:
            os.makedirs(os.path.dirname(cache_path) or ".", exist_ok=True)
            with open(cache_path, "w") as f:
                json.dump(identity.to_json(), f)
        except OSError as exc:
            log.warning("could not cache identity in %s: %s", cache_path, exc)
    return identity


def _tags_from_imds(imds: Imds) -> Optional[Dict[str, str]]:
    """None when instance metadata tags are not enabled for this instance."""
    try:
        listing = imds.get("/latest/meta-data/tags/instance")
    except (OSError, urllib.error.URLError):
        return None
    if listing is None:
        return None
    keys = set(listing.split())
    tags = {}
    for key in GROUP_TAGS:
        if key in keys:
            value = imds.get("/latest/meta-data/tags/instance/" + key)
            if value is not None:
                tags[key] = value
    return tags


def _tags_from_ec2(ec2: Any, instance_id: str) -> Dict[str, str]:
    try:
        resp = ec2.describe_tags(
            Filters=[
                {"Name": "resource-id", "Values": [instance_id]},
                {"Name": "key", "Values": list(GROUP_TAGS)},
            ]
        )
    except Exception as exc:  # no permission or no network: publish without group dimensions
        log.warning("ec2:DescribeTags failed, publishing without group dimensions: %s", exc)
        return {}
    return {t["Key"]: t["Value"] for t in resp.get("Tags", [])}
