"""A new group kind is one adapter, one traits row and one registration, and nothing else.

The kind here is a fake: a pool of GPU nodes kept in memory (no AWS API sizes it), so that nothing in the
runtime can know it. It is registered in the test only: its row in the traits table (`domain.kinds`) and
its adapter in the scaler's group registry. The real scaler then sizes it from an SQS queue on moto
server and removes its idle nodes by name, through the real executor (lease, intent, audit in DynamoDB).
The test imports no runtime module beyond the seam's own (kinds, the provider protocol) and the
composition root that builds the scaler.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import boto3
import pytest

from gpufleet.aws.groups.provider import GroupProvider, NotSupported
from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind, forget, new_kind, traits
from gpufleet.domain.models import Decision, GroupObservation, GroupRef, InstanceObservation
from gpufleet.domain.nodes import NodeShape
from gpufleet.policy.fleet import Discovery
from rehearsal import fleet
from tests.integration.conftest import NOW, TABLE, Fleet, decisions, tick

POOL_DIMENSION = "GpuPoolName"


@dataclass
class FakePool:
    """The fake kind's adapter: a pool of nodes in memory, grown by count and shrunk by named victims."""

    kind_word: GroupKind
    nodes: dict[str, list[str]] = field(default_factory=dict)  # pool name -> its instance ids
    calls: list[str] = field(default_factory=list)
    serial: int = 0
    taken: set[str] = field(default_factory=set)  # nodes a job took after the decision was made

    @property
    def kind(self) -> GroupKind:
        return self.kind_word

    def _observation(self, ref: GroupRef) -> GroupObservation:
        ids = self.nodes.setdefault(ref.name, [])
        return GroupObservation(
            ref=ref,
            min_size=0,
            max_size=8,
            desired=len(ids),
            instances=tuple(InstanceObservation(instance_id=i, instance_type="p5.48xlarge") for i in ids),
            instance_types=("p5.48xlarge",),
            tags={defaults.TAG_MANAGED: defaults.TAG_MANAGED_VALUE},  # gpufleet acts only on managed groups
        )

    def observe(
        self, discovery: Discovery, named: Sequence[GroupRef], attrition: Collection[str]
    ) -> list[GroupObservation]:
        return [self._observation(ref) for ref in named]

    def observe_one(self, ref: GroupRef) -> GroupObservation | None:
        return self._observation(ref)

    def every_group(self) -> list[GroupObservation]:
        return []

    def work_marks(
        self, observations: Sequence[GroupObservation], now: datetime, candidates: Mapping[str, Collection[str]] | None
    ) -> list[GroupObservation]:
        return list(observations)

    def prepare(self, obs: GroupObservation) -> None:
        self.calls.append(f"prepare {obs.ref.key}")

    def grow(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        ids = self.nodes[obs.ref.name]
        while len(ids) < decision.desired:
            self.serial += 1
            ids.append(f"i-pool{self.serial:013d}")
        self.calls.append(f"grow {obs.ref.key} to {decision.desired}")
        return f"pool {obs.ref.name} = {decision.desired}"

    def last_look(self, obs: GroupObservation, victims: Sequence[str]) -> dict[str, str]:
        """A pool node a job took since the decision says so (`taken`); the others may go."""
        self.calls.append(f"last look {obs.ref.key} at {', '.join(sorted(victims))}")
        return {v: "a job took it" for v in victims if v in self.taken}

    def shrink(self, decision: Decision, obs: GroupObservation, token: str) -> str:
        gone = [v for v in decision.victims if v in self.nodes[obs.ref.name]]
        self.nodes[obs.ref.name] = [i for i in self.nodes[obs.ref.name] if i not in gone]
        self.calls.append(f"shrink {obs.ref.key} by {', '.join(sorted(gone))}")
        return f"removed {', '.join(gone)}"

    def replace_failed(self, obs: GroupObservation, instance_id: str) -> str:
        raise NotSupported("a pool replaces its own nodes")

    def joined_cluster(self, obs: GroupObservation, named: str | None) -> tuple[str | None, str]:
        return None, "a pool joins no EKS cluster"

    def node_shape(
        self, obs: GroupObservation, overrides: Mapping[str, str] | None, tell: Callable[[str], None] | None
    ) -> NodeShape:
        raise NotSupported("a pool runs no pods")

    def gpus_per_node(self, obs: GroupObservation, type_gpus: Callable[[Sequence[str]], float | None]) -> float | None:
        return 8.0

    def metric_namespace(self, obs: GroupObservation, named: str) -> tuple[str | None, str]:
        return named, ""


@pytest.fixture
def pool_kind() -> Iterator[GroupKind]:
    """The fake kind's one traits row, registered for this test only."""
    row = new_kind(
        "gpu-pool",
        key_prefix="pool",
        label="GPU pool",
        in_cluster=False,
        cluster_dimension=None,
        name_dimension=POOL_DIMENSION,
        in_asg=False,
        replaced_by_asg=False,
        demand_sources=frozenset({"sqs", "metric"}),
        knows_gpus_per_node=True,
        own_cluster_pods=False,
        closes_own_nodes=False,
        discoverable=False,
        has_own_max=False,
        console_path="/ec2/home?region={region}#Instances:tag:pool={name}",
        console_title="GPU pool",
    )
    yield row.kind
    forget(row.kind)


def _jobs(queue_url: str, count: int) -> None:
    sqs = boto3.client("sqs")
    for i in range(count):
        sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"job": i}))


