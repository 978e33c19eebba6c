"""A slow queued-jobs listing makes that system unreadable, never the cluster: the pods read stay.

The defect it reproduced: one slow answer on a queued-jobs listing (Kueue's conversion webhook for v1beta1
when v1beta2 is the storage version and the kueue controller is slow/down; a huge Workload listing: Kueue
keeps finished Workloads, each with its full pod templates) raises HttpProblem('timeout') out of
QueuedReader (kubernetes/queued_reader.py `_lists` re-raises timeouts on purpose) and the WHOLE cluster read
fails: the pods, already read fine, are thrown away and every group of the cluster gets no demand. `queued`
is on by default ([kueue, volcano]), so an existing pods-only user who upgrades is exposed. Correct: the
system is `queued_unreadable`, the pods stay good (as for every other failure, and as the module docstring
says for the pods). (Found by the independent review of issue 32, queued jobs and gangs: reproduced on the
first version, passing since its fix.)"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime

import boto3
import pytest
from pydantic import SecretStr

from gpufleet.domain.models import QueuedSource
from gpufleet.kubernetes.cluster import PodReader
from gpufleet.settings import KubeEndpoint
from rehearsal.kube_api import KubeApi, kube_api, pod
from rehearsal.volcano_objects import SCHEDULING, podgroup

TOKEN = "gpufleet-local-token"
NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[KubeApi, str]]:
    with kube_api(KubeApi(tokens={TOKEN})) as found:
        yield found


def _reader(url: str) -> PodReader:
    s = boto3.Session(aws_access_key_id="t", aws_secret_access_key="t", region_name="us-east-1")
    return PodReader(s.client("eks"), s, {"ml": KubeEndpoint(url=url, token=SecretStr(TOKEN))}, timeout_s=0.5)


def test_a_slow_podgroups_listing_leaves_the_pods_read(server) -> None:
    api, url = server
    api.install(SCHEDULING, "podgroups")
    api.add_object("podgroups", podgroup("pg", "ml", min_member=2, min_resources={"nvidia.com/gpu": "16"}))
    api.add(pod("infer-0", "ml", gpus=1))
    api.requests.clear()
    _reader(url).read("ml", queued=(QueuedSource.VOLCANO,), now=NOW)
    before = next(i for i, r in enumerate(api.requests) if r["path"].endswith("/podgroups"))
    api.script = deque(["ok"] * before + ["delay:1.5"])
    found = _reader(url).read("ml", queued=(QueuedSource.VOLCANO,), now=NOW)  # raises ClusterUnreadable today
    assert [p.name for p in found.waiting] == ["infer-0"]
    assert found.queued_unreadable, "the slow system must be named unreadable"
