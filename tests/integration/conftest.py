from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_lambda_powertools import Logger, Metrics

from gpufleet.domain import defaults
from gpufleet.domain.notification import Notification
from gpufleet.runtime import build_scaler
from gpufleet.scaling.service import Scaler
from gpufleet_node import schema
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import fleet

TABLE = "gpufleet-state"
EVENTS = Path(__file__).resolve().parents[2] / "events"
NOW = datetime(2026, 11, 23, 8, 12, 30, tzinfo=UTC)
POLICY = """
defaults: {scale_out_step: 1, scale_in_step: 2, scale_out_cooldown_s: 300, scale_in_cooldown_s: 300}
"""


@dataclass
class Fleet:
    clients: fleet.Clients
    policy_path: Path
    endpoint: str
    backing_asg: str

    def env(self, notify_queue: str | None = None, dry_run: bool = False) -> dict[str, str]:
        """The scaler's environment on this fleet: its table, its policy file, moto's account."""
        env = {defaults.ENV_STATE_TABLE: TABLE, defaults.ENV_POLICY_FILE: str(self.policy_path)}
        env[defaults.ENV_ACCOUNT_ID] = "123456789012"  # moto's account, as the template sets it from AWS::AccountId
        if notify_queue:
            env[defaults.ENV_NOTIFY_QUEUE_URL] = notify_queue
        if dry_run:
            env[defaults.ENV_DRY_RUN] = "true"
        return env

    def scaler(self, dry_run: bool = False, policy: str | None = None, notify_queue: str | None = None) -> Scaler:
        if policy is not None:
            self.policy_path.write_text(policy)
        env = self.env(notify_queue=notify_queue, dry_run=dry_run)
        scaler, idem = build_scaler(Logger(service="test"), Metrics(namespace="GPUFleet/Test"), env=env)
        idem.register_lambda_context(LocalLambdaContext("scaler"))  # type: ignore[arg-type]
        return scaler

    def desired(self, asg: str = "train-spot") -> int:
        groups = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])
        return int(groups["AutoScalingGroups"][0]["DesiredCapacity"])

    def instances(self, asg: str = "train-spot") -> list[str]:
        groups = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])
        return sorted(i["InstanceId"] for i in groups["AutoScalingGroups"][0]["Instances"])

    def nodegroup_desired(self) -> int:
        ng = self.clients.eks.describe_nodegroup(clusterName="ml", nodegroupName="infer-gpu")
        return int(ng["nodegroup"]["scalingConfig"]["desiredSize"])

    def alarm_state(self, name: str, state: str) -> None:
        """What CloudWatch would have done before delivering the alarm (moto evaluates no alarms)."""
        self.clients.cloudwatch.set_alarm_state(AlarmName=name, StateValue=state, StateReason="test")

    def changed_at(self, name: str) -> datetime:
        """When CloudWatch says the alarm last changed state (UTC): what every delivery path carries."""
        [alarm] = self.clients.cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"]
        at: datetime = alarm.get("StateTransitionedTimestamp") or alarm["StateUpdatedTimestamp"]
        return at.astimezone(UTC)

    def put_instance_gpu(self, instance_id: str, util: float, mem: float, at: Any) -> None:
        dims = [{"Name": schema.DIM_INSTANCE_ID, "Value": instance_id}]
        self.clients.cloudwatch.put_metric_data(
            Namespace=schema.NAMESPACE,
            MetricData=[
                {"MetricName": schema.GPU_UTILIZATION.name, "Dimensions": dims, "Value": util, "Timestamp": at},
                {"MetricName": schema.GPU_MEMORY_USED_PERCENT.name, "Dimensions": dims, "Value": mem, "Timestamp": at},
            ],
        )


def sample(path: str) -> dict[str, Any]:
    """A sample event of events/ (a fresh copy on every call), e.g. `sample("scaler/alarm-action-asg-low.json")`."""
    body: dict[str, Any] = json.loads((EVENTS / path).read_text())
    return body


def tick(execution_id: str, at: datetime) -> dict[str, Any]:
    """An EventBridge Scheduler reconcile tick, scheduled for `at`."""
    return {"gpufleet": "reconcile", "execution_id": execution_id, "scheduled_time": at.isoformat()}


def decisions(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every group's decisions in a handler's result, flattened (a result without decisions has none)."""
    return [d for r in result["results"] for d in r.get("decisions", [])]


def queued(queue_url: str) -> list[Notification]:
    """The notifications on the queue, drained."""
    return [Notification.model_validate_json(m["Body"]) for m in fleet.drain(boto3.client("sqs"), queue_url)]


@pytest.fixture
def gpu_fleet(aws: str, tmp_path: Path) -> Fleet:
    """train-spot ASG (2 of max 8) and ml/infer-gpu node group (2 of max 5), both tagged, with alarms."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    fleet.create_asg(clients, "train-spot", min_size=1, max_size=8, desired=2, tags=fleet.MANAGED_TAG, market="spot")
    backing = fleet.create_nodegroup(
        clients, "ml", "infer-gpu", min_size=1, max_size=5, desired=2, tags=fleet.MANAGED_TAG
    )
    for name, dims, direction in (
        ("gpufleet-train-gpu-high", {"AutoScalingGroupName": "train-spot"}, "out"),
        ("gpufleet-train-gpu-low", {"AutoScalingGroupName": "train-spot"}, "in"),
        ("gpufleet-infer-gpu-high", {"ClusterName": "ml", "NodegroupName": "infer-gpu"}, "out"),
    ):
        fleet.put_gpu_alarm(clients.cloudwatch, name, dims, direction=direction, threshold=50, evaluation_periods=1)
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICY)
    return Fleet(clients, policy_path, aws, backing)


def count_calls(*clients: Any) -> Counter[str]:
    """Count API calls per operation on real boto3 clients (botocore's own event hook)."""
    calls: Counter[str] = Counter()
    seen: set[int] = set()

    def hook(model: Any, **_: Any) -> None:
        calls[f"{model.service_model.service_name}:{model.name}"] += 1

    for client in clients:
        if id(client) not in seen:
            seen.add(id(client))
            client.meta.events.register("before-call", hook)
    return calls


Factory = Callable[..., Scaler]
