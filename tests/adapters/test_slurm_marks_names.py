"""The Slurm publisher on the HyperPod controller node (ami/slurm_pending_gpus.py) cannot import the
controller's layer: it repeats the names of the marks item and the drain reason's prefix. Here they must
agree with gpufleet.domain.defaults and aws.slurm_marks (a mismatch would drain or resume nothing)."""

from gpufleet.aws import slurm_marks
from gpufleet.domain import defaults
from tests.unit.test_hyperpod_names import _script


def test_the_marks_item_and_reason_names_are_the_controllers() -> None:
    script = _script()
    assert script.DRAIN_PREFIX == defaults.SLURM_DRAIN_REASON_PREFIX
    assert script.DRAINED_METRIC == defaults.HYPERPOD_DRAINED_METRIC
    assert script.MARKS_KEY_PREFIX == defaults.SLURM_MARKS_KEY_PREFIX
    assert script.MARKS_SK == slurm_marks.MARKS_SK
    assert script.MARKS_NODE_PREFIX == slurm_marks.NODE_ATTR_PREFIX
    key = slurm_marks.marks_key("ml-cluster")
    assert key == {"pk": {"S": script.MARKS_KEY_PREFIX + "ml-cluster"}, "sk": {"S": script.MARKS_SK}}
    assert script.drain_reason("x").startswith(defaults.SLURM_DRAIN_REASON_PREFIX)
