"""Build a GPU fleet inside moto: state table, tagged ASGs, an EKS managed node group, GPU alarms.

Emulation (labelled): moto's EKS names a backing ASG for each node group but never creates it, and
never propagates desiredSize to it. `create_nodegroup` creates that ASG, and `sync_nodegroup_asgs`
does the propagation that EKS does in AWS.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3

from gpufleet.domain import defaults
from gpufleet_node import schema
from gpufleet_tools import local
from gpufleet_tools.local_stack import eks_backing_asg_tags, sync_nodegroup_sizes

INSTANCE_TYPE = "g5.12xlarge"
MANAGED_TAG = {defaults.TAG_MANAGED: defaults.TAG_MANAGED_VALUE}


@dataclass
class Clients:
    autoscaling: Any
    ec2: Any
    eks: Any
    cloudwatch: Any
    dynamodb: Any

    @classmethod
    def create(cls, client: Callable[[str], Any] = boto3.client) -> Clients:
        return cls(*(client(name) for name in ("autoscaling", "ec2", "eks", "cloudwatch", "dynamodb")))


def create_state_table(dynamodb: Any, name: str) -> None:
    dynamodb.create_table(
        TableName=name,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    create_busy_table(dynamodb)


def create_busy_table(dynamodb: Any) -> None:
    """The queue workers' busy marks (template.yaml BusyTable: a fixed name, one key), made once per server."""
    with contextlib.suppress(dynamodb.exceptions.ResourceInUseException):
        dynamodb.create_table(
            TableName=schema.BUSY_TABLE,
            AttributeDefinitions=[{"AttributeName": schema.BUSY_KEY, "AttributeType": "S"}],
            KeySchema=[{"AttributeName": schema.BUSY_KEY, "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )


_IMAGES: dict[str, str] = {}  # endpoint -> a moto AMI id (moto ships the same images after every reset)


def _launch_template(
    ec2: Any, market: str | None = None, reservation: str | None = None, instance_type: str = INSTANCE_TYPE
) -> str:
    """The GPU node launch template; `market="spot"` sets InstanceMarketOptions as a spot group's has,
    `reservation` targets a capacity reservation (a Capacity Block: market "capacity-block")."""
    name = "gpufleet-gpu-node" + (f"-{market}" if market else "") + (f"-{reservation}" if reservation else "")
    name += f"-{instance_type}" if instance_type != INSTANCE_TYPE else ""
    existing = ec2.describe_launch_templates(Filters=[{"Name": "launch-template-name", "Values": [name]}])
    if existing["LaunchTemplates"]:
        return name
    image = _IMAGES.get(ec2.meta.endpoint_url) or _IMAGES.setdefault(
        ec2.meta.endpoint_url,
        ec2.describe_images()["Images"][0]["ImageId"],  # moto's list is long: read once
    )
    data: dict[str, Any] = {"ImageId": image, "InstanceType": instance_type}
    if market:
        data["InstanceMarketOptions"] = {"MarketType": market}
    if reservation:
        data["CapacityReservationSpecification"] = {"CapacityReservationTarget": {"CapacityReservationId": reservation}}
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=data)
    return name


def create_asg(
    clients: Clients,
    name: str,
    *,
    min_size: int,
    max_size: int,
    desired: int,
    tags: dict[str, str] | None = None,
    market: str | None = None,
    reservation: str | None = None,
    instance_type: str = INSTANCE_TYPE,
) -> None:
    template = _launch_template(clients.ec2, market, reservation, instance_type)
    clients.autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": template, "Version": "$Latest"},
        MinSize=min_size,
        MaxSize=max_size,
        DesiredCapacity=desired,
        AvailabilityZones=["us-east-1a"],
        Tags=[
            {"Key": k, "Value": v, "PropagateAtLaunch": True, "ResourceId": name, "ResourceType": "auto-scaling-group"}
            for k, v in (tags or {}).items()
        ],
    )


def create_nodegroup(
    clients: Clients,
    cluster: str,
    name: str,
    *,
    min_size: int,
    max_size: int,
    desired: int,
    tags: dict[str, str],
    instance_type: str = INSTANCE_TYPE,
) -> str:
    """An EKS managed node group plus (emulated) its backing ASG, tagged the way EKS tags it; returns the
    ASG's name."""
    vpc = clients.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = clients.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1a")
    subnet_id = subnet["Subnet"]["SubnetId"]
    role = "arn:aws:iam::123456789012:role/gpufleet-demo"
    clusters = clients.eks.list_clusters()["clusters"]
    if cluster not in clusters:
        clients.eks.create_cluster(name=cluster, roleArn=role, resourcesVpcConfig={"subnetIds": [subnet_id]})
    ng = clients.eks.create_nodegroup(
        clusterName=cluster,
        nodegroupName=name,
        nodeRole=role,
        subnets=[subnet_id],
        scalingConfig={"minSize": min_size, "maxSize": max_size, "desiredSize": desired},
        instanceTypes=[instance_type],
        capacityType="ON_DEMAND",
        tags=tags,
    )["nodegroup"]
    asg_name: str = ng["resources"]["autoScalingGroups"][0]["name"]
    create_asg(
        clients,
        asg_name,
        min_size=min_size,
        max_size=max_size,
        desired=desired,
        tags=eks_backing_asg_tags(cluster, name),
        instance_type=instance_type,
    )
    return asg_name


def sync_nodegroup_asgs(clients: Clients) -> list[str]:
    """[emulated EKS] propagate each node group's desiredSize to its backing ASG."""
    return sync_nodegroup_sizes(clients.eks, clients.autoscaling)


def put_gpu_alarm(
    cloudwatch: Any,
    name: str,
    dimensions: dict[str, str],
    *,
    direction: str,
    threshold: float,
    evaluation_periods: int,
) -> None:
    """A GPU utilization alarm on a whole group; direction comes from the gpufleet:direction tag."""
    cloudwatch.put_metric_alarm(
        AlarmName=name,
        Namespace=schema.NAMESPACE,
        MetricName=schema.GPU_UTILIZATION.name,
        Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
        Statistic="Average",
        Period=60,
        EvaluationPeriods=evaluation_periods,
        Threshold=threshold,
        ComparisonOperator="GreaterThanThreshold" if direction == "out" else "LessThanThreshold",
        TreatMissingData="missing",
        Tags=[{"Key": defaults.TAG_ALARM_DIRECTION, "Value": direction}],
    )


def create_busy_asg_fleet(clients: Clients, groups: int, gpus: int, at: Any, utilization: float = 50.0) -> list[str]:
    """`groups` tagged empty ASGs whose group GPU series each got `gpus` datums at `at` (scale tests)."""
    names = [f"gpu-{i:04d}" for i in range(groups)]
    for name in names:
        create_asg(clients, name, min_size=0, max_size=4, desired=0, tags=MANAGED_TAG)
    data = [
        {
            "MetricName": schema.GPU_UTILIZATION.name,
            "Dimensions": [{"Name": schema.DIM_ASG_NAME, "Value": name}],
            "Value": utilization,
            "Timestamp": at,
        }
        for name in names
        for _ in range(gpus)
    ]
    put_data(clients.cloudwatch, data)
    return names


def put_data(cloudwatch: Any, data: list[dict[str, Any]], namespace: str = schema.NAMESPACE) -> None:
    """Datums in as few PutMetricData calls as CloudWatch allows (1,000 datums a call)."""
    for i in range(0, len(data), 1000):
        cloudwatch.put_metric_data(Namespace=namespace, MetricData=data[i : i + 1000])


@dataclass
class NotificationStack:
    """The notifier's resources in moto: queue + DLQ (redrive), KMS-less topic, Slack secret."""

    queue_url: str
    dlq_url: str
    topic_arn: str
    secret_arn: str | None
    sns_inbox_url: str  # an SQS queue subscribed to the topic, to read what SNS delivered

    def env(self, table: str, policy_path: str) -> dict[str, str]:
        env = {
            defaults.ENV_STATE_TABLE: table,
            defaults.ENV_POLICY_FILE: policy_path,
            defaults.ENV_NOTIFY_QUEUE_URL: self.queue_url,
            defaults.ENV_NOTIFY_DLQ_URL: self.dlq_url,
            defaults.ENV_NOTIFY_TOPIC_ARN: self.topic_arn,
        }
        if self.secret_arn:
            env[defaults.ENV_SLACK_SECRET] = self.secret_arn
        return env


def create_notification_stack(
    slack_secret: str | None, prefix: str = "gpufleet", client: Callable[[str], Any] = boto3.client
) -> NotificationStack:
    sqs, sns, secrets = client("sqs"), client("sns"), client("secretsmanager")
    dlq_url = sqs.create_queue(QueueName=f"{prefix}-notify-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "10"})
    queue_url = sqs.create_queue(
        QueueName=f"{prefix}-notify", Attributes={"RedrivePolicy": redrive, "VisibilityTimeout": "120"}
    )["QueueUrl"]
    topic_arn = sns.create_topic(Name=f"{prefix}-notifications")["TopicArn"]
    inbox_url = sqs.create_queue(QueueName=f"{prefix}-sns-inbox")["QueueUrl"]
    inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=inbox_arn, Attributes={"RawMessageDelivery": "false"})
    secret_arn = None
    if slack_secret is not None:
        secret_arn = secrets.create_secret(Name=f"{prefix}/slack", SecretString=slack_secret)["ARN"]
    return NotificationStack(queue_url, dlq_url, topic_arn, secret_arn, inbox_url)


def drain(sqs: Any, queue_url: str, max_messages: int = 10_000) -> list[dict[str, Any]]:
    """Receive (and delete) everything visible on a queue now."""
    out: list[dict[str, Any]] = []
    while len(out) < max_messages:
        resp = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], AttributeNames=["All"]
        )
        messages = resp.get("Messages", [])
        if not messages:
            return out
        sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
        )
        out.extend(messages)
    return out


