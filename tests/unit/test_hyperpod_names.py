"""The Slurm publisher on the HyperPod controller node (ami/slurm_pending_gpus.py) cannot import the
controller's layer: it repeats the names the controller reads. Here they must agree."""

import importlib.util
from pathlib import Path
from types import ModuleType

from gpufleet.domain import defaults

SCRIPT = Path(__file__).resolve().parents[2] / "ami" / "slurm_pending_gpus.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slurm_pending_gpus_names", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_idle_node_metric_and_namespace_are_the_controllers() -> None:
    script = _script()
    assert script.IDLE_METRIC == defaults.HYPERPOD_IDLE_METRIC
    parser = script._parser()
    assert parser.get_default("namespace") == defaults.HYPERPOD_IDLE_NAMESPACE
    assert parser.get_default("metric") == defaults.HYPERPOD_PENDING_METRIC
