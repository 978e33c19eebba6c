"""[simulated node] Whose work runs on the rehearsal's GPU nodes, for attribution and `gpufleet report`.

Every node of the scaled groups runs Kubernetes pods of two teams: team-a's trainer holds GPUs 0-1 (one
pod, 2 GPUs), team-b serves from GPUs 2 and 3 (two pods, 1 GPU each); their load is the scenario's, so the
scaling story is unchanged. One more node, a research box outside every managed group (RESEARCH_NODE: no
group, so no alarm or decision sees it), runs team-a's fine-tuning pod that requested 2 GPUs but only ever
uses GPU 0 (the waste the report is meant to find), a team-b notebook on GPU 2, and nothing on GPU 3.
The real publisher's real Attributor reads each process's owner from a /proc and /var/log tree written
here in the kernel's and the kubelet's formats (EKS nodes: cgroup v2 with the systemd driver; the others:
cgroupfs), and the kubelet's allocations come from an [emulated kubelet] (PodResources' answer, decoded).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from gpufleet_node import schema
from gpufleet_node.attribution import Attributor
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import ProcessUse, SimulatedBackend
from gpufleet_node.podresources import Allocations
from gpufleet_node.sender import LogSender, Sender
from gpufleet_node.tracker import UsageTracker
from gpufleet_node.workload import POD, Workload

IDLE_POD_GPU = 1  # the fine-tuning pod's second GPU: allocated, never used
FIRST_PID = 4100
RESEARCH_NODE = "i-0research0dev0001"
# (utilization %, memory %) of the research node's GPUs every minute
RESEARCH_LOAD = ((85.0, 60.0), (0.0, 0.0), (40.0, 30.0), (0.0, 0.0))
Pod = tuple[str, str, str]  # namespace, pod, container


class EmulatedKubelet:
    """[emulated kubelet] What PodResources List answers on one node."""

    def __init__(self, allocations: Allocations) -> None:
        self.allocations = allocations

    def current(self) -> Allocations:
        return self.allocations


def _uid(name: str) -> str:
    h = hashlib.sha256(name.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _container_id(name: str) -> str:
    return hashlib.sha256(("ctr" + name).encode()).hexdigest()


class UsageScene:
    def __init__(self, root: Path, logs: Any, sample_s: float) -> None:
        self.root = root
        self.logs = logs
        self.sample_s = sample_s
        self.idle_node: str | None = None
        self.pods: dict[str, list[Workload]] = {}  # per node: the pod holding each GPU
        logs.create_log_group(logGroupName=schema.USAGE_LOG_GROUP)  # what the stack creates

    def tracker(self, iid: str, identity: Identity, backend: SimulatedBackend, metrics: Sender) -> UsageTracker:
        suffix = iid[-5:]
        layout: list[Pod | None] = [
            ("team-a", f"train-{suffix}", "trainer"),
            ("team-a", f"train-{suffix}", "trainer"),
            ("team-b", f"serve-{suffix}-0", "server"),
            ("team-b", f"serve-{suffix}-1", "server"),
        ]
        if iid == RESEARCH_NODE:
            finetune = ("team-a", "finetune-llm", "trainer")
            layout = [finetune, finetune, ("team-b", "notebook-3", "jupyter"), None]
            self.idle_node = iid
        node = self.root / iid
        for gpu, pod in enumerate(layout):
            if pod is not None:
                write_pod_process(node, FIRST_PID + gpu, *pod, systemd=identity.cluster_name is not None)
        workloads = {gpu: Workload(POD, namespace=p[0], pod=p[1], container=p[2]) for gpu, p in enumerate(layout) if p}
        self.pods[iid] = [workloads.get(g) for g in range(len(layout))]  # type: ignore[misc]
        uuids = [backend.describe(g).uuid for g in range(backend.gpus)]
        kubelet = EmulatedKubelet(Allocations(by_device={uuids[g]: w for g, w in workloads.items()}))
        attributor = Attributor(proc_root=str(node / "proc"), log_root=str(node / "var" / "log"))
        logs = LogSender(self.logs, schema.USAGE_LOG_GROUP, iid)
        return UsageTracker(attributor, kubelet, uuids, logs, metrics, sample_s=self.sample_s)

    def load(self, iid: str, backend: SimulatedBackend) -> None:
        """After the scenario set each GPU's load: each GPU whose pod has its model loaded runs the pod's
        process; the fine-tuning pod's second GPU and the research node's free GPU run none."""
        for gpu in range(backend.gpus):
            v = backend.values[gpu]
            unused = iid == self.idle_node and gpu == IDLE_POD_GPU
            loaded = v.get("memory_percent", 0.0) > 5.0 and self.pods[iid][gpu] is not None and not unused
            memory = backend.memory_total_mib * v.get("memory_percent", 0.0) / 100.0
            procs = [ProcessUse(FIRST_PID + gpu, memory, v.get("utilization", 0.0))] if loaded else []
            backend.set_processes(gpu, procs)


def write_pod_process(node: Path, pid: int, ns: str, pod: str, container: str, systemd: bool) -> None:
    """/proc/PID/{cgroup,stat,status} under `node` and the kubelet's log folders under `node`/var/log, in
    their real formats (cgroup v2, the systemd driver as on EKS AL2023 or cgroupfs): a pod's process as the
    Attributor finds it. The rehearsal's nodes and the publisher benchmark use it."""
    uid, cid = _uid(f"{ns}/{pod}"), _container_id(f"{ns}/{pod}/{container}")
    if systemd:
        slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        cgroup = f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid}.scope\n"
    else:
        cgroup = f"0::/kubepods/burstable/pod{uid}/{cid}\n"
    proc = node / "proc" / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "cgroup").write_text(cgroup)
    start = 1000 + pid
    rest = f"S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 100"
    (proc / "stat").write_text(f"{pid} (python3 serve) {rest}\n")
    (proc / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    log = node / "var" / "log"
    (log / "pods" / f"{ns}_{pod}_{uid}" / container).mkdir(parents=True, exist_ok=True)
    (log / "containers").mkdir(parents=True, exist_ok=True)
    link = log / "containers" / f"{pod}_{ns}_{container}-{cid}.log"
    if not link.is_symlink():
        link.symlink_to(log / "pods" / f"{ns}_{pod}_{uid}" / container / "0.log")
