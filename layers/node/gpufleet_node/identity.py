"""Who this node is: instance id and region from IMDSv2, its group (and detail switch) from the instance's
tags. Cached, but only once the tags were actually read.

IMDSv2 only (a session token on every request; no IMDSv1 fallback). Tags come from instance metadata
tags when the launch template enables them, else from ec2:DescribeTags. ASG members carry
`aws:autoscaling:groupName`; EKS managed node group members `eks:cluster-name` and `eks:nodegroup-name`;
`gpufleet:detail=on` switches per-GPU detail on for the instance.

ec2:DescribeTags is the fallback only. IAM cannot scope it: the action has no resource types and no
condition keys of its own (Service Authorization Reference), so the node policy grants it on "*" (every EC2
tag in the region, to instance-profile credentials only). With instance metadata tags on
(`InstanceMetadataTags: enabled` in the launch template) it is never called and the policy's
`ReadOwnGroupTags` statement can be dropped (docs/node-publisher.md, "Permissions"); the publisher says
once when it has to fall back. Its own call asks for its own instance's few tag keys only.

A tag lookup that fails (no network yet at boot, IAM not yet propagated, an IMDS 500) is retried, and
the identity is not cached without its group: otherwise one bad minute at first boot would keep the node
out of its group's series for the instance's whole life. `TagRefresher` keeps retrying in the background
and re-reads the tags now and then, so `gpufleet:detail` can be switched on a running instance.

A SageMaker HyperPod node is in no ASG and no EKS node group: its group is its cluster's instance group,
read first, whenever the file is there, from HyperPod's resource configuration file
(/opt/ml/config/resource_config.json, which HyperPod writes on every node and its lifecycle scripts read:
aws-samples/awsome-distributed-training, 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/
lifecycle_script.py). Fields read: ClusterConfig.ClusterName, InstanceGroups[].Name and each group's
Instances[].InstanceId, else Instances[].CustomerIpAddress matched to the node's IMDS local-ipv4 (what
lifecycle_script.py matches on). A HyperPod identity reads no tags and starts no tag refresher.
Python >= 3.9.
"""

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, Optional, Tuple

from gpufleet_node import schema

log = logging.getLogger("gpufleet.publisher")

IMDS_URL = "http://169.254.169.254"
TOKEN_TTL_S = 21600
TAG_ASG = "aws:autoscaling:groupName"
TAG_EKS_CLUSTER = "eks:cluster-name"
TAG_EKS_NODEGROUP = "eks:nodegroup-name"
GROUP_TAGS = (TAG_ASG, TAG_EKS_CLUSTER, TAG_EKS_NODEGROUP)
TAGS_READ = (*GROUP_TAGS, schema.TAG_DETAIL)
CACHE_VERSION = 2  # version 1 files could hold an identity whose tag lookup had failed: read again
TAG_ATTEMPTS = 3
HYPERPOD_RESOURCE_CONFIG = "/opt/ml/config/resource_config.json"


class IdentityUnavailable(RuntimeError):
    pass


