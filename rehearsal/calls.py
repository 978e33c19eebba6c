"""Record every AWS call gpufleet's functions make, with what IAM would evaluate it on.

moto enforces no IAM, so the tests and the rehearsal record each call instead: the function that made
it (the outermost gpufleet service on the stack: scaler, oom_guard, spot_watch, notifier,
termination_policy), the IAM
action, the resource ARNs and the condition keys IAM would see - the resource's tags as moto holds them
at that moment, DynamoDB's leading keys, tag keys in the request. tests/iam/test_conformance.py then
evaluates every record against the function's role in the expanded SAM template.

Used in-process by the test session (tests/conftest.py) and, with GPUFLEET_RECORD_CALLS=FILE, by the
rehearsal subprocess (`make demo` writes nothing unless asked).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

from botocore.client import BaseClient

from gpufleet_node import schema

ACCOUNT = "123456789012"
REGION = "us-east-1"
ENV_RECORD = "GPUFLEET_RECORD_CALLS"
SERVICES = {  # the outermost of these on the stack names the Lambda function making the call
    "gpufleet.notify.service": "notifier",
    "gpufleet.guard.service": "oom_guard",
    "gpufleet.capacity.service": "spot_watch",
    "gpufleet.scaling.service": "scaler",
    "gpufleet.scaling.answer": "termination_policy",
    # Only the scaler reads clusters (demand-driven scaling): until it is wired to them, the Kubernetes
    # reader's and node mapping's own tests stand for its calls. Outermost wins, so a function that
    # calls them through its service is still named as itself.
    "gpufleet.kubernetes.cluster": "scaler",
    "gpufleet.aws.eks_nodes": "scaler",
    "gpufleet.aws.asg_shape": "scaler",  # a self-managed ASG's node shape (issue 30)
}
# botocore endpoint prefix -> IAM service prefix
IAM_PREFIX = {"monitoring": "cloudwatch", "api.sagemaker": "sagemaker"}
BATCH_ACTIONS = {"SendMessageBatch": "SendMessage", "DeleteMessageBatch": "DeleteMessage"}


@dataclass
class Resource:
    arn: str
    context: dict[str, Any] = field(default_factory=dict)


@dataclass
class CallRecord:
    function: str
    action: str
    resources: list[Resource]


def calling_function() -> str | None:
    frame = sys._getframe(1)
    found = None
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name in SERVICES:
            found = SERVICES[name]
        frame = frame.f_back  # type: ignore[assignment]
    return found


def _tags(items: list[dict[str, Any]], key: str = "Key", value: str = "Value") -> dict[str, str]:
    return {t[key]: t.get(value, "") for t in items}


def _tag_context(tags: dict[str, str], *prefixes: str) -> dict[str, Any]:
    return {f"{p}:ResourceTag/{k}": v for p in prefixes for k, v in tags.items()}


class _Resolver:
    """Resource ARNs and condition keys per operation, looked up (unrecorded) as moto holds them now."""

    def __init__(self, client: BaseClient) -> None:
        self.client = client

    def _asg(self, name: str) -> Resource:
        groups = self.client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        if not groups:
            return Resource(f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/{name}")
        g = groups[0]
        return Resource(g["AutoScalingGroupARN"], _tag_context(_tags(g.get("Tags", [])), "autoscaling", "aws"))

    def _asg_of_instance(self, instance_id: str) -> Resource:
        found = self.client.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
        return self._asg(found[0]["AutoScalingGroupName"]) if found else Resource("arn:aws:autoscaling:::unknown")

    def _nodegroup(self, cluster: str, name: str) -> Resource:
        ng = self.client.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"]
        return Resource(ng["nodegroupArn"], _tag_context(dict(ng.get("tags", {})), "aws"))

    def resolve(self, service: str, op: str, p: dict[str, Any]) -> list[Resource]:
        handler: Callable[[dict[str, Any]], list[Resource]] | None = getattr(self, f"_{service}_{op}", None)
        if handler is not None:
            return handler(p)
        if op.startswith(("Describe", "List", "Get")) and service in ("autoscaling", "eks", "monitoring", "ec2"):
            return [Resource("*")]
        return [Resource(f"UNMAPPED:{service}:{op}")]  # the conformance test fails on it: map every new call

    # autoscaling
    def _autoscaling_SetDesiredCapacity(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [self._asg(p["AutoScalingGroupName"])]

    def _autoscaling_TerminateInstanceInAutoScalingGroup(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [self._asg_of_instance(p["InstanceId"])]

    _autoscaling_SetInstanceHealth = _autoscaling_TerminateInstanceInAutoScalingGroup  # noqa: N815
    _autoscaling_SetInstanceProtection = _autoscaling_SetDesiredCapacity  # noqa: N815 (the busy marks kept)

    def _autoscaling_CreateOrUpdateTags(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        out = []
        for t in p["Tags"]:
            r = self._asg(t["ResourceId"])
            r.context.update({"aws:TagKeys": [t["Key"]], f"aws:RequestTag/{t['Key']}": t.get("Value", "")})
            out.append(r)
        return out

    # eks
    def _eks_ListClusters(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [Resource("*")]

    def _eks_ListNodegroups(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [Resource(f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/{p['clusterName']}")]

    def _eks_DescribeCluster(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [Resource(f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/{p['name']}")]

    def _eks_DescribeNodegroup(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [self._nodegroup(p["clusterName"], p["nodegroupName"])]

    _eks_UpdateNodegroupConfig = _eks_DescribeNodegroup  # noqa: N815

    # sagemaker: a HyperPod cluster, by name or ARN, with its tags (aws:ResourceTag/*)
    def _cluster(self, name_or_arn: str) -> Resource:
        try:
            arn = self.client.describe_cluster(ClusterName=name_or_arn)["ClusterArn"]
        except self.client.exceptions.ClientError:
            return Resource(f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:cluster/{name_or_arn.split('/')[-1]}")
        tags = self.client.list_tags(ResourceArn=arn).get("Tags", [])
        return Resource(arn, _tag_context(_tags(tags), "aws"))

    def _sagemaker_DescribeCluster(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [self._cluster(p["ClusterName"])]

    _sagemaker_ListClusterNodes = _sagemaker_DescribeCluster  # noqa: N815
    _sagemaker_UpdateCluster = _sagemaker_DescribeCluster  # noqa: N815
    _sagemaker_BatchDeleteClusterNodes = _sagemaker_DescribeCluster  # noqa: N815

    def _sagemaker_ListTags(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [self._cluster(p["ResourceArn"])]

    # iam: the HyperPod controller group's execution role (its RoleId names the controller's namespace)
    def _iam_GetRole(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [Resource(f"arn:aws:iam::{ACCOUNT}:role/{p['RoleName']}")]

    # cloudwatch
    def _monitoring_ListTagsForResource(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        return [Resource(p["ResourceARN"])]

    def _monitoring_DescribeAlarms(self, p: dict[str, Any]) -> list[Resource]:  # noqa: N802
        names = p.get("AlarmNames") or ["*"]
        return [Resource(f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{n}") for n in names]

    # dynamodb: the table, and the partition keys a request touches (dynamodb:LeadingKeys)
    def resolve_dynamodb(self, op: str, p: dict[str, Any]) -> list[Resource]:
        tables: dict[str, list[str]] = {}
        if "RequestItems" in p:
            for table, spec in p["RequestItems"].items():
                keys = (
                    spec["Keys"]
                    if isinstance(spec, dict)
                    else [(r.get("PutRequest", {}).get("Item") or r.get("DeleteRequest", {}).get("Key")) for r in spec]
                )
                tables.setdefault(table, []).extend(_partition(k) for k in keys)
        else:
            item = p.get("Key") or p.get("Item")
            if item is not None:
                pk = [_partition(item)]
            else:  # Query: the partition key's value in the key condition; Scan: none
                pk = [v["S"] for k, v in p.get("ExpressionAttributeValues", {}).items() if k in (":pk", ":p")]
            tables[p["TableName"]] = pk
        # A Scan names no partition key: IAM's dynamodb:LeadingKeys is then absent, not empty.
        return [
            Resource(
                f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{t}",
                {"dynamodb:LeadingKeys": sorted(set(keys))} if keys or op != "Scan" else {},
            )
            for t, keys in tables.items()
        ]


def _partition(key: dict[str, Any]) -> str:
    """A request's partition key value: the state table's `pk`, the busy table's `node` (schema.BUSY_KEY)."""
    found = key.get("pk") or key.get(schema.BUSY_KEY) or {}
    return str(found.get("S", ""))


