"""The Slurm publisher on the HyperPod controller node (ami/slurm_pending_gpus.py) cannot import the
controller's layer: it repeats the names of the marks item. Here they must agree with aws.slurm_marks (a
mismatch would drain or resume nothing); with gpufleet.domain.defaults: tests/unit/test_slurm_marks_names.py."""

from gpufleet.aws import slurm_marks
from tests.unit.test_hyperpod_names import _script


def test_the_marks_item_names_are_the_controllers() -> None:
    script = _script()
    assert script.MARKS_SK == slurm_marks.MARKS_SK
    assert script.MARKS_NODE_PREFIX == slurm_marks.NODE_ATTR_PREFIX
    key = slurm_marks.marks_key("ml-cluster")
    assert key == {"pk": {"S": script.MARKS_KEY_PREFIX + "ml-cluster"}, "sk": {"S": script.MARKS_SK}}
