"""Node attribution at scale (issue 29): one kubelet answer matched to one sampling round with 5,000
time-sliced pods x 8 device ids, and the attribution cache with 10,000 live GPU processes.

`python -m bench.node_attribution` measures the node layer in this checkout; `--node-layer DIR` measures
another copy of layers/node (e.g. the code before the fix, for the before/after table in bench/README.md).
Wall seconds on this machine: never asserted (tests/node/test_attribution_scale.py counts the work).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPUS = [f"GPU-{i:08d}-0000-4000-8000-000000000000" for i in range(8)]


def kubelet_answer(pods: int) -> Any:
    """The shape of a ListPodResourcesResponse: pod i holds one time-slicing replica of each of 8 GPUs."""
    listed = []
    for i in range(pods):
        devices = [SimpleNamespace(resource_name="nvidia.com/gpu.shared", device_ids=[f"{g}::{i}" for g in GPUS])]
        listed.append(
            SimpleNamespace(name=f"job-{i}", namespace="ci", containers=[SimpleNamespace(name="main", devices=devices)])
        )
    return SimpleNamespace(pod_resources=listed)


def match_round(pods: int) -> tuple[float, float]:
    """Seconds for allocations_from (once per kubelet refresh) and one tracker round (every sample)."""
    from gpufleet_node.identity import Identity
    from gpufleet_node.nvml import ProcessUse
    from gpufleet_node.podresources import allocations_from
    from gpufleet_node.sender import Sender
    from gpufleet_node.tracker import UsageTracker
    from gpufleet_node.workload import POD, Workload

    class Owners:
        def workload_of(self, pid: int) -> Workload:
            return Workload(POD, namespace="ci", pod=f"job-{pid}")

        def unknown(self) -> dict[str, str]:
            return {}

    answer = kubelet_answer(pods)
    started = time.perf_counter()
    allocations = allocations_from(answer)
    listed = time.perf_counter() - started
    tracker = UsageTracker(
        Owners(), SimpleNamespace(current=lambda: allocations), GPUS, Sender(None), Sender(None), 300, 1.0
    )
    started = time.perf_counter()
    tracker.begin(datetime(2026, 11, 26, 10, 0, tzinfo=UTC), Identity("i-0", "us-east-1", "p5.48xlarge", asg_name="a"))
    for index in range(len(GPUS)):
        processes = [ProcessUse(pid, 100.0) for pid in range(index, pods, len(GPUS))]
        tracker.holders(index, SimpleNamespace(processes=processes))  # type: ignore[arg-type]
    return listed, time.perf_counter() - started


def cache_rounds(processes: int, rounds: int = 3) -> tuple[float, int]:
    """Seconds of the last of `rounds` sampling rounds over `processes` live processes in a /proc-shaped tree
    on disk, and how many of them were read from it in that round (cache misses)."""
    from gpufleet_node.attribution import Attributor

    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-proc-"))
    try:
        for pid in range(1, processes + 1):
            where = root / str(pid)
            where.mkdir()
            (where / "stat").write_text(f"{pid} (python3) S" + " 0" * 18 + " 4242 0 0\n")
            (where / "status").write_text("Uid:\t1000\t1000\t1000\t1000\n")
            (where / "cgroup").write_text(f"0::/system.slice/trainer@{pid}.service\n")
        attr = Attributor(str(root), str(root / "log"), user_name=lambda uid: "alice")
        misses = [0]
        read = attr._read

        def counted(pid: int, name: str) -> str:
            misses[0] += name == "cgroup"
            return read(pid, name)

        attr._read = counted  # type: ignore[method-assign]
        seconds = 0.0
        for _ in range(rounds):
            misses[0] = 0
            started = time.perf_counter()
            for pid in range(1, processes + 1):
                attr.workload_of(pid)
            seconds = time.perf_counter() - started
        return seconds, misses[0]
    finally:
        shutil.rmtree(root)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-layer", default=str(ROOT / "layers" / "node"))
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=10_000)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.node_layer))
    listed, matched = match_round(args.pods)
    seconds, misses = cache_rounds(args.processes)
    print(f"| layer | {args.node_layer} |\n|---|---|")
    print(f"| allocations_from, {args.pods:,} pods x 8 ids | {listed:.2f} s |")
    print(f"| one tracker round, {args.pods:,} pods on 8 time-sliced GPUs | {matched:.2f} s |")
    print(f"| steady-state round, {args.processes:,} live processes | {seconds:.2f} s, {misses:,} read from /proc |")


if __name__ == "__main__":
    main()
