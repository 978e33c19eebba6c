"""The demand reader's glue with fakes for its adapters: a pod counted once for the best-fitting group,
InService nodes without GPU pods offered as room, and every doubt about which node runs work failing
closed (no node may go) with one WARNING."""

from __future__ import annotations

from datetime import UTC, datetime

from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, InstanceObservation
from gpufleet.kubernetes.pods import ClusterPods, WaitingPod, cluster_pods
from gpufleet.policy.fleet import DemandSource, GroupSettings, KubernetesDemand
from gpufleet.scaling.demand import NodeShape
from gpufleet.scaling.demand_source import DemandReader
from tests.adapters.scaling.wiring import Pods, shapes

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SETTINGS = GroupSettings(demand=DemandSource(kubernetes=KubernetesDemand()))
SHAPES = {"big": NodeShape(gpus=8), "small": NodeShape(gpus=4)}


def group(name: str, *ids: str) -> GroupObservation:
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name=name),
        min_size=0,
        max_size=10,
        desired=len(ids),
        instances=tuple(InstanceObservation(instance_id=i) for i in ids),
    )


def reader(pods: ClusterPods, instances_of: object) -> DemandReader:
    return DemandReader(
        sqs=None,
        cloudwatch=None,
        cluster_pods=Pods(lambda cluster, resources, nodes=None, **_: pods),
        groups=shapes(lambda cluster, nodegroup: SHAPES[nodegroup]),
        instances_of=instances_of,  # type: ignore[arg-type]
        logger=Logger(service="test", level="CRITICAL"),
    )


def test_a_pod_counts_once_for_the_smallest_group_it_fits_and_empty_nodes_are_room() -> None:
    pods = ClusterPods(
        cluster="ml",
        waiting=(WaitingPod(namespace="a", name="p4", gpus=4), WaitingPod(namespace="a", name="p8", gpus=8)),
        gpu_nodes=frozenset({"ip-1.ec2.internal"}),
    )
    pairs = [(group("big", "i-1", "i-2"), SETTINGS), (group("small"), SETTINGS)]
    found = {o.ref.name: o for o, _ in reader(pods, lambda names: {"ip-1.ec2.internal": "i-1"}).attach(pairs, NOW)}
    big, small = found["big"].demand, found["small"].demand
    assert big is not None and small is not None
    assert [w.name for w in big.waiting] == ["a/p8"] and [w.name for w in small.waiting] == ["a/p4"]
    assert [i.runs_work for i in found["big"].instances] == [True, False]
    assert big.free_gpus == (8,)  # i-2: InService, no GPU pod


def test_a_node_name_ec2_does_not_know_fails_closed_for_scale_in_and_keeps_the_room() -> None:
    """Issue 28: one GPU pod on an unmapped node name made every node look full (6 nodes for one pod, one
    more each tick). Protection and room are separate facts: no node may go; the room stays, less one node
    per unmapped name (that pod may be on one of them: a custom hostname)."""
    pods = ClusterPods(cluster="ml", gpu_nodes=frozenset({"custom-hostname-7"}))
    [(obs, _)] = reader(pods, lambda names: {}).attach([(group("big", "i-1", "i-2"), SETTINGS)], NOW)
    assert obs.demand is not None and obs.demand.free_gpus == (8,)
    assert obs.demand.closed_for_scale_in is not None and "custom-hostname-7" in obs.demand.closed_for_scale_in


def test_describe_instances_failing_fails_closed_and_the_others_carry_on() -> None:
    def throttled(names: object) -> dict[str, str]:
        raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "DescribeInstances")

    pods = ClusterPods(cluster="ml", gpu_nodes=frozenset({"ip-1.ec2.internal"}))
    [(obs, _)] = reader(pods, throttled).attach([(group("big", "i-1"), SETTINGS)], NOW)
    assert obs.demand is not None and "RequestLimitExceeded" in str(obs.demand.closed_for_scale_in)


def test_a_node_whose_only_pod_is_a_cpu_only_job_runs_work() -> None:
    """Work is any pod bound to a node but a DaemonSet's (kubernetes.pods.pod_work), not only a GPU pod: the
    node of another team's CPU-only batch Job is mapped like a GPU pod's and never offered as room."""
    job = {
        "metadata": {"name": "etl-x7", "namespace": "other", "uid": "u1",
                     "ownerReferences": [{"kind": "Job", "name": "etl"}]},
        "spec": {"nodeName": "ip-1.ec2.internal",
                 "containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    asked: list[set[str]] = []

    def instances_of(names: object) -> dict[str, str]:
        asked.append(set(names))  # type: ignore[call-overload]
        return {"ip-1.ec2.internal": "i-1"}

    pods = cluster_pods("ml", [job], pages=1)
    [(obs, _)] = reader(pods, instances_of).attach([(group("big", "i-1", "i-2"), SETTINGS)], NOW)
    assert asked == [{"ip-1.ec2.internal"}]
    assert [i.runs_work for i in obs.instances] == [True, False]
    assert obs.demand is not None and obs.demand.free_gpus == (8,) and obs.demand.closed_for_scale_in is None


def test_a_fargate_node_is_no_groups_and_a_node_named_by_its_instance_needs_no_lookup() -> None:
    """CoreDNS on Fargate (node `fargate-ip-...`) is work, but on no instance of a group: it is not looked up
    and closes nothing. An EKS Auto Mode node is named by its instance id: it maps without DescribeInstances."""

    def running(name: str, node: str) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": "kube-system", "uid": name},
                "spec": {"nodeName": node, "containers": [{"name": "c"}]}, "status": {"phase": "Running"}}  # fmt: skip

    asked: list[set[str]] = []

    def instances_of(names: object) -> dict[str, str]:
        asked.append(set(names))  # type: ignore[call-overload]
        return {}

    auto = "i-0a1b2c3d4e5f67890"
    listing = [running("coredns-1", "fargate-ip-10-0-3-4.us-east-1.compute.internal"), running("etl", auto)]
    pods = cluster_pods("ml", listing, pages=1)
    [(obs, _)] = reader(pods, instances_of).attach([(group("big", auto, "i-2"), SETTINGS)], NOW)
    assert asked == []
    assert [i.runs_work for i in obs.instances] == [True, False]
    assert obs.demand is not None and obs.demand.closed_for_scale_in is None
