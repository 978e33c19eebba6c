"""Reading GPUs through NVML (the official nvidia-ml-py binding), one GPU's trouble never stopping the rest.

Every field is read on its own: NotSupported switches that field off for that GPU (cached, not retried
each second), GpuIsLost marks the GPU lost and skips it. XID critical errors arrive on an NVML event set
that a background thread waits on. `SimulatedBackend` offers the same interface for the rehearsal.
Python >= 3.9.
"""

import contextlib
import logging
import threading
from typing import Dict, List, Optional, Set, Tuple

log = logging.getLogger("gpufleet.publisher")

MIB = 1024 * 1024


class NvmlUnavailable(RuntimeError):
    """No NVML library or driver on this machine: the publisher exits with a distinct code."""


class ProcessUse:
    """One compute process on one GPU: its memory, and its share of the SM time when the GPU reports
    per-process utilization (None otherwise, e.g. on MIG or older boards)."""

    __slots__ = ("memory_mib", "pid", "sm_util")

    def __init__(self, pid: int, memory_mib: Optional[float], sm_util: Optional[float] = None) -> None:
        self.pid = pid
        self.memory_mib = memory_mib
        self.sm_util = sm_util

    def __repr__(self) -> str:
        return "ProcessUse(%d, %s MiB, sm %s)" % (self.pid, self.memory_mib, self.sm_util)


class GpuSample:
    """One reading of one GPU. None = not available on this GPU (NotSupported) or not read."""

    __slots__ = (
        "ecc_double_bit_total",
        "lost",
        "mem_controller_busy",
        "memory_free_mib",
        "memory_temperature_c",
        "memory_total_mib",
        "memory_used_mib",
        "power_limit_w",
        "power_w",
        "process_count",
        "processes",
        "remapped_uncorrectable_total",
        "sm_clock_mhz",
        "temperature_c",
        "throttle_reasons",
        "top_process_mib",
        "utilization",
    )

    def __init__(
        self,
        lost: bool = False,
        utilization: Optional[float] = None,
        mem_controller_busy: Optional[float] = None,
        memory_total_mib: Optional[float] = None,
        memory_used_mib: Optional[float] = None,
        memory_free_mib: Optional[float] = None,
        power_w: Optional[float] = None,
        power_limit_w: Optional[float] = None,
        temperature_c: Optional[float] = None,
        memory_temperature_c: Optional[float] = None,
        throttle_reasons: Optional[int] = None,
        ecc_double_bit_total: Optional[float] = None,
        remapped_uncorrectable_total: Optional[float] = None,
        process_count: Optional[int] = None,
        top_process_mib: Optional[float] = None,
        processes: Optional[List[ProcessUse]] = None,
        sm_clock_mhz: Optional[float] = None,
    ) -> None:
        self.lost = lost
        self.utilization = utilization
        self.mem_controller_busy = mem_controller_busy
        self.memory_total_mib = memory_total_mib
        self.memory_used_mib = memory_used_mib
        self.memory_free_mib = memory_free_mib
        self.power_w = power_w
        self.power_limit_w = power_limit_w
        self.temperature_c = temperature_c
        self.memory_temperature_c = memory_temperature_c
        self.throttle_reasons = throttle_reasons
        self.ecc_double_bit_total = ecc_double_bit_total
        self.remapped_uncorrectable_total = remapped_uncorrectable_total
        self.process_count = process_count
        self.top_process_mib = top_process_mib
        self.processes = processes  # None: not read (attribution off) or not supported
        self.sm_clock_mhz = sm_clock_mhz


class GpuInfo:
    """What does not change while the GPU is up: its UUID and model name (labels of the endpoint)."""

    __slots__ = ("name", "uuid")

    def __init__(self, uuid: str, name: str) -> None:
        self.uuid = uuid
        self.name = name


class XidEvent:
    __slots__ = ("code", "gpu_index")

    def __init__(self, gpu_index: int, code: int) -> None:
        self.gpu_index = gpu_index
        self.code = code


# Clock event (throttle) reason bits, as in nvml.h.
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80


