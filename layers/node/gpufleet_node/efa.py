"""EFA (Elastic Fabric Adapter) counters from sysfs, read without root.

The efa driver exposes its hardware counters per device and port as one file per counter under
/sys/class/infiniband/<device>/ports/<port>/hw_counters/, each a decimal count since the driver loaded.
Names from the driver (Linux drivers/infiniband/hw/efa/efa_verbs.c, EFA_DEFINE_PORT_STATS): tx_bytes,
tx_pkts, rx_bytes, rx_pkts, rx_drops, send_bytes, send_wrs, recv_bytes, recv_wrs, rdma_read_wrs,
rdma_read_bytes, rdma_read_wr_err, rdma_read_resp_bytes; rdma_write_wrs, rdma_write_bytes,
rdma_write_wr_err, rdma_write_recv_bytes only on devices with RDMA write (EFA_DEV_CAP RDMA_WRITE); and
the network (SRD) counters retrans_bytes, retrans_pkts, retrans_timeout_events,
unresponsive_remote_events, impaired_remote_conn_events in newer drivers (Nitro v4 and later; the
CloudWatch agent's EFA plugin reads the same files). What a device does not expose is simply absent:
nothing is invented as 0. Devices are those whose driver is efa (device/driver links to .../efa), so a
Mellanox HCA on the same node is not counted as EFA.
Python >= 3.9.
"""

import os
from typing import Dict, List, NamedTuple, Optional, Tuple

SYSFS_INFINIBAND = "/sys/class/infiniband"
# The counters read: (sysfs name, what it counts). Bytes and packets for traffic; errors, drops,
# retransmits and timeouts for trouble.
COUNTERS: Tuple[Tuple[str, str], ...] = (
    ("rx_bytes", "Bytes received"),
    ("tx_bytes", "Bytes sent"),
    ("rx_pkts", "Packets received"),
    ("tx_pkts", "Packets sent"),
    ("rx_drops", "Packets dropped on receive"),
    ("rdma_read_bytes", "Bytes read by RDMA read"),
    ("rdma_write_bytes", "Bytes written by RDMA write"),
    ("rdma_read_wr_err", "RDMA reads that failed"),
    ("rdma_write_wr_err", "RDMA writes that failed"),
    ("retrans_bytes", "Bytes retransmitted (SRD)"),
    ("retrans_pkts", "Packets retransmitted (SRD)"),
    ("retrans_timeout_events", "Retransmit timeouts that changed the network path (SRD)"),
    ("unresponsive_remote_events", "Times a remote peer stopped answering (SRD)"),
    ("impaired_remote_conn_events", "Times a connection was impaired and its rate limited (SRD)"),
)
_NAMES = tuple(n for n, _ in COUNTERS)


class PortCounters(NamedTuple):
    device: str
    port: str
    values: Dict[str, int]  # counter name -> count; only the counters the device exposes


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def is_efa(root: str, device: str) -> bool:
    """The device's driver is efa (its device/driver link ends in /efa); device names alone (rdmap*,
    efa_*) differ between kernels."""
    try:
        return os.path.basename(os.readlink(os.path.join(root, device, "device", "driver"))) == "efa"
    except OSError:
        return device.startswith(("efa", "rdmap"))  # no driver link (a container's sysfs): the usual names


def read_counters(root: str = SYSFS_INFINIBAND) -> List[PortCounters]:
    """Every EFA device's ports and their counters; [] on a node without EFA."""
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for device in devices:
        if not is_efa(root, device):
            continue
        ports_dir = os.path.join(root, device, "ports")
        try:
            ports = sorted(os.listdir(ports_dir))
        except OSError:
            continue
        for port in ports:
            counters_dir = os.path.join(ports_dir, port, "hw_counters")
            values = {}
            for name in _NAMES:
                value = _read_int(os.path.join(counters_dir, name))
                if value is not None:
                    values[name] = value
            if values:
                out.append(PortCounters(device, port, values))
    return out


def totals(ports: List[PortCounters]) -> Dict[str, int]:
    """The node's sum over devices and ports, per counter present on any."""
    out: Dict[str, int] = {}
    for p in ports:
        for name, value in p.values.items():
            out[name] = out.get(name, 0) + value
    return out


Key = Tuple[str, str, str]  # (device, port, counter)


class EfaDeltas:
    """Per-window deltas for CloudWatch (`detail: full`), summed over the node's devices and ports.
    Each (device, port, counter) keeps its own last value: a node-wide total would hide one device's
    reset behind another's traffic (device A back to 0 while device B moves 5 KB reads as a small or
    no change). The first reading of a key is its baseline; a key that goes down was reset (driver
    reloaded, device re-probed) within the window, so its new value is what it counted since: the
    bytes before the reset in that window are lost, as with Prometheus' rate() over a counter reset."""

    def __init__(self, root: str = SYSFS_INFINIBAND) -> None:
        self.root = root
        self._last: Dict[Key, int] = {}

    def delta(self) -> Dict[str, int]:
        now = {(p.device, p.port, name): value for p in read_counters(self.root) for name, value in p.values.items()}
        out: Dict[str, int] = {}
        for key, value in now.items():
            last = self._last.get(key)
            if last is not None:
                name = key[2]
                out[name] = out.get(name, 0) + (value - last if value >= last else value)
        self._last = now
        return out
