"""The Kubernetes reader against a Kubernetes API on loopback (rehearsal.kube_api, EMULATED) and the EKS /
EC2 reads on moto server: one paged listing per cluster, restarted once on 410 Gone, every failure one
ClusterUnreadable line that names the cluster and never the token; node names mapped to instances, and a
node group's shape as the packing reads it."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from pydantic import SecretStr

from gpufleet.aws import eks_nodes
from gpufleet.aws.eks_nodes import ShapeUnknown, instances_by_node_name, node_shape
from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.kubernetes import client as kube_http
from gpufleet.kubernetes import cluster as kubernetes
from gpufleet.kubernetes.client import Connection
from gpufleet.kubernetes.cluster import DAEMONSETS_PATH, UNFINISHED, PodReader
from gpufleet.kubernetes.pods import waiting_pod
from gpufleet.scaling.fit import fits
from gpufleet.settings import KubeEndpoint
from rehearsal import fleet
from rehearsal.kube_api import KubeApi, kube_api, pod
from rehearsal.loopback import serve
from tests.conftest import RECORDER
from tests.iam.test_conformance import denials
from tests.integration.conftest import count_calls
from tests.tls import self_signed_certificate

pytestmark = pytest.mark.integration
TOKEN = "gpufleet-local-token"
GPU_TAINT = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.fixture
def api() -> Iterator[tuple[KubeApi, str]]:
    with kube_api(KubeApi(tokens={TOKEN})) as served:
        yield served


def reader(url: str, token: str | None = TOKEN, ca_data: str | None = None, **options: Any) -> PodReader:
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    override = KubeEndpoint(url=url, token=SecretStr(token) if token else None, ca_data=ca_data)
    return PodReader(session.client("eks"), session, {"ml": override}, **options)


def cluster_of_seven(api: KubeApi) -> None:
    """3 pods wait for GPUs, 2 GPU pods run (on 2 nodes), a CPU pod waits, a finished GPU pod lingers."""
    api.add(*(pod(f"train-{i}", "team-a", gpus=8) for i in range(3)))
    api.add(pod("serve-0", "team-b", gpus=1), pod("serve-1", "team-b", gpus=1), pod("cpu-0", "team-b", gpus=0))
    api.add(pod("done-0", "team-a", gpus=8))
    api.bind("team-b", "serve-0", "ip-10-0-1-7.ec2.internal")
    api.bind("team-b", "serve-1", "ip-10-0-1-8.ec2.internal")
    api.finish("team-a", "done-0")


class Clock:
    """A monotonic clock the test moves: `values` in turn, then `step` more at each look."""

    def __init__(self, values: list[float], step: float) -> None:
        self.values, self.step, self.looks = list(values), step, 0

    def __call__(self) -> float:
        self.looks += 1
        if len(self.values) > 1:
            return self.values.pop(0)
        self.values[0] += self.step if self.looks > 1 else 0.0
        return self.values[0]


def record_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every wait the listing's pace gave a socket (the real computation, recorded)."""
    waits: list[float] = []
    real = kube_http.Pace.wait_s

    def wait_s(self: kube_http.Pace) -> float:
        waits.append(real(self))
        return waits[-1]

    monkeypatch.setattr(kube_http.Pace, "wait_s", wait_s)
    return waits


Answer = tuple[int, dict[str, Any]]


def pod_gets(kube: Any) -> list[dict[str, Any]]:
    """The loopback API's requests for pods (the reader also lists the DaemonSets once, after them)."""
    return [r for r in kube.requests if r["path"] != DAEMONSETS_PATH]