class ProcessShares:
    """Each process's mean SM utilization over the samples NVML took since the last call (NVML keeps a
    short buffer of them). NotFound means no new sample yet: quietly nothing, not an error. A GPU that
    cannot say (MIG, older boards) is not asked again."""

    def __init__(self, nvml: object) -> None:
        self._nvml = nvml
        self._last_seen_us: Dict[int, int] = {}
        self._unsupported: Set[int] = set()

    def read(self, index: int, handle: object) -> Dict[int, float]:
        n = self._nvml
        if index in self._unsupported:
            return {}
        try:
            samples = n.nvmlDeviceGetProcessUtilization(handle, self._last_seen_us.get(index, 0))  # type: ignore[attr-defined]
        except n.NVMLError_NotFound:  # type: ignore[attr-defined]
            return {}
        except (n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound):  # type: ignore[attr-defined]
            self._unsupported.add(index)
            log.info("GPU %d: per-process utilization not supported (MIG or older board); busy time is split", index)
            return {}
        except n.NVMLError as exc:  # type: ignore[attr-defined]
            log.warning("GPU %d: reading per-process utilization failed: %s", index, exc)
            return {}
        sums: Dict[int, List[float]] = {}
        for sample in samples:
            self._last_seen_us[index] = max(self._last_seen_us.get(index, 0), int(sample.timeStamp))
            sums.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        return {pid: sum(values) / len(values) for pid, values in sums.items()}


