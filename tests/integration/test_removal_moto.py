"""Never remove a node that runs work (issue 40), through the real scaler on moto server and the loopback
Kubernetes API [emulated]: the rehearsal's removal scene (rehearsal/removal_scene.py), whose expected
outcomes each failed on the code before: a pod bound to the victim inside the tick (the cordon is no lock,
a CPU-only pod is work), a throttled terminate retried after a pod landed (the saved victims replayed), and
max lowered under three busy nodes (EKS chose which nodes went)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rehearsal.kube_api import KubeApi, kube_api
from rehearsal.removal_scene import RemovalScene

pytestmark = pytest.mark.integration
TOKEN = "gpufleet-rehearsal-token"


@pytest.fixture
def kube() -> Iterator[tuple[KubeApi, str]]:
    with kube_api(KubeApi(tokens={TOKEN})) as served:
        yield served


def test_no_node_that_runs_work_is_removed_and_each_keep_is_said(
    aws: str, kube: tuple[KubeApi, str], tmp_path: Path
) -> None:
    result = RemovalScene(tmp_path, kube, TOKEN, echo=lambda _: None).run()
    assert result.failures == []
    assert len(result.checks) == 3, result.checks
    assert any("the last look kept it, nothing terminated" in c for c in result.checks)
    assert any("decided again instead of replaying the saved victim" in c for c in result.checks)
    assert any("max lowered to 1 under 3 busy nodes: nothing removed" in c for c in result.checks)
    # The cost of the last look: one pod read of the cluster per change (not per victim). Five ticks read
    # the cluster once each; the two that remove a node (minutes 2 and 4) read it once more.
    pod_reads = [r for r in kube[0].requests if r["path"] == "/api/v1/pods"]
    assert len(pod_reads) == 5 + 2
