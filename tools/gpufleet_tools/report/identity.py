"""Who a workload in a usage record is, by the node publisher's own model (gpufleet_node.workload), so
the report and the node can never disagree on a workload's key, team or label."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet_node.workload import KINDS, RECORDED, Workload
from gpufleet_tools.report.records import WORKLOAD_FIELDS, WorkloadId, WorkloadKind

# records.py (pure) cannot import the model: its copies of the recorded fields and kinds are held to it here.
assert ("kind", *RECORDED) == WORKLOAD_FIELDS, f"report.records.WORKLOAD_FIELDS is not ('kind', *{RECORDED})"
assert tuple(WorkloadKind) == KINDS, f"report.records.WorkloadKind is not {KINDS}"


def identify(doc: Mapping[str, Any]) -> WorkloadId:
    """A record's `w` entry (Workload.to_record()) as the report's WorkloadId."""
    workload = Workload.from_record(dict(doc))
    return WorkloadId(key=workload.key, team=workload.team, label=workload.label(), kind=WorkloadKind(workload.kind))