@contextmanager
def scripted(
    answer: Callable[[dict[str, str]], Answer], drip_s: float | None = None
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(URL, queries seen) of a loopback API that answers each GET with `answer(query)`; with `drip_s`,
    the whole response (status line, headers, body) one byte at a time, `drip_s` apart."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
            if urlsplit(self.path).path == DAEMONSETS_PATH:  # the pods' listing is what these scripts test
                body = json.dumps({"kind": "DaemonSetList", "metadata": {}, "items": []}).encode()
                self.wfile.write(f"HTTP/1.1 200 X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                return
            seen.append(query)
            code, document = answer(query)
            body = json.dumps(document).encode()
            head = f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            with suppress(OSError):
                if drip_s is None:
                    self.wfile.write(head.encode() + body)
                    return
                for byte in head.encode() + body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(drip_s)

    with serve(Handler) as url:
        yield url, seen


def pod_list(items: list[dict[str, Any]], token: str | None = None) -> dict[str, Any]:
    metadata = {"resourceVersion": "1", **({"continue": token} if token else {})}
    return {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}


SIX = [pod(f"train-{i}", "team-a") for i in range(6)]


def test_pods_listed_on_two_pages_count_once() -> None:
    """An inconsistent listing shows the same 6 pods on both pages: 6 wait, not 12 (by uid)."""
    with scripted(lambda q: (200, pod_list(SIX, None if q.get("continue") else "again"))) as (url, seen):
        found = reader(url).read("ml")
    assert (len(found.waiting), found.pages, len(seen)) == (6, 2, 2)


def test_a_continue_token_given_twice_ends_the_listing_as_unreadable() -> None:
    """The server answers every page with the same token: the second time it is seen, the listing stops."""
    same = scripted(lambda q: (200, pod_list(SIX, "same")))
    with same as (url, seen), pytest.raises(ClusterUnreadable, match="the same continue token twice") as err:
        reader(url).read("ml")
    assert (err.value.kind, len(seen)) == ("loop", 2)


def test_a_listing_that_never_ends_stops_at_the_page_cap() -> None:
    """A fresh token every page, the same pods: the page cap ends it (before: 867 pages in 10 s)."""
    endless = scripted(lambda q: (200, pod_list(SIX, f"t{int(q.get('continue', 't0')[1:]) + 1}")))
    with endless as (url, seen), pytest.raises(ClusterUnreadable, match="ran past 20 pages") as err:
        reader(url, max_pages=20).read("ml")
    assert (err.value.kind, len(seen)) == ("too_big", 20)
    assert kubernetes.MAX_PAGES * kubernetes.PAGE_SIZE >= 2 * kubernetes.MAX_PODS  # room for pages halved


def test_more_distinct_pods_than_the_cap_is_unreadable() -> None:
    def answer(query: dict[str, str]) -> Answer:
        n = int(query.get("continue") or 0)
        return 200, pod_list([pod(f"job-{n}-{i}", "batch") for i in range(4)], str(n + 1))

    with scripted(answer) as (url, seen), pytest.raises(ClusterUnreadable, match="over 10 pods") as err:
        reader(url, max_pods=10).read("ml")
    assert (err.value.kind, len(seen)) == ("too_big", 3)


def test_a_page_too_big_is_asked_again_with_half_the_limit(
    api: tuple[KubeApi, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page over MAX_BODY (64 MiB, made small here) is asked again with half the limit, which then
    holds for the rest of the listing; every pod is read once."""
    kube, url = api
    kube.add(*(pod(f"job-{i:03d}", "batch") for i in range(20)))
    one_pod = len(json.dumps(pod("job-000", "batch")))
    monkeypatch.setattr(kube_http, "MAX_BODY", 6 * one_pod)
    found = reader(url, page_size=8).read("ml")
    assert len(found.waiting) == 20
    assert [r["query"]["limit"] for r in pod_gets(kube)] == ["8", "4", "4", "4", "4", "4"]


def test_a_page_still_too_big_at_half_the_limit_is_unreadable(
    api: tuple[KubeApi, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube, url = api
    kube.add(*(pod(f"job-{i:03d}", "batch") for i in range(20)))
    monkeypatch.setattr(kube_http, "MAX_BODY", 1000)
    with pytest.raises(ClusterUnreadable, match=r"the answer is over 0 MiB|inflates past") as err:
        reader(url, page_size=8).read("ml")
    assert err.value.kind == "too_large"
    assert [r["query"]["limit"] for r in pod_gets(kube)] == ["8", "4"]


def test_a_413_answer_is_asked_again_with_half_the_limit() -> None:
    def answer(query: dict[str, str]) -> Answer:
        if int(query["limit"]) > 250:
            return 413, {"kind": "Status", "code": 413, "message": "the response is too large"}
        return 200, pod_list(SIX)

    with scripted(answer) as (url, seen):
        found = reader(url).read("ml")
    assert (len(found.waiting), [q["limit"] for q in seen]) == (6, ["500", "250"])


def test_a_dripping_server_cannot_hold_the_listing_past_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server sends a byte at a time; the clock says each byte took 1.5 s (the issue's drip). Every
    recv is given min(timeout, time left), so the listing ends at its 10 s budget: a handful of reads,
    not the whole answer (before: 40 s past the budget)."""
    clock = Clock([0.0], step=1.5)
    waits = record_waits(monkeypatch)
    monkeypatch.setattr(kubernetes, "Connection", partial(Connection, clock=clock))
    dripping = scripted(lambda q: (200, pod_list(SIX)), drip_s=0.001)
    with dripping as (url, _), pytest.raises(ClusterUnreadable, match=r"the listing took over its 10 s;") as err:
        reader(url, timeout_s=2.0, budget_s=10.0).read("ml")
    assert err.value.kind == "timeout"
    assert waits == [2.0, 2.0, 2.0, 2.0, 2.0, pytest.approx(1.0)]  # the last wait cut to the time left
    assert clock.looks <= 10 / 1.5 + 2


def test_a_paged_listing_returns_every_waiting_pod_once(api: tuple[KubeApi, str]) -> None:
    kube, url = api
    cluster_of_seven(kube)
    found = reader(url, page_size=2).read("ml")
    assert sorted(p.key for p in found.waiting) == ["team-a/train-0", "team-a/train-1", "team-a/train-2"]
    assert found.gpu_nodes == {"ip-10-0-1-7.ec2.internal", "ip-10-0-1-8.ec2.internal"}
    assert found.pages == 3  # 6 unfinished pods, 2 a page: the finished one stayed on the server
    assert [r["query"].get("continue") is None for r in pod_gets(kube)] == [True, False, False]
    assert {(r["path"], r["query"]["fieldSelector"], r["query"]["limit"]) for r in pod_gets(kube)} == {
        ("/api/v1/pods", UNFINISHED, "2")
    }


def test_an_expired_continue_token_restarts_the_listing_once(api: tuple[KubeApi, str]) -> None:
    kube, url = api
    cluster_of_seven(kube)
    kube.script.extend(["ok", "expire"])  # etcd compacts between the first and the second page
    found = reader(url, page_size=2).read("ml")
    assert sorted(p.key for p in found.waiting) == ["team-a/train-0", "team-a/train-1", "team-a/train-2"]
    assert found.pages == 1 + 3
    assert [r["query"].get("continue") is None for r in pod_gets(kube)] == [True, False, True, False, False]


def test_expiring_again_is_unreadable(api: tuple[KubeApi, str]) -> None:
    kube, url = api
    cluster_of_seven(kube)
    kube.script.extend(["ok", "expire", "ok", "expire"])
    with pytest.raises(ClusterUnreadable, match="410 Gone twice") as err:
        reader(url, page_size=2).read("ml")
    assert err.value.kind == "expired"


@pytest.mark.parametrize(
    ("token", "forbidden", "kind", "says"),
    [
        ("wrong-token", False, "unauthorized", "401 Unauthorized: cluster ml does not know the function's role"),
        (
            TOKEN,
            True,
            "forbidden",
            "403 Forbidden: the function's role has no EKS access entry with AmazonEKSViewPolicy on cluster ml",
        ),
    ],
)
def test_refusals_say_what_access_is_missing(
    api: tuple[KubeApi, str], token: str, forbidden: bool, kind: str, says: str
) -> None:
    kube, url = api
    kube.forbidden = forbidden
    with pytest.raises(ClusterUnreadable) as err:
        reader(url, token=token).read("ml")
    assert (err.value.kind, err.value.cluster) == (kind, "ml")
    assert str(err.value).startswith(f"cannot read the pods of EKS cluster ml: {says}")
    assert "\n" not in str(err.value)
    assert token not in str(err.value) and token not in repr(err.value)


def test_a_slow_api_server_is_a_timeout_within_the_deadline(api: tuple[KubeApi, str]) -> None:
    """The server answers after 3 s; each wait on it is given `timeout_s` (the mechanism, not a stopwatch:
    the message names the wait it was given, and only a socket timeout produces it)."""
    kube, url = api
    kube.script.append("delay:3")
    with pytest.raises(ClusterUnreadable, match=r"no answer within 0.25 s;") as err:
        reader(url, timeout_s=0.25).read("ml")
    assert err.value.kind == "timeout"


def test_a_wait_is_cut_to_the_time_the_budget_has_left(
    api: tuple[KubeApi, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """9.8 s of the 10 s budget are gone when the GET starts: the socket waits 0.2 s, not `timeout_s`,
    and the timeout is the budget's."""
    kube, url = api
    kube.script.append("delay:3")
    clock = Clock([0.0, 9.8], step=0.0)
    waits = record_waits(monkeypatch)
    monkeypatch.setattr(kubernetes, "Connection", partial(Connection, clock=clock))
    with pytest.raises(ClusterUnreadable, match=r"the listing took over its 10 s;") as err:
        reader(url, timeout_s=2.0, budget_s=10.0).read("ml")
    assert err.value.kind == "timeout"
    assert waits and max(waits) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("script", "kind", "says"),
    [
        ("garbage", "malformed", "the answer is not a JSON object"),
        ("500", "http", "HTTP 500 Internal Server Error (the API server: InternalError)"),
    ],
)
def test_a_bad_answer_is_unreadable(api: tuple[KubeApi, str], script: str, kind: str, says: str) -> None:
    kube, url = api
    kube.add(pod("train-0", "team-a"))
    kube.script.append(script)
    with pytest.raises(ClusterUnreadable, match=r"^cannot read the pods of EKS cluster ml: ") as err:
        reader(url).read("ml")
    assert (err.value.kind, err.value.cause) == (kind, says)


def test_nothing_listening_is_unreachable() -> None:
    with kube_api() as (_, url):
        pass  # the port is free again
    with pytest.raises(ClusterUnreadable, match="cannot reach the API server") as err:
        reader(url).read("ml")
    assert err.value.kind == "unreachable"


def test_a_large_page_arrives_gzipped_and_whole(api: tuple[KubeApi, str]) -> None:
    kube, url = api
    kube.add(*(pod(f"job-{i:03d}", "batch", gpus=1) for i in range(300)))  # ~300 KiB: the server gzips
    found = reader(url).read("ml")
    assert (len(found.waiting), found.pages) == (300, 1)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1."""
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


def test_https_trusts_the_clusters_own_certificate_authority(certificate: tuple[str, str]) -> None:
    """As against EKS: HTTPS, the CA from certificateAuthority.data (base64 PEM), and nothing else trusted."""
    ca_data = base64.b64encode(Path(certificate[0]).read_bytes()).decode()
    with kube_api(KubeApi(tokens={TOKEN}), tls=certificate) as (kube, url):
        kube.add(pod("train-0", "team-a"))
        assert [p.key for p in reader(url, ca_data=ca_data).read("ml").waiting] == ["team-a/train-0"]
        with pytest.raises(ClusterUnreadable, match="TLS failed") as err:
            reader(url).read("ml")  # the system's trust store does not know the cluster's CA
        assert err.value.kind == "tls"
    with pytest.raises(ClusterUnreadable, match="not a PEM certificate"):
        reader(url, ca_data=base64.b64encode(b"junk").decode()).read("ml")


def test_without_a_token_the_reader_signs_an_eks_token(aws: str) -> None:
    """The override names only the URL: the reader signs an aws-iam-authenticator token with the session
    (the emulated API checks its shape; EKS would check its signature with STS)."""
    with kube_api(KubeApi(tokens=set(), eks_cluster="ml")) as (kube, url):
        kube.add(pod("train-0", "team-a"))
        session = boto3.Session()
        override = {"ml": KubeEndpoint(url=url)}
        found = PodReader(session.client("eks"), session, override).read("ml")
    assert [p.key for p in found.waiting] == ["team-a/train-0"]


def test_describe_cluster_finds_the_endpoint_and_its_failures_are_one_line(aws: str) -> None:
    """moto's DescribeCluster gives a made-up endpoint and random certificate data (a blind spot: EKS's is
    base64 PEM), so past the endpoint this checks what a bad CA or a missing cluster turns into."""
    clients = fleet.Clients.create()
    fleet.create_nodegroup(clients, "ml", "infer-gpu", min_size=1, max_size=5, desired=2, tags=fleet.MANAGED_TAG)
    session = boto3.Session()
    reader = PodReader(clients.eks, session)
    with pytest.raises(ClusterUnreadable) as err:
        reader.read("ml")
    assert (err.value.kind, err.value.cause) == ("tls", "the certificate authority data is not base64")
    with pytest.raises(ClusterUnreadable) as err:
        reader.read("gone")
    assert (err.value.kind, err.value.cause) == ("describe", "EKS DescribeCluster failed (ResourceNotFoundException)")


def test_node_names_map_to_instances_in_one_paged_call(aws: str) -> None:
    clients = fleet.Clients.create()
    launched = clients.ec2.run_instances(ImageId="ami-12c6146b", MinCount=3, MaxCount=3, InstanceType="g5.xlarge")
    by_name = {i["PrivateDnsName"]: i["InstanceId"] for i in launched["Instances"]}
    names = [*sorted(by_name)[:2], "ip-10-9-9-9.ec2.internal"]  # one node EC2 does not know
    calls = count_calls(clients.ec2)
    assert instances_by_node_name(clients.ec2, names) == {n: by_name[n] for n in names[:2]}
    assert calls == {"ec2:DescribeInstances": 1}


def test_a_nodegroups_shape_is_what_its_nodes_offer_a_pod(aws: str) -> None:
    """GPUs, allocatable (the EKS AMI's reservations), the labels EKS, the kubelet and GPU feature
    discovery put on its nodes (the zone of its one subnet), taints; a custom AMI's override wins."""
    clients = fleet.Clients.create()
    fleet.create_nodegroup(clients, "ml", "infer-gpu", min_size=1, max_size=5, desired=2, tags=fleet.MANAGED_TAG)
    vpc = clients.ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = clients.ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24", AvailabilityZone="us-east-1a")
    clients.eks.create_nodegroup(
        clusterName="ml",
        nodegroupName="train-gpu",
        nodeRole="arn:aws:iam::123456789012:role/gpufleet-demo",
        subnets=[subnet["Subnet"]["SubnetId"]],
        scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 0},
        instanceTypes=["g5.12xlarge"],
        capacityType="SPOT",
        diskSize=100,
        labels={"team": "a"},
        taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}],
    )
    shape = node_shape(clients.eks, clients.ec2, "ml", "train-gpu")
    assert (shape.gpus, shape.zones, shape.name) == (4, ("us-east-1a",), "g5.12xlarge")
    assert shape.labels == (
        ("eks.amazonaws.com/capacityType", "SPOT"),
        ("eks.amazonaws.com/nodegroup", "train-gpu"),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("node.kubernetes.io/instance-type", "g5.12xlarge"),
        ("nvidia.com/gpu.count", "4"),
        ("nvidia.com/gpu.memory", "22888"),
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.product", "NVIDIA-A10G"),
        ("team", "a"),
        ("topology.kubernetes.io/region", "us-east-1"),
        ("topology.kubernetes.io/zone", "us-east-1a"),
    )
    assert shape.taints == (("nvidia.com/gpu", "true", "NoSchedule"),)
    assert shape.allocatable["cpu"] == 47.81 and shape.allocatable["ephemeral-storage"] == 89 * 2**30
    wants = pod("train-0", gpus=4, node_selector={"eks.amazonaws.com/nodegroup": "train-gpu"}, tolerations=GPU_TAINT)
    untolerated = pod("train-1", gpus=4, node_selector={"eks.amazonaws.com/nodegroup": "train-gpu"})
    assert [fits(w, shape) for w in map(waiting_pod, (wants, untolerated)) if w] == [True, False]
    calls = count_calls(clients.ec2)
    again = node_shape(clients.eks, clients.ec2, "ml", "train-gpu", overrides={"cpu": "40", "memory": "150Gi"})
    assert calls["ec2:DescribeInstanceTypes"] == 0 and calls["ec2:DescribeSubnets"] == 0  # kept per container
    assert (again.allocatable["cpu"], again.allocatable["memory"]) == (40.0, 150 * 2**30)
    elsewhere = node_shape(clients.eks, clients.ec2, "ml", "train-gpu", zones=["us-east-1a", "us-east-1b"])
    assert "topology.kubernetes.io/zone" not in dict(elsewhere.labels)  # two zones: a new node's is not known


def test_gpus_per_node_are_the_fewest_of_its_types_and_logical(aws: str) -> None:
    """Several types: the fewest GPUs, no instance-type label. A fractional GPU (g6f: EC2 says Count 0,
    LogicalGpuCount 1) is one GPU to the node."""
    clients = fleet.Clients.create()
    fleet.create_nodegroup(clients, "ml", "infer-gpu", min_size=1, max_size=5, desired=2, tags=fleet.MANAGED_TAG)
    role = "arn:aws:iam::123456789012:role/gpufleet-demo"
    for name, types in (("mixed", ["g5.12xlarge", "g5.xlarge"]), ("slices", ["g6f.large"])):
        clients.eks.create_nodegroup(
            clusterName="ml", nodegroupName=name, nodeRole=role, subnets=["subnet-1"], instanceTypes=types
        )
    mixed, slices = (node_shape(clients.eks, clients.ec2, "ml", n) for n in ("mixed", "slices"))
    assert mixed.gpus == 1 and "node.kubernetes.io/instance-type" not in dict(mixed.labels)
    assert slices.gpus == 1


def test_a_shape_that_cannot_be_told_is_one_line(aws: str) -> None:
    clients = fleet.Clients.create()
    fleet.create_nodegroup(clients, "ml", "infer-gpu", min_size=1, max_size=5, desired=2, tags=fleet.MANAGED_TAG)
    clients.eks.create_nodegroup(
        clusterName="ml",
        nodegroupName="cpu",
        nodeRole="arn:aws:iam::123456789012:role/gpufleet-demo",
        subnets=["subnet-1"],
        instanceTypes=["m5.large", "g5.xlarge"],
    )
    with pytest.raises(ShapeUnknown, match=r"^node group ml/cpu: instance types m5.large, g5.xlarge: not all have GPU"):
        node_shape(clients.eks, clients.ec2, "ml", "cpu")
    with pytest.raises(ShapeUnknown, match=r"^node group ml/gone: cannot describe it \(ResourceNotFoundException\)$"):
        node_shape(clients.eks, clients.ec2, "ml", "gone")


def test_the_scalers_role_allows_every_call_the_reads_make(aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eks_nodes, "_TYPES", {})  # a cold container: DescribeInstanceTypes is called
    monkeypatch.setattr(eks_nodes, "_SUBNET_ZONES", {})  # and DescribeSubnets
    clients = fleet.Clients.create()
    fleet.create_nodegroup(clients, "ml", "infer-gpu", min_size=1, max_size=5, desired=2, tags=fleet.MANAGED_TAG)
    before = len(RECORDER.records)
    with pytest.raises(ClusterUnreadable):
        PodReader(clients.eks, boto3.Session()).read("ml")  # DescribeCluster (moto's CA then fails)
    node_shape(clients.eks, clients.ec2, "ml", "infer-gpu")
    instances_by_node_name(clients.ec2, ["ip-10-0-1-7.ec2.internal"])
    calls = RECORDER.records[before:]
    assert {(c.function, c.action) for c in calls} >= {
        ("scaler", "eks:DescribeCluster"),
        ("scaler", "eks:DescribeNodegroup"),
        ("scaler", "ec2:DescribeInstanceTypes"),
        ("scaler", "ec2:DescribeSubnets"),
        ("scaler", "ec2:DescribeInstances"),
    }
    assert denials(calls) == []