def sqs_event(
    messages: list[dict[str, Any]], queue_arn: str = "arn:aws:sqs:us-east-1:123456789012:q"
) -> dict[str, Any]:
    """Received SQS messages in the shape Lambda's SQS event source delivers them."""
    return local.sqs_event(messages, queue_arn)


# ---- EMULATED failed launches (moto never fails one; rehearsal.moto_ext serves what is injected) ----


def inject_capacity_reservation(endpoint: str, reservation_id: str, end: Any, kind: str = "capacity-block") -> None:
    """[emulated EC2] a capacity reservation and its end date, as DescribeCapacityReservations answers
    (moto has no such API; rehearsal.moto_ext serves what is injected)."""
    import urllib.request

    reservation = {
        "CapacityReservationId": reservation_id,
        "EndDate": end.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "State": "active",
        "ReservationType": kind,
    }
    req = urllib.request.Request(
        f"{endpoint}/_gpufleet/emulation/capacity-reservations", data=json.dumps([reservation]).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10):
        return


def inject_failed_launch(
    endpoint: str, asg: str, at: Any, message: str, az: str = "us-east-1a", activity_id: str | None = None
) -> str:
    """[emulated EC2 Auto Scaling] record a failed launch activity, as AWS would after a failed launch."""
    import urllib.request
    import uuid

    activity_id = activity_id or str(uuid.uuid4())
    activity = {
        "ActivityId": activity_id,
        "AutoScalingGroupName": asg,
        "Description": "Launching a new EC2 instance.  Status Reason: " + message,
        "Cause": f"At {at:%Y-%m-%dT%H:%M:%SZ} an instance was started in response to a difference between "
        "desired and actual capacity.",
        "StartTime": at.isoformat(),
        "EndTime": at.isoformat(),
        "StatusCode": "Failed",
        "StatusMessage": message,
        "Progress": 100,
        "Details": json.dumps({"Subnet ID": "subnet-0a1b2c3d", "Availability Zone": az}),
    }
    req = urllib.request.Request(
        f"{endpoint}/_gpufleet/emulation/scaling-activities", data=json.dumps([activity]).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10):
        return activity_id


