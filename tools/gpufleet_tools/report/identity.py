"""Who a workload in a usage record is, by the node publisher's own model (gpufleet_node.workload), so
the report and the node can never disagree on a workload's key, team or label."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from gpufleet_node.workload import KINDS, RECORDED, SLURM, Workload
from gpufleet_tools.report.records import PAYER_FIELDS, WORKLOAD_FIELDS, WorkloadId, WorkloadKind

# records.py (pure) cannot import the model: its copies of the recorded fields and kinds are held to it here.
assert ("kind", *RECORDED) == WORKLOAD_FIELDS, f"report.records.WORKLOAD_FIELDS is not ('kind', *{RECORDED})"
assert tuple(WorkloadKind) == KINDS, f"report.records.WorkloadKind is not {KINDS}"
assert set(PAYER_FIELDS) <= set(RECORDED), f"report.records.PAYER_FIELDS are not all in {RECORDED}"


BY = ("team", "account", "partition")  # what `gpufleet report --by` sums the team table by


def identify(doc: Mapping[str, Any], by: str = "team") -> WorkloadId:
    """A record's `w` entry (Workload.to_record()) as the report's WorkloadId. `by` account or partition:
    a Slurm job is charged to its Slurm account or partition ("(no account)" when the node could not ask
    squeue); other workloads (pods, units, users) keep their team, since they have neither."""
    workload = Workload.from_record(dict(doc))
    team = workload.team
    if by != "team" and workload.kind == SLURM:
        team = getattr(workload, by) or f"(no {by})"
    line = json.dumps([workload.key, *(getattr(workload, f) for f in PAYER_FIELDS)])  # no separator to forge
    kind = WorkloadKind(workload.kind)
    return WorkloadId(key=workload.key, team=team, label=workload.label(), kind=kind, line=line)


def identify_by(by: str) -> Callable[[Mapping[str, Any]], WorkloadId]:
    if by not in BY:
        raise ValueError(f"--by is one of {', '.join(BY)} (got {by!r})")
    return lambda doc: identify(doc, by)
