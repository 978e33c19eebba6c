"""The Slurm publisher on the HyperPod controller node (ami/slurm_pending_gpus.py) cannot import the
controller's layer: it repeats the names of the marks item and the drain reason's prefix. Here they must
agree with gpufleet.domain.defaults (a mismatch would drain or resume nothing); with the marks adapter
(aws.slurm_marks): tests/adapters/test_slurm_marks_names.py."""

from gpufleet.domain import defaults
from tests.unit.test_hyperpod_names import _script


def test_the_drain_reason_and_marks_key_names_are_the_controllers() -> None:
    script = _script()
    assert script.DRAIN_PREFIX == defaults.SLURM_DRAIN_REASON_PREFIX
    assert script.DRAINED_METRIC == defaults.HYPERPOD_DRAINED_METRIC
    assert script.MARKS_KEY_PREFIX == defaults.SLURM_MARKS_KEY_PREFIX
    assert script.drain_reason("x").startswith(defaults.SLURM_DRAIN_REASON_PREFIX)