def _queue_arn(url: str) -> str:
    path = urlparse(url).path.strip("/").split("/")
    return (
        f"arn:aws:sqs:{REGION}:{path[0]}:{path[1]}" if len(path) == 2 else f"arn:aws:sqs:{REGION}:{ACCOUNT}:{path[-1]}"
    )


def implied_calls(action: str, params: dict[str, Any]) -> list[tuple[str, list[Resource]]]:
    """What IAM also authorizes for a call, beside its own action: UpdateCluster passes each instance
    group's ExecutionRole to SageMaker (iam:PassRole with iam:PassedToService; the HyperPod IAM guide,
    docs/hyperpod.md)."""
    if action != "sagemaker:UpdateCluster":
        return []
    roles = sorted({g["ExecutionRole"] for g in params.get("InstanceGroups", []) if g.get("ExecutionRole")})
    context = {"iam:PassedToService": "sagemaker.amazonaws.com"}
    return [("iam:PassRole", [Resource(arn, dict(context)) for arn in roles])] if roles else []


def resources_for(client: BaseClient, service: str, op: str, params: dict[str, Any]) -> list[Resource]:
    if service == "dynamodb":
        return _Resolver(client).resolve_dynamodb(op, params)
    if service == "sqs":
        return [Resource(_queue_arn(params["QueueUrl"]))]
    if service == "sns":
        return [Resource(params.get("TopicArn") or params.get("TargetArn", ""))]
    if service == "secretsmanager":
        return [Resource(params["SecretId"])]
    if service == "ssm":
        return [Resource(f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{params['Name']}")]
    return _Resolver(client).resolve(
        IAM_PREFIX.get(service, service) if service == "api.sagemaker" else service, op, params
    )


_local = threading.local()


@contextmanager
def unrecorded() -> Iterator[None]:
    """Calls made here (the recorder's own look-ups, the fault injector's checks) are not recorded."""
    previous = getattr(_local, "off", False)
    _local.off = True
    try:
        yield
    finally:
        _local.off = previous


class CallRecorder:
    def __init__(self) -> None:
        self.records: list[CallRecord] = []
        self._original: Callable[..., Any] | None = None

    def install(self) -> None:
        original = self._original = BaseClient._make_api_call
        recorder = self

        def recording(client: BaseClient, operation_name: str, api_params: dict[str, Any]) -> Any:
            function = None if getattr(_local, "off", False) else calling_function()
            if function is not None:
                service = client.meta.service_model.endpoint_prefix
                with unrecorded():  # resolved under the IAM prefix (api.sagemaker -> sagemaker)
                    resources = resources_for(client, service, operation_name, api_params)
                prefix = IAM_PREFIX.get(service, service)
                action = f"{prefix}:{BATCH_ACTIONS.get(operation_name, operation_name)}"
                recorder.records.append(CallRecord(function, action, resources))
                for implied, implied_resources in implied_calls(action, api_params):
                    recorder.records.append(CallRecord(function, implied, implied_resources))
            return original(client, operation_name, api_params)

        BaseClient._make_api_call = recording

    def uninstall(self) -> None:
        if self._original is not None:
            BaseClient._make_api_call = self._original
            self._original = None

    def dump(self, path: str) -> None:
        with open(path, "a") as f:
            for r in self.records:
                f.write(json.dumps(asdict(r)) + "\n")


def load(path: str) -> list[CallRecord]:
    out = []
    with open(path) as f:
        for line in f:
            raw = json.loads(line)
            out.append(CallRecord(raw["function"], raw["action"], [Resource(**r) for r in raw["resources"]]))
    return out
