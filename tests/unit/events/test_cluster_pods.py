"""One cluster's listing as the scaler takes it: waiting GPU pods and GPU nodes together; and the one-line
error a cluster that cannot be read becomes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.kubernetes.pods import cluster_pods

PODS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "kubernetes" / "pods-pending-gpu.json").read_text()
)["items"]


def test_one_listing_answers_both_questions() -> None:
    found = cluster_pods("ml", iter(PODS), pages=1)  # a generator is read once, for both
    assert [p.key for p in found.waiting] == ["team-a/train-llm-0", "team-b/serve-7d9f-abcde"]
    assert found.gpu_nodes == {"ip-10-0-1-7.ec2.internal"}
    assert (found.cluster, found.pages) == ("ml", 1)


def test_unreadable_is_one_line_naming_the_cluster() -> None:
    err = ClusterUnreadable("ml", "HTTP 500\nInternal Server Error", "http")
    assert str(err) == "cannot read the pods of EKS cluster ml: HTTP 500 Internal Server Error"
    assert (err.cluster, err.kind) == ("ml", "http")
