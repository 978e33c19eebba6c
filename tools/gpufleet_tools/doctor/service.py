"""`gpufleet doctor`'s reading (glue): what the account holds, read-only, in as few calls as the APIs
allow - every group (DescribeAutoScalingGroups, EKS list/describe), the region's native scaling policies
(DescribePolicies), the alarms (DescribeAlarms, tags only of the alarms that matter), and whether the Slack
secret and the SNS topic exist (DescribeSecret, GetTopicAttributes: never the secret's value). Rules:
`doctor.core`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.clients import AWS_FAILURES, AwsClients, Session, client, error_code
from gpufleet.aws.fleet import FleetReader
from gpufleet.domain.policy import FleetPolicy
from gpufleet.events.alarms import described_metrics
from gpufleet_tools.doctor.core import AccountView, AlarmView, Presence, reads_gpufleet_metrics

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
            scaling_policies=self.fleet.scaling_policies(),
            alarms=tuple(self._alarms(policy)),
            slack_secret=self._presence(
                lambda: self.secrets.describe_secret(SecretId=slack_secret_arn), slack_secret_arn
            ),
            topic=self._presence(lambda: self.sns.get_topic_attributes(TopicArn=topic_arn), topic_arn),
        )

    def _alarms(self, policy: FleetPolicy) -> list[AlarmView]:
        out = []
        for alarm, composite in self.alarms.every_alarm():
            metrics = described_metrics(alarm)
            ours = alarm["AlarmName"].startswith(policy.alarm_prefix)
            if not ours and not reads_gpufleet_metrics(metrics):
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
        except AWS_FAILURES as exc:
            if error_code(exc) in _NOT_FOUND:
                return Presence.MISSING
            raise
        return Presence.PRESENT


def build_account_reader(session: Session | None = None) -> AccountReader:
    """`gpufleet doctor`'s read-only view of the account (the caller's credentials, not a function's role)."""
    clients = AwsClients.create(session)
    return AccountReader(
        FleetReader(clients.autoscaling, clients.eks),
        AlarmReader(clients.cloudwatch),
        client("secretsmanager", session),
        client("sns", session),
    )
