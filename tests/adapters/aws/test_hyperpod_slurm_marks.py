"""HyperPod groups that consolidate by attrition: the observation carries the Slurm drains gpufleet asked
for (aws.slurm_marks), read once per cluster, only for such groups; an unreadable item gives no marks
channel (no drain decision) and is told once; GPUs held follow Slurm's idle report."""

from __future__ import annotations

from botocore.exceptions import ClientError

from gpufleet.aws.hyperpod import HyperPodFleet
from gpufleet.aws.slurm_marks import RequestedDrain, clean_reason
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import Demand, GroupRef, MarkChannel, NodeMark
from tests.adapters.aws.test_hyperpod import IDLE, NOW, REF, FakeCloudWatch, FakeSageMaker, _node

OTHER = GroupRef(kind=GroupKind.HYPERPOD, cluster="slurm-a", name="gpu-workers-2")
NODES = [_node("i-1", "Running"), _node("i-2", "Running"), _node("i-3", "Running", "gpu-workers-2")]


class FakeMarks:
    """The marker's read [fake]: the drains of each cluster, or a DynamoDB error."""

    def __init__(self, drains: dict[str, RequestedDrain] | None = None, error: str | None = None) -> None:
        self.drains = drains or {}
        self.error = error
        self.reads: list[str] = []

    def read(self, cluster: str) -> dict[str, RequestedDrain]:
        self.reads.append(cluster)
        if self.error:
            raise ClientError({"Error": {"Code": self.error, "Message": "no"}}, "GetItem")
        return self.drains


def _fleet(marks: FakeMarks, told: list[str], minutes: dict[str, list[float | None]] | None = None) -> HyperPodFleet:
    sm = FakeSageMaker(NODES)
    return HyperPodFleet(
        sm,
        FakeCloudWatch(minutes or {}),
        iam=sm,
        now=lambda: NOW,
        marker=marks,  # type: ignore[arg-type]
        warn=told.append,
    )


def test_attrition_groups_carry_gpufleets_drains_read_once_per_cluster() -> None:
    marks = FakeMarks({"i-1": RequestedDrain("attrition", NOW)})
    obs = {o.ref.key: o for o in _fleet(marks, []).observe([REF, OTHER], attrition={REF.key, OTHER.key})}
    assert marks.reads == ["slurm-a"]  # two groups, one cluster: one read
    assert obs[REF.key].marks is MarkChannel.SLURM and obs[OTHER.key].marks is MarkChannel.SLURM
    assert {i.instance_id: i.mark for i in obs[REF.key].instances} == {"i-1": NodeMark.GPUFLEET, "i-2": NodeMark.NONE}


def test_no_attrition_no_read_and_no_marks_channel() -> None:
    marks = FakeMarks({"i-1": RequestedDrain("attrition", NOW)})
    [obs] = _fleet(marks, []).observe([REF])
    assert marks.reads == [] and obs.marks is None
    assert all(i.mark is NodeMark.NONE for i in obs.instances)


def test_an_unreadable_item_gives_no_marks_channel_told_once_until_it_reads_again() -> None:
    told: list[str] = []
    marks = FakeMarks(error="ProvisionedThroughputExceededException")
    fleet = _fleet(marks, told)
    for _ in range(2):
        [obs] = fleet.observe([REF], attrition={REF.key})
        assert obs.marks is None and all(i.mark is NodeMark.NONE for i in obs.instances)
    assert len(told) == 1 and "ProvisionedThroughputExceededException" in told[0]
    marks.error = None
    [obs] = fleet.observe([REF], attrition={REF.key})
    assert obs.marks is MarkChannel.SLURM
    marks.error = "AccessDeniedException"
    fleet.observe([REF], attrition={REF.key})
    assert len(told) == 2  # a new stretch of failures is told again


def test_gpus_held_follow_slurms_idle_report() -> None:
    """Slurm says idle or not, never a partial allocation: an idle node holds 0, a busy one every GPU."""
    fleet = _fleet(FakeMarks(), [], minutes={"i-1": IDLE, "i-2": [1.0, 1.0, 1.0, 1.0, None]})
    [obs] = fleet.observe([REF], attrition={REF.key})
    obs = obs.model_copy(update={"demand": Demand(source="metric Slurm/PendingGPUs", gpus_per_node=8)})
    [marked] = fleet.marked([obs], NOW)
    assert {i.instance_id: i.gpus_held for i in marked.instances} == {"i-1": 0.0, "i-2": 8.0}


def test_gpus_held_unknown_when_the_report_is_unreadable() -> None:
    fleet = _fleet(FakeMarks(), [])
    fleet.cloudwatch = FakeCloudWatch({}, error="Throttling")
    [marked] = fleet.marked(fleet.observe([REF]), NOW)
    assert marked.scale_in_closed and all(i.gpus_held is None for i in marked.instances)


def test_a_reason_is_one_short_printable_line() -> None:
    assert clean_reason("emptiest\nnode\t(0 of 8 GPUs)") == "emptiest node (0 of 8 GPUs)"
    assert len(clean_reason("x" * 500)) == 120 and clean_reason("\n") == "consolidation by attrition"
