"""Shared fixtures for the publisher tests; they run under Python 3.9 (AL2023) and 3.13."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "layers" / "node"))
sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the fake libnvidia-ml.so.1 from fake_nvml/fake_nvml.c (FAKE: not NVIDIA's library)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler: the fake libnvidia-ml.so.1 cannot be built here")
    out = tmp_path_factory.mktemp("fake-nvml")
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-o",
            str(out / "libnvidia-ml.so.1"),
            str(HERE / "fake_nvml" / "fake_nvml.c"),
            "-lpthread",
        ],
        check=True,
    )
    return out


@pytest.fixture
def node_env(fake_nvml_dir: Path):
    """Environment for a subprocess that must load the fake NVML through the official binding."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(fake_nvml_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1] / "layers" / "node"), str(HERE)])
    return env
