"""The policy's demand source is one of three, told apart by the policy's name for it (`SourceName`, the
one place the names are written): each source's model carries its name, the policy's keys are those
names, and `DemandSource.source` is the one that is set."""

from __future__ import annotations

import pytest

from gpufleet.domain.demand_sources import SourceName
from gpufleet.domain.kinds import kinds, traits
from gpufleet.policy.fleet import DemandSource, KubernetesDemand, MetricDemand, QueueDemand, SourceSpec

SPECS: list[SourceSpec] = [
    KubernetesDemand(),
    QueueDemand(queue_url="https://sqs.us-east-1.amazonaws.com/1/q"),
    MetricDemand(namespace="Slurm", metric_name="PendingGPUs"),
]


def test_the_policys_keys_are_the_source_names() -> None:
    keys = set(DemandSource.model_fields) - {"gpus_per_node", "order"}
    assert keys == set(SourceName)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_each_source_is_set_under_its_own_name_and_is_the_demands_source(spec: SourceSpec) -> None:
    demand = DemandSource.model_validate({spec.name: spec.model_dump()})
    assert demand.source == spec and demand.source.name is spec.name
    assert getattr(demand, spec.name) == spec


def test_every_kinds_sources_are_source_names() -> None:
    assert all(traits(k).demand_sources <= set(SourceName) for k in kinds())
