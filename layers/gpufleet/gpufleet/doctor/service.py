"""`gpufleet doctor`'s reading (glue): what the account holds, read-only, in as few calls as the APIs
allow - every group (DescribeAutoScalingGroups, EKS list/describe), the region's native scaling policies
(DescribePolicies), the alarms (DescribeAlarms, tags only of the alarms that matter), and whether the Slack
secret and the SNS topic exist (DescribeSecret, GetTopicAttributes: never the secret's value). Rules:
`doctor.core`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.fleet import FleetReader
from gpufleet.doctor.core import AccountView, AlarmView, Presence
from gpufleet.domain.policy import FleetPolicy
from gpufleet.events.alarms import described_metrics
from gpufleet_node import schema

_NOT_FOUND = ("ResourceNotFoundException", "NotFound", "NotFoundException")


@dataclass
class AccountReader:
    fleet: FleetReader
    alarms: AlarmReader
    secrets: Any
    sns: Any

    def read(self, policy: FleetPolicy, slack_secret_arn: str | None, topic_arn: str | None) -> AccountView:
        return AccountView(
            groups=tuple(self.fleet.every_group()),
            scaling_policies=self._scaling_policies(),
            alarms=tuple(self._alarms(policy)),
            slack_secret=self._presence(
                lambda: self.secrets.describe_secret(SecretId=slack_secret_arn), slack_secret_arn
            ),
            topic=self._presence(lambda: self.sns.get_topic_attributes(TopicArn=topic_arn), topic_arn),
        )

    def _scaling_policies(self) -> dict[str, tuple[str, ...]]:
        found: dict[str, list[str]] = {}
        for page in self.fleet.autoscaling.get_paginator("describe_policies").paginate():
            for p in page.get("ScalingPolicies", []):
                found.setdefault(p["AutoScalingGroupName"], []).append(p["PolicyName"])
        return {k: tuple(v) for k, v in found.items()}

    def _alarms(self, policy: FleetPolicy) -> list[AlarmView]:
        out = []
        paginator = self.alarms.cloudwatch.get_paginator("describe_alarms")
        for page in paginator.paginate(AlarmTypes=["MetricAlarm", "CompositeAlarm"]):
            for raw, composite in [(a, False) for a in page.get("MetricAlarms", [])] + [
                (a, True) for a in page.get("CompositeAlarms", [])
            ]:
                alarm: dict[str, Any] = dict(raw)
                metrics = described_metrics(alarm)
                ours = alarm["AlarmName"].startswith(policy.alarm_prefix)
                if not ours and not any(m.namespace == schema.NAMESPACE for m in metrics):
                    continue  # neither named for gpufleet nor reading its metrics: not doctor's business
                tags = self.alarms.tags(alarm.get("AlarmArn"))
                out.append(AlarmView(name=alarm["AlarmName"], tags=tags, metrics=metrics, composite=composite))
        return out

    @staticmethod
    def _presence(describe: Any, arn: str | None) -> Presence:
        if not arn:
            return Presence.NOT_CONFIGURED
        try:
            describe()
        except ClientError as exc:
            if exc.response["Error"]["Code"] in _NOT_FOUND:
                return Presence.MISSING
            raise
        return Presence.PRESENT