def _idle(gpu_fleet: Fleet, instance_ids: Sequence[str], at: datetime) -> None:
    for minute in range(5):
        for iid in instance_ids:
            gpu_fleet.put_instance_gpu(iid, 0, 1, at - timedelta(minutes=minute + 1))


def test_a_kind_registered_in_a_test_is_scaled_out_and_in_by_the_real_scaler(
    gpu_fleet: Fleet, pool_kind: GroupKind, tmp_path: Path
) -> None:
    queue_url = boto3.client("sqs").create_queue(QueueName="pool-jobs")["QueueUrl"]
    policy = (
        "discovery: {enabled: false}\n"
        "groups:\n"
        f"  - {{kind: gpu-pool, name: pool-a, min: 0, max: 4, scale_in_cooldown_s: 0,\n"
        f"     demand: {{sqs: {{queue_url: '{queue_url}', gpus_per_message: 8}}}}}}\n"
    )
    scaler = gpu_fleet.scaler(policy=policy)
    pool = FakePool(pool_kind)
    adapter: GroupProvider = pool
    scaler.ctx.fleet.groups.register(adapter)  # the one registration

    _jobs(queue_url, 3)
    (out,) = decisions(scaler.handle(tick("pool-1", NOW), NOW))
    assert (out["group"], out["action"], out["outcome"], out["desired"]) == ("pool:pool-a", "scale-out", "applied", 3)
    assert pool.calls == ["prepare pool:pool-a", "grow pool:pool-a to 3"]
    assert len(pool.nodes["pool-a"]) == 3

    fleet.drain(boto3.client("sqs"), queue_url)  # the jobs are done: the queue is empty
    later = NOW + timedelta(minutes=30)
    _idle(gpu_fleet, pool.nodes["pool-a"], later)
    pool.taken = {pool.nodes["pool-a"][0]}  # a job takes one node between the decision and the call
    ins = [d for d in decisions(scaler.handle(tick("pool-2", later), later)) if d["action"] == "scale-in"]
    assert ins, "the idle pool was not scaled in"
    (scale_in,) = ins
    assert scale_in["outcome"] == "applied" and scale_in["victims"], scale_in
    # The last look, then the change: the victims named, each checked right before the call.
    assert [c.split(" ")[0] + " " + c.split(" ")[1] for c in pool.calls[-3:]] == [
        "last look",
        "prepare pool:pool-a",
        "shrink pool:pool-a",
    ]
    assert set(scale_in["victims"]).isdisjoint(pool.nodes["pool-a"])  # each victim named, and removed
    assert pool.nodes["pool-a"] == sorted(pool.taken) and "last look kept 1 victim(s)" in scale_in["reason"]
    # Both changes went through the state table: the group's lease/intent item and its audited decisions.
    items = gpu_fleet.clients.dynamodb.scan(TableName=TABLE)["Items"]
    keys = {item["pk"]["S"] for item in items if "pool:pool-a" in item["pk"]["S"]}
    assert keys, "nothing of the pool's was stored"
    assert traits(pool_kind).console_title == "GPU pool"  # its row is what the notifier's links read


def test_the_fake_kind_is_gone_after_its_test() -> None:
    with pytest.raises(ValueError, match="not a group kind"):
        GroupKind("gpu-pool")
