"""The Kubernetes reader against a Kubernetes API on loopback (rehearsal.kube_api, EMULATED) and the EKS /
EC2 reads on moto server: one paged listing per cluster, restarted once on 410 Gone, every failure one
ClusterUnreadable line that names the cluster and never the token; node names mapped to instances, and a
node group's shape as the packing reads it."""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from pydantic import SecretStr

from gpufleet.aws import eks_nodes
from gpufleet.aws.eks_nodes import ShapeUnknown, instances_by_node_name, node_shape
from gpufleet.aws.kubernetes import UNFINISHED, PodReader
from gpufleet.events.kubernetes import ClusterUnreadable, waiting_pod
from gpufleet.scaling.demand import NodeShape, fits
from gpufleet.settings import KubeEndpoint
from rehearsal import fleet
from rehearsal.kube_api import KubeApi, kube_api, pod
from tests.conftest import RECORDER
from tests.iam.test_conformance import denials
from tests.integration.conftest import count_calls

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


def test_a_paged_listing_returns_every_waiting_pod_once(api: tuple[KubeApi, str]) -> None:
    kube, url = api
    cluster_of_seven(kube)
    found = reader(url, page_size=2).read("ml")
    assert sorted(p.key for p in found.waiting) == ["team-a/train-0", "team-a/train-1", "team-a/train-2"]
    assert found.gpu_nodes == {"ip-10-0-1-7.ec2.internal", "ip-10-0-1-8.ec2.internal"}
    assert found.pages == 3  # 6 unfinished pods, 2 a page: the finished one stayed on the server
    assert [r["query"].get("continue") is None for r in kube.requests] == [True, False, False]
    assert {(r["path"], r["query"]["fieldSelector"], r["query"]["limit"]) for r in kube.requests} == {
        ("/api/v1/pods", UNFINISHED, "2")
    }


def test_an_expired_continue_token_restarts_the_listing_once(api: tuple[KubeApi, str]) -> None:
    kube, url = api
    cluster_of_seven(kube)
    kube.script.extend(["ok", "expire"])  # etcd compacts between the first and the second page
    found = reader(url, page_size=2).read("ml")
    assert sorted(p.key for p in found.waiting) == ["team-a/train-0", "team-a/train-1", "team-a/train-2"]
    assert found.pages == 1 + 3
    assert [r["query"].get("continue") is None for r in kube.requests] == [True, False, True, False, False]


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
    kube, url = api
    kube.script.append("delay:3")
    started = time.monotonic()
    with pytest.raises(ClusterUnreadable, match=r"no answer within 2 s") as err:
        reader(url).read("ml")
    assert time.monotonic() - started < 2.5
    assert err.value.kind == "timeout"


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
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "api.crt", folder / "api.key"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kube-api"]
    command += ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"no openssl to make a test certificate: {err}")
    return str(cert), str(key)


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
    clients = fleet.Clients.create()
    fleet.create_nodegroup(clients, "ml", "infer-gpu", min_size=1, max_size=5, desired=2, tags=fleet.MANAGED_TAG)
    clients.eks.create_nodegroup(
        clusterName="ml",
        nodegroupName="train-gpu",
        nodeRole="arn:aws:iam::123456789012:role/gpufleet-demo",
        subnets=["subnet-1"],
        scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 0},
        instanceTypes=["g5.12xlarge"],
        capacityType="SPOT",
        labels={"team": "a"},
        taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}],
    )
    shape = node_shape(clients.eks, clients.ec2, "ml", "train-gpu")
    assert shape == NodeShape(
        gpus=4,
        labels=(
            ("eks.amazonaws.com/capacityType", "SPOT"),
            ("eks.amazonaws.com/nodegroup", "train-gpu"),
            ("kubernetes.io/arch", "amd64"),
            ("kubernetes.io/os", "linux"),
            ("node.kubernetes.io/instance-type", "g5.12xlarge"),
            ("team", "a"),
        ),
        taints=(("nvidia.com/gpu", "true", "NoSchedule"),),
    )
    wants = pod("train-0", gpus=4, node_selector={"eks.amazonaws.com/nodegroup": "train-gpu"}, tolerations=GPU_TAINT)
    untolerated = pod("train-1", gpus=4, node_selector={"eks.amazonaws.com/nodegroup": "train-gpu"})
    assert [fits(w, shape) for w in map(waiting_pod, (wants, untolerated)) if w] == [True, False]
    calls = count_calls(clients.ec2)
    node_shape(clients.eks, clients.ec2, "ml", "train-gpu")
    assert calls["ec2:DescribeInstanceTypes"] == 0  # instance types are kept per container


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
        ("scaler", "ec2:DescribeInstances"),
    }
    assert denials(calls) == []