def _set_lifecycle(group: str, instance_ids: list[str], state: str) -> None:
    import os
    import urllib.request

    req = urllib.request.Request(
        f"{os.environ['AWS_ENDPOINT_URL']}/_gpufleet/emulation/lifecycle",
        data=json.dumps({"group": group, "instance_ids": instance_ids, "state": state}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10):
        pass


def set_hyperpod_node_status(endpoint: str, cluster: str, node_ids: list[str], status: str) -> int:
    """[emulated] What HyperPod says of some nodes (DeepHealthCheckInProgress, Failure, ...): the
    emulation's POST (rehearsal.moto_hyperpod.set_node_status); how many nodes changed."""
    import urllib.request

    from rehearsal import moto_hyperpod

    body = json.dumps({"cluster": cluster, "node_ids": node_ids, "status": status}).encode()
    req = urllib.request.Request(
        f"{endpoint}{moto_hyperpod.NODE_STATUS_PATH}", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as answer:  # moto on 127.0.0.1
        return int(json.loads(answer.read())["changed"])


def hold_out_of_service(autoscaling: Any, asg: str, instance_ids: list[str]) -> None:
    """[emulated spot outage] instances the ASG asked for but EC2 could not deliver stay Pending (moto
    would have them InService at once), so desired - in service is the unfulfilled capacity, as in AWS."""
    if instance_ids:
        _set_lifecycle(asg, instance_ids, "Pending")


def deliver_held(autoscaling: Any, asg: str) -> list[str]:
    """[emulated spot recovery] the held instances come into service; any the ASG launched beyond its
    desired capacity meanwhile (moto re-launches for Pending ones) are trimmed by re-applying desired."""
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"][0]
    held = [i["InstanceId"] for i in group["Instances"] if i["LifecycleState"] == "Pending"]
    if held:
        _set_lifecycle(asg, held, "InService")
        autoscaling.set_desired_capacity(AutoScalingGroupName=asg, DesiredCapacity=group["DesiredCapacity"])
    return held
