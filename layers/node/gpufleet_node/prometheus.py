"""The node's Prometheus endpoint: the publisher's latest GPU samples, ready to scrape. Off by default.

Teams that already run Prometheus, Amazon Managed Prometheus or Grafana want the GPUs there too, without
running dcgm-exporter (and DCGM) next to the publisher. So every series comes twice where NVML has the
field: under gpufleet's own names (one series per GPU, base units, snake_case labels) and under
dcgm-exporter's names and labels, so NVIDIA's Grafana dashboard 12239 and OpenCost's GPU queries work
unchanged. `FIELDS` below is the one table of both.

dcgm-exporter's labels are copied as its releases write them (4.x, up to 4.5.3-4.8.2): `gpu`, `UUID`,
`device`, `modelName`, `Hostname`, and `pod`/`namespace`/`container` (or `hpc_job` for a Slurm job) only
when the GPU is attributed. A GPU held by several pods gives one series per pod, as dcgm-exporter does
for time-sliced GPUs; there GPU_UTIL and FB_USED are each pod's own processes' share when NVML reports it,
next to one device-level series. A GPU nobody holds has no pod labels at all (not empty ones).

Nothing here reads NVML: `views` hands over what the publisher sampled last. A GPU whose rendering fails
is left out of that scrape and counted; the endpoint itself never fails a scrape. The HTTP side is
scrape_server.py: bounded, so scrapers cannot take the publisher's file descriptors or CPU. Python >= 3.9.
"""

import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from gpufleet_node.nvml import GpuSample
from gpufleet_node.scrape_server import BoundedServer, Limits, Renderer
from gpufleet_node.workload import POD, SLURM, Workload

if TYPE_CHECKING:  # only the attributes are read; usage.py stays a soft dependency
    from gpufleet_node.usage import Holder

log = logging.getLogger("gpufleet.publisher")

MIB = 1024 * 1024
MHZ = 1e6
LOG_EVERY = 100  # a failing view or GPU is logged on its 1st, 101st, ... failure, not every scrape