class NvmlBackend:
    """The real thing, through pynvml (nvidia-ml-py)."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # the package itself is missing
            raise NvmlUnavailable("nvidia-ml-py is not installed: %s" % exc) from None
        self._nvml = pynvml
        self._handles: List[object] = []
        self._unsupported: Dict[int, Set[str]] = {}
        self._lost: Set[int] = set()
        self._events: Optional[object] = None
        self._lock = threading.Lock()
        self.process_utilization = False  # attribution on: each process's SM share (one more call per GPU)
        self.clocks = False  # the Prometheus endpoint on: the SM clock (DCGM_FI_DEV_SM_CLOCK)
        self._shares = ProcessShares(pynvml)

    # ---- lifecycle ----

    def init(self) -> int:
        n = self._nvml
        try:
            n.nvmlInit()
        except n.NVMLError as exc:
            raise NvmlUnavailable("NVML did not initialise: %s" % exc) from None
        count = int(n.nvmlDeviceGetCount())
        self._handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._unsupported = {i: set() for i in range(count)}
        return count

    @property
    def gpu_count(self) -> int:
        """GPUs found by init()."""
        return len(self._handles)

    def shutdown(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def driver_version(self) -> str:
        try:
            return str(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            return "unknown"

    def describe(self, index: int) -> GpuInfo:
        """UUID and model name; "unknown" where NVML does not say (never raises)."""
        n = self._nvml
        out = []
        for fn in (n.nvmlDeviceGetUUID, n.nvmlDeviceGetName):
            try:
                value = fn(self._handles[index])
                out.append(value.decode() if isinstance(value, bytes) else str(value))
            except n.NVMLError:
                out.append("unknown")
        return GpuInfo(out[0], out[1])

    # ---- sampling ----

    def _read(self, index: int, field: str, fn, *args):  # type: ignore[no-untyped-def]
        """One field of one GPU: None when unsupported (remembered) or on a transient error."""
        if field in self._unsupported[index]:
            return None
        n = self._nvml
        try:
            return fn(self._handles[index], *args)
        except n.NVMLError_NotSupported:
            self._unsupported[index].add(field)
            log.info("GPU %d: %s not supported, no longer read", index, field)
        except n.NVMLError_FunctionNotFound:
            self._unsupported[index].add(field)
        except n.NVMLError_GpuIsLost:
            raise
        except n.NVMLError as exc:
            log.warning("GPU %d: reading %s failed: %s", index, field, exc)
        return None

    def sample(self, index: int) -> GpuSample:
        n = self._nvml
        if index in self._lost:
            return GpuSample(lost=True)
        try:
            return self._sample(index)
        except n.NVMLError_GpuIsLost:
            self._lost.add(index)
            log.error("GPU %d is lost (fell off the bus); it is reported as GPULost and no longer read", index)
            return GpuSample(lost=True)

    def _sample(self, index: int) -> GpuSample:
        n = self._nvml
        util = self._read(index, "utilization", n.nvmlDeviceGetUtilizationRates)
        mem = self._memory(index)
        power_mw = self._read(index, "power", n.nvmlDeviceGetPowerUsage)
        limit_mw = self._read(index, "power_limit", n.nvmlDeviceGetEnforcedPowerLimit)
        procs = self._read(index, "processes", n.nvmlDeviceGetComputeRunningProcesses)
        top = max((p.usedGpuMemory or 0 for p in procs), default=0) if procs is not None else None
        sm_shares = self._shares.read(index, self._handles[index]) if self.process_utilization and procs else {}
        fields = self._read(index, "memory_temperature", n.nvmlDeviceGetFieldValues, [n.NVML_FI_DEV_MEMORY_TEMP])
        mem_temp = None
        if fields is not None and fields[0].nvmlReturn == n.NVML_SUCCESS:
            mem_temp = fields[0].value.uiVal
        elif fields is not None:
            self._unsupported[index].add("memory_temperature")
        remapped = self._read(index, "remapped_rows", n.nvmlDeviceGetRemappedRows)
        return GpuSample(
            utilization=util.gpu if util is not None else None,
            mem_controller_busy=util.memory if util is not None else None,
            memory_total_mib=mem[0] if mem else None,
            memory_used_mib=mem[1] if mem else None,
            memory_free_mib=mem[2] if mem else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw else None,
            temperature_c=self._read(index, "temperature", n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU),
            memory_temperature_c=mem_temp,
            throttle_reasons=self._throttle(index),
            ecc_double_bit_total=self._read(
                index,
                "ecc",
                n.nvmlDeviceGetTotalEccErrors,
                n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                n.NVML_VOLATILE_ECC,
            ),
            remapped_uncorrectable_total=remapped[1] if remapped is not None else None,
            process_count=len(procs) if procs is not None else None,
            top_process_mib=top / MIB if top is not None else None,
            processes=[_process(p, sm_shares) for p in procs] if procs is not None else None,
            sm_clock_mhz=self._read(index, "sm_clock", n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM)
            if self.clocks
            else None,
        )

    def _memory(self, index: int) -> Optional[Tuple[float, float, float]]:
        """(total, used, free) MiB. Memory info v2 where the driver has it, so memory the driver reserves
        for itself is not counted as used (v1 counts it, which makes an idle GPU look ~1-2 % full)."""
        n = self._nvml
        info = self._read(index, "memory_v2", n.nvmlDeviceGetMemoryInfo, n.nvmlMemory_v2)
        if info is None:
            info = self._read(index, "memory", n.nvmlDeviceGetMemoryInfo)
        if info is None:
            return None
        return info.total / MIB, info.used / MIB, info.free / MIB

    def _throttle(self, index: int) -> Optional[int]:
        n = self._nvml
        reasons = self._read(index, "clock_event_reasons", n.nvmlDeviceGetCurrentClocksEventReasons)
        if reasons is None and "clock_event_reasons" in self._unsupported[index]:
            reasons = self._read(index, "throttle_reasons", n.nvmlDeviceGetCurrentClocksThrottleReasons)
        return int(reasons) if reasons is not None else None

    # ---- XID events ----

    def open_events(self) -> bool:
        n = self._nvml
        try:
            self._events = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            log.warning("NVML events unavailable, XID errors will not be counted: %s", exc)
            return False
        registered = 0
        for index, handle in enumerate(self._handles):
            try:
                n.nvmlDeviceRegisterEvents(handle, n.nvmlEventTypeXidCriticalError, self._events)
                registered += 1
            except n.NVMLError as exc:
                log.info("GPU %d: XID events unavailable: %s", index, exc)
        return registered > 0

    def wait_xid(self, timeout_ms: int) -> Optional[XidEvent]:
        n = self._nvml
        if self._events is None:
            return None
        try:
            data = n.nvmlEventSetWait_v2(self._events, timeout_ms)
        except n.NVMLError_Timeout:
            return None
        except n.NVMLError as exc:
            log.warning("waiting for NVML events failed: %s", exc)
            return None
        index = self._index_of(data.device)
        return XidEvent(index, int(data.eventData))

    def _index_of(self, device: object) -> int:
        address = _address(device)
        for i, handle in enumerate(self._handles):
            if _address(handle) == address:
                return i
        return -1


def _process(info: object, sm_shares: Dict[int, float]) -> ProcessUse:
    used = getattr(info, "usedGpuMemory", None)
    pid = int(getattr(info, "pid", 0))
    return ProcessUse(pid, used / MIB if used is not None else None, sm_shares.get(pid))


def _address(handle: object) -> Optional[int]:
    import ctypes

    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None


class SimulatedBackend:
    """The rehearsal's GPUs (SIMULATED: no NVML). Tests and the demo set `values[index]` and queue XIDs."""

    def __init__(self, gpus: int, memory_total_mib: float = 23028.0, power_limit_w: float = 300.0) -> None:
        self.gpus = gpus
        self.memory_total_mib = memory_total_mib
        self.power_limit_w = power_limit_w
        self.values: Dict[int, Dict[str, float]] = {i: {} for i in range(gpus)}
        self.lost: Set[int] = set()
        self.xids: List[XidEvent] = []
        self.processes: Dict[int, List[ProcessUse]] = {}  # set_processes; absent: one anonymous process
        self.process_utilization = False
        self.clocks = False

    def init(self) -> int:
        return self.gpus

    @property
    def gpu_count(self) -> int:
        return self.gpus

    def describe(self, index: int) -> GpuInfo:
        return GpuInfo("GPU-00000000-0000-0000-0000-%012d" % index, "Simulated GPU")

    def set_processes(self, index: int, processes: List[ProcessUse]) -> None:
        """The GPU's compute processes from now on (the rehearsal's pods; [] = none)."""
        self.processes[index] = list(processes)

    def shutdown(self) -> None:
        pass

    def driver_version(self) -> str:
        return "simulated"

    def set(self, index: int, utilization: float, memory_percent: float, throttle_reasons: int = 0) -> None:
        self.values[index] = {
            "utilization": utilization,
            "memory_percent": memory_percent,
            "throttle_reasons": throttle_reasons,
        }

    def sample(self, index: int) -> GpuSample:
        if index in self.lost:
            return GpuSample(lost=True)
        v = self.values[index]
        util = round(v.get("utilization", 0.0))
        used = self.memory_total_mib * v.get("memory_percent", 0.0) / 100.0
        procs = self.processes.get(index)
        power = 60.0 + (self.power_limit_w - 60.0) * util / 100.0
        return GpuSample(
            utilization=util,
            mem_controller_busy=int(util * 0.6),
            memory_total_mib=self.memory_total_mib,
            memory_used_mib=used,
            memory_free_mib=self.memory_total_mib - used,
            power_w=power,
            power_limit_w=self.power_limit_w,
            temperature_c=35.0 + util * 0.4,
            memory_temperature_c=40.0 + util * 0.4,
            throttle_reasons=int(v.get("throttle_reasons", 0)),
            ecc_double_bit_total=0,
            remapped_uncorrectable_total=0,
            process_count=len(procs) if procs is not None else (1 if used > 500 else 0),
            top_process_mib=max((p.memory_mib or 0.0 for p in procs), default=0.0)
            if procs is not None
            else (used if used > 500 else 0.0),
            processes=procs,
            sm_clock_mhz=1410.0 if util else 210.0,
        )

    def open_events(self) -> bool:
        return True

    def wait_xid(self, timeout_ms: int) -> Optional[XidEvent]:
        return self.xids.pop(0) if self.xids else None
