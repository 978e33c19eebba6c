"""CloudWatch alarm look-ups the scaler needs: an alarm's tags, and alarms still in ALARM."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient


@dataclass
class AlarmReader:
    cloudwatch: CloudWatchClient

    def tags(self, alarm_arn: str | None) -> dict[str, str]:
        """Tags of the alarm; {} when it has none, is gone, or has no ARN in the event."""
        if not alarm_arn:
            return {}
        try:
            resp = self.cloudwatch.list_tags_for_resource(ResourceARN=alarm_arn)
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("ResourceNotFound", "ResourceNotFoundException"):
                return {}
            raise
        return {t["Key"]: t["Value"] for t in resp.get("Tags", [])}

    def describe(self, name: str) -> dict[str, Any] | None:
        """One metric or composite alarm by name (None when it does not exist)."""
        resp = self.cloudwatch.describe_alarms(AlarmNames=[name], AlarmTypes=["MetricAlarm", "CompositeAlarm"])
        found = [*resp.get("MetricAlarms", []), *resp.get("CompositeAlarms", [])]
        return dict(found[0]) if found else None

    def every_alarm(self) -> Iterator[tuple[dict[str, Any], bool]]:
        """Every metric and composite alarm in the region (DescribeAlarms, all pages), with `composite`."""
        paginator = self.cloudwatch.get_paginator("describe_alarms")
        for page in paginator.paginate(AlarmTypes=["MetricAlarm", "CompositeAlarm"]):
            yield from ((dict(a), False) for a in page.get("MetricAlarms", []))
            yield from ((dict(a), True) for a in page.get("CompositeAlarms", []))

    def firing(self, prefix: str) -> list[dict[str, Any]]:
        """Metric alarms whose name starts with `prefix` and that are in ALARM now."""
        out: list[dict[str, Any]] = []
        paginator = self.cloudwatch.get_paginator("describe_alarms")
        for page in paginator.paginate(AlarmNamePrefix=prefix, StateValue="ALARM", AlarmTypes=["MetricAlarm"]):
            # Filter again: some implementations (moto) apply only one of the two filters.
            out.extend(a for a in page.get("MetricAlarms", []) if a.get("StateValue") == "ALARM")
        return out