class GpuView:
    """One GPU as the endpoint shows it: the latest sample and who holds the GPU.

    `last_xid` is the last XID code seen (0 = none yet), as dcgm-exporter's DCGM_FI_DEV_XID_ERRORS.
    `workloads` are the pods or jobs on or allocated to the GPU (empty: nobody). `holders`, when given,
    are usage.py's per-workload sums (memory, SM share); `workloads` defaults to their workloads."""

    __slots__ = ("holders", "index", "last_xid", "model_name", "pci_bus_id", "sample", "uuid", "workloads")

    def __init__(
        self,
        index: int,
        uuid: str,
        model_name: str,
        sample: GpuSample,
        last_xid: int = 0,
        workloads: Sequence[Workload] = (),
        holders: Optional[Sequence["Holder"]] = None,
        pci_bus_id: Optional[str] = None,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.model_name = model_name
        self.sample = sample
        self.last_xid = last_xid
        self.holders = holders
        self.workloads: Sequence[Workload] = list(workloads) if workloads else [h.workload for h in holders or ()]
        self.pci_bus_id = pci_bus_id


class Family:
    """One metric family: its exposed name, help text and type ("gauge", "counter" or "info")."""

    __slots__ = ("help", "kind", "name")

    def __init__(self, name: str, doc: str, kind: str = "gauge") -> None:
        self.name = name
        self.help = doc
        self.kind = kind

    @property
    def sample_name(self) -> str:
        """The name each sample carries: counters end in _total, info families in _info."""
        return self.name + {"counter": "_total", "info": "_info"}.get(self.kind, "")


class Field:
    """One GPU value and the names it goes out under: gpufleet's (times `scale`, to base units) and, where
    dcgm-exporter has it, dcgm-exporter's (as read: its units are NVML's). `own` reads one holder's part of it (a pod's
    processes on a shared GPU); None: every pod's series carries the device value."""

    __slots__ = ("dcgm", "gpufleet", "own", "read", "scale")

    def __init__(
        self,
        read: Callable[[GpuView], Optional[float]],
        gpufleet: Optional[Family],
        scale: float = 1.0,
        dcgm: Optional[Family] = None,
        own: Optional[Callable[[GpuView, "Holder"], Optional[float]]] = None,
    ) -> None:
        self.read = read
        self.gpufleet = gpufleet
        self.scale = scale
        self.dcgm = dcgm
        self.own = own


def _sample(name: str) -> Callable[[GpuView], Optional[float]]:
    return lambda view: getattr(view.sample, name, None)


def _reserved_mib(view: GpuView) -> Optional[float]:
    s = view.sample
    if s.memory_total_mib is None or s.memory_used_mib is None or s.memory_free_mib is None:
        return None
    return max(0.0, s.memory_total_mib - s.memory_used_mib - s.memory_free_mib)


def _engine_active(view: GpuView) -> Optional[float]:
    util = view.sample.utilization
    return None if util is None else util / 100.0


def _own_memory_mib(view: GpuView, holder: "Holder") -> Optional[float]:
    return holder.memory_mib if view.sample.processes is not None else None


def _own_sm_util(view: GpuView, holder: "Holder") -> Optional[float]:
    if holder.sm_util is not None:
        return holder.sm_util
    return 0.0 if holder.processes == 0 and view.sample.processes is not None else None


ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"

# The one table: GpuSample field -> gpufleet name (base units) and dcgm-exporter name (its units).
FIELDS: Tuple[Field, ...] = (
    Field(
        _sample("utilization"),
        Family("gpufleet_gpu_utilization_percent", "Percent of the last sample period in which a kernel ran (NVML)."),
        dcgm=Family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
        own=_own_sm_util,
    ),
    Field(
        _sample("mem_controller_busy"),
        Family(
            "gpufleet_gpu_memory_controller_busy_percent",
            "Percent of the last sample period memory was read or written.",
        ),
        dcgm=Family("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory (copy engine) utilization (in %)."),
    ),
    Field(
        _sample("memory_used_mib"),
        Family("gpufleet_gpu_memory_used_bytes", "GPU memory used by processes, driver reservations excluded."),
        scale=MIB,
        dcgm=Family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
        own=_own_memory_mib,
    ),
    Field(
        _sample("memory_free_mib"),
        Family("gpufleet_gpu_memory_free_bytes", "GPU memory free."),
        scale=MIB,
        dcgm=Family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ),
    Field(
        _sample("memory_total_mib"),
        Family("gpufleet_gpu_memory_total_bytes", "GPU memory in total."),
        scale=MIB,
    ),
    Field(
        _reserved_mib,
        None,
        dcgm=Family("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved by the driver (in MiB)."),
    ),
    Field(
        _sample("power_w"),
        Family("gpufleet_gpu_power_watts", "Power draw."),
        dcgm=Family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ),
    Field(_sample("power_limit_w"), Family("gpufleet_gpu_power_limit_watts", "Enforced power limit.")),
    Field(
        _sample("temperature_c"),
        Family("gpufleet_gpu_temperature_celsius", "GPU die temperature."),
        dcgm=Family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ),
    Field(
        _sample("memory_temperature_c"),
        Family("gpufleet_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature."),
        dcgm=Family("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
    ),
    Field(
        _sample("sm_clock_mhz"),
        Family("gpufleet_gpu_sm_clock_hertz", "SM clock frequency."),
        scale=MHZ,
        dcgm=Family("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    ),
    Field(
        _sample("throttle_reasons"),
        Family(
            "gpufleet_gpu_clock_event_reasons",
            "Bitmask of NVML clock event (throttle) reasons: 0x4 power cap, 0x8 HW slowdown, 0x20 SW thermal, "
            "0x40 HW thermal, 0x80 power brake.",
        ),
    ),
    Field(_sample("process_count"), Family("gpufleet_gpu_processes", "Compute processes on the GPU.")),
    Field(
        _sample("ecc_double_bit_total"),
        Family(
            "gpufleet_gpu_ecc_double_bit_errors",
            "Uncorrected (double-bit) ECC errors since the driver loaded.",
            "counter",
        ),
    ),
    Field(
        _sample("remapped_uncorrectable_total"),
        Family(
            "gpufleet_gpu_remapped_rows_uncorrectable", "Memory rows remapped after uncorrectable errors.", "counter"
        ),
        # dcgm-exporter types it counter; a gauge keeps the name exact (a counter's samples must end in _total).
        dcgm=Family("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of rows remapped for uncorrectable errors."),
    ),
    Field(
        lambda view: view.last_xid,
        Family("gpufleet_gpu_last_xid", "Code of the last XID error seen on the GPU (0: none since start)."),
        dcgm=Family("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error seen."),
    ),
    Field(
        _engine_active,
        None,
        dcgm=Family(
            ENGINE_ACTIVE,
            "Ratio of time the graphics/compute engine was active. From NVML utilization / 100 (kernel time), "
            "not DCGM profiling.",
        ),
    ),
)

LOST = Family("gpufleet_gpu_lost", "1 when the GPU fell off the bus (NVML GpuIsLost); its other series stop.")
WORKLOADS = Family("gpufleet_gpu_workloads", "Pods or jobs holding the GPU (allocated to it or running on it).")
WORKLOAD_INFO = Family(
    "gpufleet_gpu_workload", "A pod or job holding the GPU; share of the GPU = 1 / gpufleet_gpu_workloads.", "info"
)
WORKLOAD_MEMORY = Family(
    "gpufleet_gpu_workload_memory_bytes", "GPU memory used by the workload's processes on the GPU."
)
WORKLOAD_SM = Family(
    "gpufleet_gpu_workload_sm_utilization_percent", "SM utilization of the workload's processes on the GPU (NVML)."
)
ERRORS = Family(
    "gpufleet_prometheus_collect_errors",
    "Scrapes that left a GPU, or every GPU, out because rendering failed.",
    "counter",
)

Labels = Dict[str, str]
Row = Tuple[Family, Labels, float]


def _num(value: object) -> Optional[float]:
    """A finite float, or None: a value that is missing or not a number is simply not emitted."""
    if value is None:
        return None
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def workload_labels(w: Workload) -> Labels:
    """gpufleet's labels of a workload; only those that are known (`slurm_job`: `job` is Prometheus's own)."""
    pairs = (
        ("kind", w.kind),
        ("namespace", w.namespace),
        ("pod", w.pod),
        ("container", w.container),
        ("slurm_job", w.job_id),
        ("unit", w.unit),
        ("user", w.user),
        ("team", w.team),
    )
    return {k: str(v) for k, v in pairs if v}


def dcgm_labels(w: Workload) -> Optional[Labels]:
    """The labels dcgm-exporter adds for this holder, or None when it would add none."""
    if w.kind == POD and w.namespace and w.pod:
        out = {"pod": w.pod, "namespace": w.namespace}
        if w.container:
            out["container"] = w.container
        return out
    if w.kind == SLURM and w.job_id:
        return {"hpc_job": str(w.job_id)}
    return None


class GpuCollector:
    """A prometheus_client custom collector over the publisher's latest GPU views.

    `dcgm`: also emit dcgm-exporter's names (switch off where dcgm-exporter runs on the node too).
    `engine_active_from_nvml`: emit DCGM_FI_PROF_GR_ENGINE_ACTIVE from NVML utilization, which OpenCost
    reads as GPU usage; NVML has no profiling counters, so it is the same kernel-time ratio, not DCGM's."""

    def __init__(
        self,
        hostname: str,
        views: Callable[[], Sequence[GpuView]],
        instance_id: Optional[str] = None,
        dcgm: bool = True,
        engine_active_from_nvml: bool = True,
    ) -> None:
        self.hostname = hostname
        self.views = views
        self.instance_id = instance_id
        self.dcgm = dcgm
        self.engine_active_from_nvml = engine_active_from_nvml
        self.errors = 0
        self._lock = threading.Lock()

    # ---- prometheus_client's collector interface ----

    def collect(self) -> Iterable[Metric]:
        rows: List[Row] = []
        try:
            views = list(self.views())
        except Exception:
            self._failed("reading the GPU views")
            views = []
        for view in views:
            try:
                rows.extend(self.render(view))
            except Exception:
                self._failed("rendering GPU %s" % getattr(view, "index", "?"))
        families: Dict[str, Metric] = {}
        for family, labels, value in rows:
            metric = families.get(family.name)
            if metric is None:
                metric = families[family.name] = Metric(family.name, family.help, family.kind)
            metric.add_sample(family.sample_name, labels, value)
        errors = Metric(ERRORS.name, ERRORS.help, ERRORS.kind)
        errors.add_sample(ERRORS.sample_name, {"hostname": self.hostname}, float(self.errors))
        return [*families.values(), errors]

    # ---- rendering: a list of rows per GPU, committed only whole ----

    def render(self, view: GpuView) -> List[Row]:
        """Every series of one GPU (the caller drops them all if this raises)."""
        base = {"gpu": str(view.index), "uuid": view.uuid, "model": view.model_name, "hostname": self.hostname}
        if self.instance_id:
            base["instance_id"] = self.instance_id
        sample = view.sample
        if sample.lost:
            return [(LOST, base, 1.0)]
        rows: List[Row] = [(LOST, base, 0.0)]
        holders = {h.workload.key: h for h in view.holders or ()}
        attributed = self._attributed(view, holders)
        device = self._dcgm_base(view)
        for field in FIELDS:
            value = _num(field.read(view))
            if value is None:
                continue
            if field.gpufleet is not None:
                rows.append((field.gpufleet, base, value * field.scale))
            if self.dcgm and field.dcgm is not None:
                if field.dcgm.name == ENGINE_ACTIVE and not self.engine_active_from_nvml:
                    continue
                rows.extend(self._dcgm_rows(view, field, value, device, attributed))
        rows.extend(self._workload_rows(view, base, holders))
        return rows

    def _dcgm_base(self, view: GpuView) -> Labels:
        out = {
            "gpu": str(view.index),
            "UUID": view.uuid,
            "device": "nvidia%d" % view.index,
            "modelName": view.model_name,
            "Hostname": self.hostname,
        }
        if view.pci_bus_id:
            out["pci_bus_id"] = view.pci_bus_id
        return out

    @staticmethod
    def _attributed(view: GpuView, holders: Dict[str, "Holder"]) -> List[Tuple[Labels, Optional["Holder"]]]:
        """dcgm-exporter's attribution of the GPU: (labels, that holder's sums if known), one per pod/job."""
        seen = set()
        out: List[Tuple[Labels, Optional["Holder"]]] = []
        for w in view.workloads:
            labels = dcgm_labels(w)
            if labels is None:
                continue
            key = tuple(sorted(labels.items()))
            if key in seen:
                continue
            seen.add(key)
            out.append((labels, holders.get(w.key)))
        return out

    @staticmethod
    def _dcgm_rows(
        view: GpuView,
        field: Field,
        value: float,
        device: Labels,
        attributed: List[Tuple[Labels, Optional["Holder"]]],
    ) -> List[Row]:
        family = field.dcgm
        assert family is not None
        if not attributed:
            return [(family, device, value)]
        if len(attributed) > 1 and field.own is not None:
            # Time-sliced GPU: the device's value once, and each pod's own processes' part.
            own: List[Row] = []
            for labels, holder in attributed:
                part = _num(field.own(view, holder)) if holder is not None else None
                if part is None:
                    break  # not known for every pod: every pod's series carries the device value
                own.append((family, {**device, **labels}, part))
            else:
                return [(family, device, value), *own]
        return [(family, {**device, **labels}, value) for labels, _ in attributed]

    @staticmethod
    def _workload_rows(view: GpuView, base: Labels, holders: Dict[str, "Holder"]) -> List[Row]:
        unique: Dict[str, Workload] = {}
        for w in view.workloads:
            unique.setdefault(w.key, w)
        rows: List[Row] = [(WORKLOADS, base, float(len(unique)))]
        for key, w in unique.items():
            labels = {**base, **workload_labels(w)}
            rows.append((WORKLOAD_INFO, labels, 1.0))
            holder = holders.get(key)
            if holder is None:
                continue
            memory = _own_memory_mib(view, holder)
            if memory is not None:
                rows.append((WORKLOAD_MEMORY, labels, memory * MIB))
            sm = _num(holder.sm_util)
            if sm is not None:
                rows.append((WORKLOAD_SM, labels, sm))
        return rows

    def _failed(self, what: str) -> None:
        with self._lock:
            self.errors += 1
            count = self.errors
        if count % LOG_EVERY == 1:
            log.warning(
                "Prometheus endpoint: %s failed (%d so far); left out of the scrape", what, count, exc_info=True
            )


class NodeCollector:
    """The host under the GPUs: memory, swap and disk gauges from the publisher's last host reading, and
    every EFA device's counters read from sysfs at scrape time (efa.py; counters as prometheus_client
    names them: `_total`, labels `device` and `port`). A node without EFA or without a host reading
    emits neither; a part that fails is logged and left out of that scrape, never a failed scrape."""

    def __init__(
        self,
        hostname: str,
        host: Callable[[], Optional[object]],
        instance_id: Optional[str] = None,
        efa_root: Optional[str] = None,
    ) -> None:
        self.hostname = hostname
        self.host = host  # () -> host.HostSample or None
        self.instance_id = instance_id
        self.efa_root = efa_root  # None: efa.SYSFS_INFINIBAND
        self.errors = 0

    def _base(self) -> Labels:
        base = {"hostname": self.hostname}
        if self.instance_id:
            base["instance_id"] = self.instance_id
        return base

    def collect(self) -> Iterable[Metric]:
        out: List[Metric] = []
        for part in (self._host, self._efa):
            try:
                out.extend(part())
            except Exception:
                self.errors += 1
                if self.errors % LOG_EVERY == 1:
                    log.warning("Prometheus endpoint: host metrics failed (%d so far)", self.errors, exc_info=True)
        return out

    def _host(self) -> List[Metric]:
        sample = self.host()
        if sample is None:
            return []
        out = []
        for family, value in (
            (HOST_MEMORY, getattr(sample, "memory_used_percent", None)),
            (HOST_SWAP, getattr(sample, "swap_used_percent", None)),
        ):
            if value is not None:
                metric = Metric(family.name, family.help, family.kind)
                metric.add_sample(family.sample_name, self._base(), float(value))
                out.append(metric)
        disks = getattr(sample, "disks", ())
        if disks:
            metric = Metric(HOST_DISK.name, HOST_DISK.help, HOST_DISK.kind)
            for disk in disks:
                metric.add_sample(HOST_DISK.sample_name, {**self._base(), "mountpoint": disk.path}, disk.used_percent)
            out.append(metric)
        return out

    def _efa(self) -> List[Metric]:
        from gpufleet_node import efa

        ports = efa.read_counters(self.efa_root or efa.SYSFS_INFINIBAND)
        families: Dict[str, Metric] = {}
        for p in ports:
            labels = {**self._base(), "device": p.device, "port": p.port}
            for name, doc in efa.COUNTERS:
                if name not in p.values:
                    continue
                family = "gpufleet_efa_" + name
                metric = families.get(family)
                if metric is None:
                    metric = families[family] = Metric(family, "EFA: " + doc, "counter")
                metric.add_sample(family + "_total", labels, float(p.values[name]))
        return list(families.values())


HOST_MEMORY = Family("gpufleet_host_memory_used_percent", "Host memory in use, percent (MemTotal - MemAvailable)")
HOST_SWAP = Family("gpufleet_host_swap_used_percent", "Swap in use, percent of SwapTotal (only where swap exists)")
HOST_DISK = Family("gpufleet_host_filesystem_used_percent", "A local filesystem's use, percent, as df counts it")


class Endpoint:
    """The running HTTP endpoint: `.port` (the bound port, also when asked for 0), `.stats` and `.stop()`."""

    def __init__(self, server: BoundedServer) -> None:
        self.server = server
        self.port = int(server.address[1])
        self.address = server.address[0]
        self.stats = server.stats

    def stop(self, timeout: float = 5.0) -> None:
        self.server.stop(timeout)  # closes the listener: the port is free for a restart


def serve(
    collector: GpuCollector,
    port: int,
    addr: str = "0.0.0.0",
    limits: Optional[Limits] = None,
    clock: Callable[[], float] = time.monotonic,
    node: Optional[NodeCollector] = None,
) -> Endpoint:
    """Serve `collector` alone on http://addr:port/metrics from one daemon thread, within `limits`
    (scrape_server.py: a connection cap, deadlines, a response rate, one render per interval).

    Its own registry: no process_* or python_* series (the publisher's CPU and memory are the node
    agent's business, and each would be one more billed series per node)."""
    limits = limits or Limits()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if node is not None:
        registry.register(node)
    return Endpoint(BoundedServer(Renderer(registry, limits.render_every_s, clock), port, addr, limits, clock))