class Identity:
    __slots__ = (
        "asg_name",
        "cluster_name",
        "detail",
        "hyperpod_cluster",
        "instance_group",
        "instance_id",
        "instance_type",
        "nodegroup_name",
        "region",
        "tags_known",
    )

    def __init__(
        self,
        instance_id: str,
        region: str,
        instance_type: str = "",
        asg_name: Optional[str] = None,
        cluster_name: Optional[str] = None,
        nodegroup_name: Optional[str] = None,
        detail: Optional[str] = None,
        tags_known: bool = True,
        hyperpod_cluster: Optional[str] = None,
        instance_group: Optional[str] = None,
    ) -> None:
        self.instance_id = instance_id
        self.region = region
        self.instance_type = instance_type
        self.asg_name = asg_name
        self.cluster_name = cluster_name
        self.nodegroup_name = nodegroup_name
        self.detail = detail  # the gpufleet:detail tag's value
        self.tags_known = tags_known  # False: the tag lookup failed, group and detail are unknown yet
        self.hyperpod_cluster = hyperpod_cluster  # a HyperPod node: its cluster and instance group
        self.instance_group = instance_group

    @property
    def is_hyperpod(self) -> bool:
        return bool(self.hyperpod_cluster and self.instance_group)

    def group_dimensions(self) -> Optional[Dict[str, str]]:
        """The HyperPod instance group on a HyperPod node; else the EKS node group when the node belongs to
        one (its ASG is an implementation detail), else its ASG."""
        if self.is_hyperpod:
            return schema.group_dimensions(cluster_name=self.hyperpod_cluster, instance_group_name=self.instance_group)
        if self.cluster_name and self.nodegroup_name:
            return schema.group_dimensions(cluster_name=self.cluster_name, nodegroup_name=self.nodegroup_name)
        if self.asg_name:
            return schema.group_dimensions(asg_name=self.asg_name)
        return None

    def group_key(self) -> Optional[str]:
        """The group as the controller names it ("asg:NAME", "eks:CLUSTER/NODEGROUP" or
        "hyperpod:CLUSTER/GROUP"), if any."""
        if self.is_hyperpod:
            return "hyperpod:%s/%s" % (self.hyperpod_cluster, self.instance_group)
        if self.cluster_name and self.nodegroup_name:
            return "eks:%s/%s" % (self.cluster_name, self.nodegroup_name)
        return "asg:%s" % self.asg_name if self.asg_name else None

    def detail_on(self) -> bool:
        return (self.detail or "").strip().lower() in schema.TAG_DETAIL_ON_VALUES

    def with_tags(self, tags: Dict[str, str]) -> "Identity":
        return Identity(
            self.instance_id,
            self.region,
            self.instance_type,
            asg_name=tags.get(TAG_ASG),
            cluster_name=tags.get(TAG_EKS_CLUSTER),
            nodegroup_name=tags.get(TAG_EKS_NODEGROUP),
            detail=tags.get(schema.TAG_DETAIL),
            hyperpod_cluster=self.hyperpod_cluster,
            instance_group=self.instance_group,
        )

    def to_json(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "Identity":
        known = {k: doc.get(k) for k in cls.__slots__ if k != "tags_known"}
        return cls(tags_known=bool(doc.get("tags_known", True)), **known)  # type: ignore[arg-type]


class Imds:
    """A minimal IMDSv2 client (stdlib only: it must work before anything else is configured)."""

    def __init__(self, base_url: str = IMDS_URL, timeout_s: float = 2.0, retry_pause_s: float = 0.2) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry_pause_s = retry_pause_s
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
        """The value at `path`, or None when it does not exist (404). An expired token is renewed once; a
        5xx is retried twice; anything else raises (urllib.error.URLError, an OSError)."""
        for attempt in (1, 2, 3):
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
                if exc.code >= 500 and attempt < 3:
                    time.sleep(self.retry_pause_s)
                    continue
                raise
        return None


def discover(
    imds: Imds,
    ec2_client_factory: Callable[[str], Any],
    cache_path: Optional[str] = None,
    attempts: int = TAG_ATTEMPTS,
    pause_s: float = 1.0,
    resource_config: Optional[str] = HYPERPOD_RESOURCE_CONFIG,
) -> Identity:
    """IMDS for the instance, then HyperPod's resource file or else the tags for the group; written to
    `cache_path` once the group source answered, and read from it next time (instance identity does not
    change while the instance lives). When every tag lookup fails, the identity comes back with
    `tags_known=False` and is not cached."""
    on_hyperpod = bool(resource_config) and os.path.exists(str(resource_config))
    cached = _read_cache(cache_path)
    if cached is not None and (cached.is_hyperpod or not on_hyperpod):
        return cached
    try:
        instance_id = imds.get("/latest/meta-data/instance-id")
        region = imds.get("/latest/meta-data/placement/region")
        instance_type = imds.get("/latest/meta-data/instance-type") or ""
    except (OSError, urllib.error.URLError) as exc:
        raise IdentityUnavailable("instance metadata (IMDSv2) unreachable: %s" % exc) from None
    if not instance_id or not region:
        raise IdentityUnavailable("instance metadata has no instance-id/region")
    identity = Identity(instance_id, region, instance_type, tags_known=False)
    if on_hyperpod:
        found = read_hyperpod(str(resource_config), instance_id, lambda: imds.get("/latest/meta-data/local-ipv4"))
        if found is not None:
            identity = Identity(instance_id, region, instance_type, hyperpod_cluster=found[0], instance_group=found[1])
            write_cache(cache_path, identity)
            return identity
    reader = TagReader(imds, lambda: ec2_client_factory(region), instance_id)
    for attempt in range(attempts):
        tags = reader.read()
        if tags is not None:
            identity = identity.with_tags(tags)
            write_cache(cache_path, identity)
            return identity
        if attempt + 1 < attempts:
            time.sleep(pause_s * 2**attempt)
    log.warning("instance tags unreadable; publishing without group dimensions until they can be read")
    return identity


def read_hyperpod(path: str, instance_id: str, local_ip: Callable[[], Optional[str]]) -> Optional[Tuple[str, str]]:
    """(cluster name, instance group name) of this instance from HyperPod's resource configuration file, or
    None (said once) when the file is unreadable or does not list this instance: the node then falls back
    to its tags. Matched by InstanceId, else by CustomerIpAddress (the node's IMDS local-ipv4)."""
    try:
        with open(path) as f:
            doc = json.load(f)
        cluster = str((doc.get("ClusterConfig") or {}).get("ClusterName") or doc.get("ClusterName") or "")
        groups = [(str(g.get("Name") or ""), g.get("Instances") or []) for g in doc.get("InstanceGroups") or []]
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.warning("HyperPod resource file %s unreadable (%s); reading instance tags instead", path, exc)
        return None

    def group_with(key: str, value: Optional[str]) -> Optional[str]:
        for name, instances in groups:
            if value and name and any(isinstance(i, dict) and i.get(key) == value for i in instances):
                return name
        return None

    group = group_with("InstanceId", instance_id)
    ip: Optional[str] = None
    if group is None:
        try:
            ip = local_ip()
        except (OSError, urllib.error.URLError):
            ip = None
        group = group_with("CustomerIpAddress", ip)
    if cluster and group:
        return cluster, group
    log.warning(
        "HyperPod resource file %s names no cluster or does not list %s (%s); reading instance tags instead",
        path,
        instance_id,
        ip or "no local IP",
    )
    return None


def _read_cache(cache_path: Optional[str]) -> Optional[Identity]:
    if not cache_path or not os.path.exists(cache_path):
        return None
    try:
        with open(cache_path) as f:
            doc = json.load(f)
        if isinstance(doc, dict) and doc.get("version") == CACHE_VERSION and doc.get("tags_known", True):
            return Identity.from_json(doc)
        log.info("identity cache %s is from an older version; asking IMDS again", cache_path)
    except (OSError, ValueError, TypeError):
        log.warning("identity cache %s unreadable; asking IMDS again", cache_path)
    return None


def write_cache(cache_path: Optional[str], identity: Identity) -> None:
    if not cache_path or not identity.tags_known:
        return
    try:
        os.makedirs(os.path.dirname(cache_path) or ".", exist_ok=True)
        with open(cache_path, "w") as f:
            json.dump(dict(identity.to_json(), version=CACHE_VERSION), f)
    except OSError as exc:
        log.warning("could not cache identity in %s: %s", cache_path, exc)


class TagReader:
    """The instance's tags: instance metadata tags when enabled, else ec2:DescribeTags. None when
    neither answered (a failure, as opposed to an instance without those tags)."""

    def __init__(self, imds: Imds, ec2_factory: Callable[[], Any], instance_id: str) -> None:
        self.imds = imds
        self.ec2_factory = ec2_factory
        self.instance_id = instance_id
        self._ec2: Any = None
        self.fell_back = False  # said once: instance metadata tags are off, DescribeTags is in use

    def read(self) -> Optional[Dict[str, str]]:
        tags = self._from_imds()
        if tags is not None:
            return tags
        if not self.fell_back:
            self.fell_back = True
            log.info(
                "instance metadata tags are off or unreadable: reading tags with ec2:DescribeTags (enable "
                "InstanceMetadataTags in the launch template to need no EC2 permission)"
            )
        return self._from_ec2()

    def _from_imds(self) -> Optional[Dict[str, str]]:
        """None when instance metadata tags are not enabled for this instance, or IMDS failed."""
        try:
            listing = self.imds.get("/latest/meta-data/tags/instance")
            if listing is None:
                return None
            keys = set(listing.split())
            tags = {}
            for key in TAGS_READ:
                if key in keys:
                    value = self.imds.get("/latest/meta-data/tags/instance/" + key)
                    if value is not None:
                        tags[key] = value
            return tags
        except (OSError, urllib.error.URLError) as exc:
            log.warning("instance metadata tags unreadable (%s); trying ec2:DescribeTags", exc)
            return None

    def _from_ec2(self) -> Optional[Dict[str, str]]:
        try:
            if self._ec2 is None:
                self._ec2 = self.ec2_factory()
            resp = self._ec2.describe_tags(
                Filters=[
                    {"Name": "resource-id", "Values": [self.instance_id]},
                    {"Name": "key", "Values": list(TAGS_READ)},
                ]
            )
        except Exception as exc:  # no permission or no network yet: unknown, asked again later
            log.warning("ec2:DescribeTags failed: %s", exc)
            return None
        return {t["Key"]: t["Value"] for t in resp.get("Tags", [])}


class TagRefresher:
    """Reads the tags again in the background: every `retry_s` (doubling up to `every_s`) while they are
    unknown, then every `every_s` so a `gpufleet:detail` change reaches a running publisher. Calls
    `on_change` with the new identity and caches it."""

    def __init__(
        self,
        reader: TagReader,
        identity: Identity,
        on_change: Callable[[Identity], None],
        cache_path: Optional[str] = None,
        every_s: float = 600.0,
        retry_s: float = 30.0,
    ) -> None:
        self.reader = reader
        self.identity = identity
        self.on_change = on_change
        self.cache_path = cache_path
        self.every_s = every_s
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="instance-tags", daemon=True)

    def refresh(self) -> bool:
        """One lookup; True when the tags were read (changed or not)."""
        tags = self.reader.read()
        if tags is None:
            return False
        new = self.identity.with_tags(tags)
        if new.to_json() != self.identity.to_json():
            self.identity = new
            write_cache(self.cache_path, new)
            self.on_change(new)
        return True

    def start(self) -> None:
        if self.identity.is_hyperpod:  # its group is HyperPod's file, not tags: nothing to read again
            return
        if self.every_s > 0 or not self.identity.tags_known:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        delay = self.every_s if self.identity.tags_known else self.retry_s
        while not self._stop.wait(delay):
            try:
                ok = self.refresh()
            except Exception:  # never let a surprise end the retries
                log.exception("reading instance tags failed")
                ok = False
            if ok and self.every_s <= 0:
                return
            delay = self.every_s if ok else min(delay * 2, self.every_s if self.every_s > 0 else 900.0)
