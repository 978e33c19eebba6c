"""Failed launches as Auto Scaling reports them: DescribeScalingActivities (newest first, paged) and EKS
node group health issues (e.g. AsgInstanceLaunchFailures)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpufleet.aws.fleet import capacity_type_from_word
from gpufleet.domain.models import CapacityType

if TYPE_CHECKING:
    from mypy_boto3_autoscaling import AutoScalingClient
    from mypy_boto3_autoscaling.type_defs import ActivityTypeDef
    from mypy_boto3_eks import EKSClient
    from mypy_boto3_eks.type_defs import IssueTypeDef

FAILED_STATUSES = ("Failed", "Cancelled")


@dataclass
class LaunchActivityReader:
    autoscaling: AutoScalingClient
    eks: EKSClient
    ec2: Any = None
    _markets: dict[tuple[str, str], CapacityType] = field(default_factory=dict)

    def market_of(self, template: tuple[str, str]) -> CapacityType:
        """A launch template version's market (InstanceMarketOptions.MarketType), cached per version:
        spot, capacity-block, else on-demand."""
        if template not in self._markets:
            ref, version = template
            key = "LaunchTemplateId" if ref.startswith("lt-") else "LaunchTemplateName"
            found = self.ec2.describe_launch_template_versions(**{key: ref}, Versions=[version])[
                "LaunchTemplateVersions"
            ]
            data = found[0].get("LaunchTemplateData", {}) if found else {}
            market = str(data.get("InstanceMarketOptions", {}).get("MarketType", "on-demand"))
            self._markets[template] = capacity_type_from_word(market) if found else CapacityType.UNKNOWN
        return self._markets[template]

    def failed_since(self, asg_name: str, since: datetime) -> list[ActivityTypeDef]:
        """Failed/cancelled activities of one ASG that started after `since` (stops paging at older ones)."""
        out: list[ActivityTypeDef] = []
        kwargs: dict[str, Any] = {"AutoScalingGroupName": asg_name, "MaxRecords": 100}
        while True:
            page = self.autoscaling.describe_scaling_activities(**kwargs)
            for activity in page.get("Activities", []):
                if activity["StartTime"] <= since:
                    return out
                if activity.get("StatusCode") in FAILED_STATUSES:
                    out.append(activity)
            token = page.get("NextToken")
            if not token:
                return out
            kwargs["NextToken"] = token

    def nodegroup_issues(self, cluster: str, nodegroup: str) -> list[IssueTypeDef]:
        resp = self.eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)
        return list(resp["nodegroup"].get("health", {}).get("issues", []))


def activity_az(activity: ActivityTypeDef) -> str | None:
    try:
        details = json.loads(activity.get("Details") or "{}")
    except json.JSONDecodeError:
        return None
    az = details.get("Availability Zone") if isinstance(details, dict) else None
    return str(az) if az else None


def activity_message(activity: ActivityTypeDef) -> str:
    return str(activity.get("StatusMessage") or activity.get("Description") or "")
