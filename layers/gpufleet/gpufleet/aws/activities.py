"""Failed launches as Auto Scaling reports them: DescribeScalingActivities (newest first, paged) and EKS
node group health issues (e.g. AsgInstanceLaunchFailures)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

FAILED_STATUSES = ("Failed", "Cancelled")


@dataclass
class LaunchActivityReader:
    autoscaling: Any
    eks: Any

    def failed_since(self, asg_name: str, since: datetime) -> list[dict[str, Any]]:
        """Failed/cancelled activities of one ASG that started after `since` (stops paging at older ones)."""
        out: list[dict[str, Any]] = []
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

    def nodegroup_issues(self, cluster: str, nodegroup: str) -> list[dict[str, Any]]:
        resp = self.eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)
        issues: list[dict[str, Any]] = resp["nodegroup"].get("health", {}).get("issues", [])
        return issues


def activity_az(activity: dict[str, Any]) -> str | None:
    try:
        details = json.loads(activity.get("Details") or "{}")
    except json.JSONDecodeError:
        return None
    az = details.get("Availability Zone") if isinstance(details, dict) else None
    return str(az) if az else None


def activity_message(activity: dict[str, Any]) -> str:
    return str(activity.get("StatusMessage") or activity.get("Description") or "")
