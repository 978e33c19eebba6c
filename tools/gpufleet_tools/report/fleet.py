"""Which nodes existed, and when: what vouches for a record's node id (`gpufleet report --verify-nodes`).
Pure: the AWS answers in (`gpufleet report --verify-nodes`, cli/report.py, reads them), a verdict per record out.

A node's role may write a stream named after any id (report.bounds), so without this a node can invent
ids, each billed up to what one node of its claimed type holds. What can vouch for an instance id:
- EC2 DescribeInstances: every instance not terminated, and a terminated one for about an hour after.
  Its type, and when it was first launched: the primary network interface's AttachTime (LaunchTime is the
  last start: a stopped and started instance ran before it);
- Auto Scaling DescribeScalingActivities, every group (EKS managed node groups are groups too), deleted
  ones included: six weeks of "Launching a new EC2 instance: i-..." and "Terminating EC2 instance: i-...",
  with their times;
- SageMaker ListClusterNodes, per HyperPod cluster: the cluster's nodes now, with type and LaunchTime
  (HyperPod instances are in a service account, not in the caller's EC2).
A record counts only if one of them knows its node and the node ran during its window; when EC2 or
HyperPod knows the node's type, the record must name that type. Everything
else is flagged (FlagKind.NODE), never summed. What they cannot vouch for: docs/report.md, "What a
record is trusted with".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpufleet_tools.report.bounds import Verdict
from gpufleet_tools.report.model import FlagKind, NodeCheck
from gpufleet_tools.report.model import NodeSource as Source
from gpufleet_tools.report.records import UsageRecord

_ACTIVITY = re.compile(
    r"^(?P<what>Launching a new EC2 instance|Terminating EC2 instance)(?: into warm pool| from warm pool)?: "
    r"(?P<id>i-[0-9a-f]{8,17})\b"
)
_STOPPED_AT = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")  # "User initiated (... GMT)"


@dataclass
class NodeLife:
    """What is known of one instance: it ran from `first` (None: since before anything says) to `last`
    (None: it still runs, or nothing says it ended), as `instance_type` (None: not said)."""

    node: str
    first: int | None = None
    last: int | None = None
    instance_type: str | None = None
    sources: set[Source] = field(default_factory=set)
    ended: bool = False  # something says it ended (`last` then holds when)

    def began(self, at: int, source: Source) -> None:
        self.first = at if self.first is None else min(self.first, at)
        self.sources.add(source)

    def end(self, at: int, source: Source) -> None:
        self.last, self.ended = (at if not self.ended or self.last is None else max(self.last, at)), True
        self.sources.add(source)

    def running(self, start: int, end: int) -> bool:
        """Whether the window [start, end) holds any of its life. No slack: a launch is known before the
        instance boots and an end after it stopped, and instances keep time by the Amazon Time Sync
        Service; a node's first window starts on its grid before the node booted, and holds its launch."""
        if self.first is not None and end <= self.first:
            return False
        return not (self.ended and self.last is not None and start >= self.last)

    def describe(self) -> str:
        began = _when(self.first) if self.first is not None else "before anything known"
        ended = _when(self.last) if self.ended and self.last is not None else "still running"
        return f"known {began} .. {ended} ({', '.join(sorted(self.sources))})"


def _when(epoch: int) -> str:
    return f"{datetime.fromtimestamp(epoch, UTC):%Y-%m-%d %H:%M}"


def _stopped_at(inst: Mapping[str, Any]) -> int | None:
    """When EC2 says a terminated instance stopped: StateTransitionReason "User initiated (... GMT)"."""
    found = _STOPPED_AT.search(str(inst.get("StateTransitionReason", "")))
    if found is None:
        return None
    return int(datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp())


def _epoch(value: Any) -> int | None:
    if isinstance(value, datetime):
        return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())
    return None


class KnownNodes:
    """Instance ids with their lives, from the sources' answers (`add_*`), and the verdict on a record."""

    def __init__(self, asked: datetime) -> None:
        self.asked = asked
        self.lives: dict[str, NodeLife] = {}
        self.sources: list[Source] = []

    def _life(self, node: str) -> NodeLife:
        life = self.lives.get(node)
        if life is None:
            life = self.lives[node] = NodeLife(node)
        return life

    def add_instances(self, reservations: Iterable[Mapping[str, Any]]) -> None:
        """DescribeInstances' Reservations."""
        self.sources.append(Source.EC2)
        for reservation in reservations:
            for inst in reservation.get("Instances", ()):
                life = self._life(str(inst.get("InstanceId")))
                life.instance_type = inst.get("InstanceType") or life.instance_type
                starts = [_epoch(inst.get("LaunchTime"))]
                starts += [
                    _epoch((eni.get("Attachment") or {}).get("AttachTime"))
                    for eni in inst.get("NetworkInterfaces", ())
                    if (eni.get("Attachment") or {}).get("DeviceIndex") == 0
                ]
                for at in starts:
                    if at is not None:
                        life.began(at, Source.EC2)
                life.sources.add(Source.EC2)
                if (inst.get("State") or {}).get("Name") in ("shutting-down", "terminated"):
                    life.end(_stopped_at(inst) or int(self.asked.timestamp()), Source.EC2)

    def add_activities(self, activities: Iterable[Mapping[str, Any]]) -> None:
        """DescribeScalingActivities' Activities: the launches and terminations that name an instance."""
        self.sources.append(Source.ASG)
        for activity in activities:
            found = _ACTIVITY.match(str(activity.get("Description", "")))
            if found is None:
                continue
            life = self._life(found.group("id"))
            began, ended = _epoch(activity.get("StartTime")), _epoch(activity.get("EndTime"))
            if found.group("what").startswith("Launching"):
                if began is not None:
                    life.began(began, Source.ASG)
                life.sources.add(Source.ASG)
            elif activity.get("StatusCode") == "Successful" and (ended or began) is not None:
                life.end(ended or began or 0, Source.ASG)
            else:
                life.sources.add(Source.ASG)  # terminating now: it ran until at least now

    def add_cluster_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """ListClusterNodes' ClusterNodeSummaries, of every HyperPod cluster."""
        if Source.HYPERPOD not in self.sources:
            self.sources.append(Source.HYPERPOD)
        for node in nodes:
            life = self._life(str(node.get("InstanceId")))
            life.instance_type = node.get("InstanceType") or life.instance_type
            at = _epoch(node.get("LaunchTime"))
            if at is not None:
                life.began(at, Source.HYPERPOD)
            life.sources.add(Source.HYPERPOD)

    @property
    def check(self) -> NodeCheck:
        return NodeCheck(tuple(self.sources), len(self.lives), self.asked)

    def verdict(self, r: UsageRecord, claim: float) -> Verdict | None:
        """None: a known node, running then, of the type it says; else why not (FlagKind.NODE)."""
        life = self.lives.get(r.node)
        if life is None:
            said = ", ".join(self.sources) or "no source"
            return Verdict(FlagKind.NODE, f"no instance {r.node} is known to {said}", claim, 0.0)
        if not life.running(r.start, r.start + r.seconds):
            return Verdict(FlagKind.NODE, f"{r.node} was not running then: {life.describe()}", claim, 0.0)
        if life.instance_type is not None and life.instance_type != r.instance_type:
            detail = f"{r.node} is a {life.instance_type} ({', '.join(sorted(life.sources))}), not a {r.instance_type}"
            return Verdict(FlagKind.NODE, detail, claim, 0.0)
        return None
