"""What an instance said about its own GPUs: the fault counters it wrote into its own namespace
(gpufleet_node.schema.node_namespace, "GPUFleet/Node/ROLEID:i-..."), which the node policy lets only that
instance's credentials write. Read only for a replacement candidate, so the guard's screening costs what
it did: one ListMetrics and one GetMetricData per candidate instance.

Found by listing the instance's metrics in every namespace (ListMetrics filtered by its InstanceId, no
namespace filter: the role id in the namespace is the node's to know, not the guard's), then kept only
where the namespace is exactly "GPUFleet/Node/<id>:<that instance id>". ListMetrics can take up to 15
minutes to show a new metric (CloudWatch API reference, ListMetrics), so a fault not listed yet holds
the replacement; the guard looks again each run while the finding lasts.

Why not EC2 status checks (DescribeInstanceStatus): they test the host's reachability and the instance's
OS and network, not its GPUs. A GPU that fell off the bus (XID 79) or reports uncontained ECC errors
leaves both checks "ok", so they can neither confirm a GPU fault nor refute one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpufleet.aws.metrics import GpuMetricsReader, SeriesQuery
from gpufleet.domain import defaults
from gpufleet.guard.core import (
    GpuRef,
    HealthCounts,
    HealthFinding,
    Replacement,
    corroborated,
    hold_unconfirmed,
)
from gpufleet.policy.guard import HealthSettings
from gpufleet_node import schema

FIELDS = {  # the Fault dimension (the shared counter's name) -> HealthCounts field
    schema.GPU_XID_ERRORS.name: "xid_errors",
    schema.GPU_ECC_DOUBLE_BIT.name: "ecc_double_bit",
    schema.GPU_REMAPPED_ROWS_UNCORRECTABLE.name: "remapped_uncorrectable",
    schema.GPU_LOST.name: "lost",
}


UNREAD = "could not read the instance's own namespace to confirm the GPU fault: not replacing; checked again next run"


def corroborate(
    cloudwatch: Any, group: str, candidates: list[HealthFinding], now: datetime, health: HealthSettings, logger: Any
) -> tuple[list[HealthFinding], list[Replacement]]:
    """The candidates whose instance confirmed the fault in its own namespace, and a held replacement for
    each other instance (why in its reason). Read only when there is a replacement to make."""
    if not health.replace_unhealthy or not candidates:
        return candidates, []
    ids = {h.gpu.instance_id for h in candidates}
    since = now - timedelta(minutes=health.lookback_minutes)
    try:
        own = OwnNamespaceReader(cloudwatch).counts(group, ids, since, now)
    except Exception:  # nothing replaced on an unread confirmation; the next run reads it again
        logger.exception("reading the instances' own namespaces failed", extra={"group": group})
        return hold_unconfirmed(candidates, set(), dict.fromkeys(ids, UNREAD))
    return hold_unconfirmed(candidates, corroborated(candidates, own, health))


@dataclass
class OwnNamespaceReader:
    cloudwatch: Any
    period_s: int = 60

    def counts(
        self, group: str, instance_ids: Iterable[str], since: datetime, now: datetime
    ) -> dict[str, list[HealthCounts]]:
        """Per instance, its own GPU fault counters summed from `since`; an instance with nothing in its
        own namespace is absent."""
        found = [(iid, m) for iid in sorted(set(instance_ids)) for m in self._own_metrics(iid)]
        queries = [
            SeriesQuery(
                str(i),
                schema.GPU_FAULT_REPORTED,
                tuple((d["Name"], d["Value"]) for d in m["Dimensions"]),
                "Sum",
                namespace=m["Namespace"],
            )
            for i, (_, m) in enumerate(found)
        ]
        points = GpuMetricsReader(self.cloudwatch, self.period_s).fetch_points(queries, since, now)
        sums: dict[tuple[str, int], dict[str, float]] = {}
        for i, (iid, metric) in enumerate(found):
            dims = _dims(metric)
            total = sum(v for t, v in points[str(i)] if t >= since)
            slot = sums.setdefault((iid, int(dims[schema.DIM_GPU_INDEX])), {})
            field = FIELDS[dims[schema.DIM_FAULT]]
            slot[field] = slot.get(field, 0.0) + total
        out: dict[str, list[HealthCounts]] = {}
        for (iid, gpu), values in sorted(sums.items()):
            ref = GpuRef(group=group, instance_id=iid, gpu_index=gpu)
            out.setdefault(iid, []).append(HealthCounts(gpu=ref, **values))
        return out

    def _own_metrics(self, instance_id: str) -> list[dict[str, Any]]:
        """The instance's GPU fault series in its own namespace, at most LIST_METRICS_MAX_PAGES pages."""
        kwargs: dict[str, Any] = {
            "Dimensions": [{"Name": schema.DIM_INSTANCE_ID, "Value": instance_id}],
            "RecentlyActive": "PT3H",
        }
        out = []
        for _ in range(defaults.LIST_METRICS_MAX_PAGES):
            page = self.cloudwatch.list_metrics(**kwargs)
            for m in page.get("Metrics", []):
                dims = _dims(m)
                if (
                    schema.namespace_instance(m.get("Namespace", "")) == instance_id
                    and m.get("MetricName") == schema.GPU_FAULT_REPORTED.name
                    and set(dims) == set(schema.WITNESS_DIMENSIONS)
                    and dims[schema.DIM_FAULT] in FIELDS
                    and dims[schema.DIM_INSTANCE_ID] == instance_id
                    and dims[schema.DIM_GPU_INDEX].isdigit()
                ):
                    out.append(
                        {"Namespace": m["Namespace"], "MetricName": m["MetricName"], "Dimensions": m["Dimensions"]}
                    )
            token = page.get("NextToken")
            if not token or token == kwargs.get("NextToken"):
                break
            kwargs["NextToken"] = token
        return out


def _dims(metric: dict[str, Any]) -> dict[str, str]:
    return {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
