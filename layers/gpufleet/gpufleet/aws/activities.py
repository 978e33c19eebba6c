"""Failed launches as Auto Scaling reports them: DescribeScalingActivities (newest first, paged) and EKS
node group health issues (e.g. AsgInstanceLaunchFailures)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpufleet.aws.groups.asg import capacity_type_from_word
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import CapacityType, GroupRef

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
    _templates: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)

    def _template_data(self, template: tuple[str, str]) -> dict[str, Any] | None:
        """A launch template version's LaunchTemplateData (None if the version is gone), cached per version."""
        if template not in self._templates:
            ref, version = template
            key = "LaunchTemplateId" if ref.startswith("lt-") else "LaunchTemplateName"
            found = self.ec2.describe_launch_template_versions(**{key: ref}, Versions=[version])[
                "LaunchTemplateVersions"
            ]
            self._templates[template] = dict(found[0].get("LaunchTemplateData", {})) if found else None
        return self._templates[template]

    def market_of(self, template: tuple[str, str]) -> CapacityType:
        """A launch template version's market (InstanceMarketOptions.MarketType): spot, capacity-block,
        else on-demand."""
        data = self._template_data(template)
        if data is None:
            return CapacityType.UNKNOWN
        return capacity_type_from_word(str(data.get("InstanceMarketOptions", {}).get("MarketType", "on-demand")))

    def reservation_of(self, template: tuple[str, str]) -> str | None:
        """The capacity reservation (a Capacity Block or an ODCR) a launch template version targets."""
        data = self._template_data(template) or {}
        target = data.get("CapacityReservationSpecification", {}).get("CapacityReservationTarget", {})
        return str(target["CapacityReservationId"]) if target.get("CapacityReservationId") else None

    def reservation_ends(self, reservation_ids: list[str]) -> dict[str, datetime]:
        """End dates of the reservations that have one (Capacity Blocks always do; open-ended ODCRs not)."""
        found = self.ec2.describe_capacity_reservations(CapacityReservationIds=reservation_ids)
        return {
            r["CapacityReservationId"]: r["EndDate"]
            for r in found.get("CapacityReservations", [])
            if r.get("EndDate") and r.get("State") in ("active", "scheduled", "payment-pending")
        }

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

    def health_issues(self, ref: GroupRef) -> list[IssueTypeDef]:
        """What EKS says is wrong with a managed node group (its health issues); other kinds have none."""
        if ref.kind is not GroupKind.EKS_NODEGROUP or not ref.cluster:
            return []
        resp = self.eks.describe_nodegroup(clusterName=ref.cluster, nodegroupName=ref.name)
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
