"""The host under the GPUs: /proc/meminfo and statvfs read as free(1) and df(1) count them, from files in
a temporary directory; the host series riding in the GPU metrics' own PutMetricData call; in adaptive
detail the group's series always and the node's own only under pressure, with hysteresis. Python >= 3.9."""

import os
import threading
from datetime import datetime, timedelta, timezone

import pytest

from fakes import FakeCloudWatch
from gpufleet_node import host, schema
from gpufleet_node.host import HostDetail, HostFeed, HostReader, disk_percent, memory_percents, parse_meminfo
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)
MEMINFO = """MemTotal:       {total} kB
MemFree:         1000000 kB
MemAvailable:   {available} kB
Buffers:          100000 kB
Cached:          2000000 kB
SwapCached:            0 kB
SwapTotal:      {swap_total} kB
SwapFree:       {swap_free} kB
HugePages_Total:       0
"""


def meminfo(total=1000000, available=600000, swap_total=0, swap_free=0):
    return MEMINFO.format(total=total, available=available, swap_total=swap_total, swap_free=swap_free)


@pytest.mark.parametrize(
    ("text", "memory", "swap"),
    [
        (meminfo(), 40.0, None),  # no swap (the EKS AMI, the DLAMI): no swap series at all
        (meminfo(available=0), 100.0, None),
        (meminfo(swap_total=2000, swap_free=500), 40.0, 75.0),
        (meminfo(swap_total=2000, swap_free=2000), 40.0, 0.0),
        ("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 100 kB\nCached: 300 kB\n", 50.0, None),  # kernel < 3.14
        ("garbage\nMemTotal: lots kB\n", None, None),
    ],
)
def test_memory_and_swap_percent(text, memory, swap):
    got = memory_percents(parse_meminfo(text))
    assert got == (pytest.approx(memory) if memory is not None else None, swap)


@pytest.mark.parametrize(
    ("blocks", "bfree", "bavail", "percent"),
    [
        (1000, 500, 450, 500 / 950 * 100),  # root-reserved blocks count as full, as df's Use%
        (1000, 1000, 1000, 0.0),
        (1000, 50, 0, 100.0),  # only reserved blocks left: full for the jobs
        (0, 0, 0, None),  # a pseudo filesystem
    ],
)
def test_disk_percent_as_df_counts_it(blocks, bfree, bavail, percent):
    got = disk_percent(blocks, bfree, bavail)
    assert got == (pytest.approx(percent) if percent is not None else None)


class FakeDisks:
    """statvfs and stat for a few mount points: (device, blocks, bfree, bavail) by path."""

    def __init__(self, table):
        self.table = table

    def stat(self, path):
        if path not in self.table:
            raise FileNotFoundError(path)
        return os.stat_result((0, 0, self.table[path][0], 0, 0, 0, 0, 0, 0, 0))

    def statvfs(self, path):
        _, blocks, bfree, bavail = self.table[path]
        return os.statvfs_result((4096, 4096, blocks, bfree, bavail, 0, 0, 0, 0, 255))


def test_reader_takes_the_fullest_filesystem_each_device_once(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(meminfo(available=250000))
    disks = FakeDisks(
        {
            "/": (1, 1000, 600, 550),  # 42.1 %
            "/var/lib/containerd": (1, 1000, 0, 0),  # on the root device: counted as "/" already
            "/opt/dlami/nvme": (2, 1000, 100, 100),  # 90 %
        }
    )
    reader = HostReader(
        ("/", "/var/lib/containerd", "/opt/dlami/nvme", "/opt/sagemaker"),
        str(path),
        disks.statvfs,
        disks.stat,
    )
    sample = reader.read()
    assert sample.memory_used_percent == pytest.approx(75.0)
    assert sample.swap_used_percent is None
    assert sample.disk_used_percent == pytest.approx(90.0)
    assert [d.path for d in sample.disks] == ["/", "/opt/dlami/nvme"]  # /opt/sagemaker absent: skipped


def test_unreadable_meminfo_leaves_memory_out(tmp_path):
    reader = HostReader(("/",), str(tmp_path / "missing"), FakeDisks({"/": (1, 10, 5, 5)}).statvfs, os.stat)
    sample = reader.read()
    assert sample.memory_used_percent is None and sample.disk_used_percent == pytest.approx(50.0)


def test_host_detail_hysteresis_per_metric():
    d = HostDetail()
    mem, disk = schema.HOST_MEMORY_USED_PERCENT.name, schema.HOST_DISK_USED_PERCENT.name
    assert d.update({mem: 69.9, disk: 79.9}) == frozenset()
    assert d.update({mem: 70.0, disk: 50.0}) == {mem}
    assert d.update({mem: 61.0}) == {mem}  # between off and on: stays on
    assert d.update({mem: 59.9, disk: 80.0}) == {disk}
    assert d.update({disk: 76.0}) == {disk}
    assert d.update({disk: 74.9}) == frozenset()
    assert HostDetail(always=True).current == frozenset(schema.HOST_DETAIL_THRESHOLDS)
    with pytest.raises(ValueError, match="hysteresis"):
        HostDetail({mem: (60.0, 70.0)})


class Host:
    """A node whose host readings come from files the test changes minute by minute."""

    def __init__(self, tmp_path, detail="adaptive", swap=False, group=True):
        self.meminfo = tmp_path / "meminfo"
        self.disks = FakeDisks({"/": (1, 1000, 600, 600)})
        self.set(memory=40.0, swap_used=0.0 if swap else None)
        self.cw = FakeCloudWatch()
        identity = Identity("i-0abc", "us-east-1", "p4d.24xlarge", asg_name="train" if group else None)
        reader = HostReader(("/",), str(self.meminfo), self.disks.statvfs, self.disks.stat)
        self.pub = Publisher(SimulatedBackend(gpus=2), identity, Sender(self.cw), detail=detail, host=HostFeed(reader))
        self.pub.start(xid_thread=False)
        self.t = T0

    def set(self, memory, swap_used=None, disk=None):
        total = 1000000
        swap_total = 0 if swap_used is None else 1000
        swap_free = 0 if swap_used is None else int(1000 - 10 * swap_used)
        self.meminfo.write_text(meminfo(total, int(total * (100 - memory) / 100), swap_total, swap_free))
        if disk is not None:
            self.disks.table["/"] = (1, 1000, int(1000 - 10 * disk), int(1000 - 10 * disk))

    def minute(self):
        before = len(self.cw.calls)
        simulate(self.pub, self.t, 60, every_s=10)
        self.pub.close_windows(self.t + timedelta(seconds=59))
        self.t += timedelta(minutes=1)
        calls = self.cw.calls[before:]
        assert len(calls) == 1  # the host rides in the GPU metrics' own call: no new request
        return {
            d["MetricName"] + ("@instance" if d["Dimensions"][0]["Name"] == "InstanceId" else "@group"): d
            for d in calls[0]["MetricData"]
            if d["MetricName"].startswith("Host")
        }


def test_adaptive_sends_the_group_always_and_the_instance_only_under_pressure(tmp_path):
    node = Host(tmp_path)
    quiet = node.minute()
    assert set(quiet) == {"HostMemoryUsedPercent@group", "HostDiskUsedPercent@group"}  # no swap on this node
    assert quiet["HostMemoryUsedPercent@group"]["StatisticValues"]["Maximum"] == pytest.approx(40.0)
    node.set(memory=75.0)
    assert "HostMemoryUsedPercent@instance" in node.minute()  # the window that crossed 70 % already
    node.set(memory=65.0)
    assert "HostMemoryUsedPercent@instance" in node.minute()  # hysteresis: still above 60 %
    node.set(memory=55.0)
    assert "HostMemoryUsedPercent@instance" not in node.minute()
    node.set(memory=40.0, disk=85.0)
    sent = node.minute()
    assert "HostDiskUsedPercent@instance" in sent and "HostMemoryUsedPercent@instance" not in sent
    assert sent["HostDiskUsedPercent@group"]["StatisticValues"]["Maximum"] == pytest.approx(85.0)


def test_swap_only_where_it_exists_and_on_the_instance_while_in_use(tmp_path):
    node = Host(tmp_path, swap=True)
    assert "HostSwapUsedPercent@group" in node.minute()
    node.set(memory=40.0, swap_used=20.0)
    assert node.minute()["HostSwapUsedPercent@instance"]["StatisticValues"]["Maximum"] == pytest.approx(20.0)


@pytest.mark.parametrize("detail", ["full", "essential"])
def test_full_and_essential_send_the_instance_series_always(tmp_path, detail):
    sent = Host(tmp_path, detail=detail).minute()
    assert {"HostMemoryUsedPercent@instance", "HostDiskUsedPercent@instance"} <= set(sent)


def test_a_node_outside_groups_sends_its_own_only_under_pressure(tmp_path):
    node = Host(tmp_path, group=False)
    assert node.minute() == {}
    node.set(memory=95.0)
    assert set(node.minute()) == {"HostMemoryUsedPercent@instance"}


def test_no_host_reader_no_host_series(tmp_path):
    cw = FakeCloudWatch()
    pub = Publisher(SimulatedBackend(gpus=1), Identity("i-0", "us-east-1", asg_name="g"), Sender(cw), detail="full")
    pub.start(xid_thread=False)
    simulate(pub, T0, 60, every_s=10)
    pub.close_windows(T0 + timedelta(seconds=59))
    assert not [d for c in cw.calls for d in c["MetricData"] if d["MetricName"].startswith("Host")]


@pytest.mark.parametrize(
    ("value", "ok"),
    [(["/", "/opt/dlami/nvme"], True), ([], False), (["relative"], False), ("/", False), ([None], False)],
)
def test_host_filesystems_config(tmp_path, value, ok):
    import json

    from gpufleet_node import config

    path = tmp_path / "publisher.json"
    path.write_text(json.dumps({"host_filesystems": value}))
    if ok:
        assert config.load(str(path))["host_filesystems"] == value
    else:
        with pytest.raises(config.ConfigError, match="host_filesystems must be a list of 1 to 16 absolute paths"):
            config.load(str(path))
    assert config.DEFAULTS["host_filesystems"] == list(schema.DEFAULT_HOST_FILESYSTEMS)


MOUNTINFO = """22 1 259:1 / / rw,noatime shared:1 - xfs /dev/nvme0n1p1 rw
30 22 259:3 / /opt/dlami/nvme rw shared:9 - ext4 /dev/nvme1n1 rw
41 22 0:52 / /fsx rw,relatime shared:20 - lustre 172.31.0.9@tcp:/abcd rw,flock
42 22 0:53 / /mnt/efs rw shared:21 - nfs4 fs-1.efs.us-east-1.amazonaws.com:/ rw,vers=4.1,hard
43 22 0:54 / /mnt/my\\040bucket rw shared:22 - fuse.mountpoint-s3 mountpoint-s3 rw
44 22 259:4 / /mnt/efs/local rw shared:23 - ext4 /dev/nvme2n1 rw
"""


def test_mount_types_by_the_longest_mount_point_above_the_path():
    mounts = host.parse_mountinfo(MOUNTINFO)
    assert ("/mnt/my bucket", "fuse.mountpoint-s3") in mounts  # octal escapes undone
    assert host.mount_type("/var/lib/containerd", mounts) == "xfs"
    assert host.mount_type("/fsx/scratch", mounts) == "lustre"
    assert host.mount_type("/fsxother", mounts) == "xfs"  # a prefix of the name is not a parent
    assert host.mount_type("/mnt/efs/local/x", mounts) == "ext4"  # a local disk mounted inside the NFS
    assert host.mount_type("/mnt/efs/", mounts) == "nfs4"
    assert host.mount_type("/x", []) is None
    over = host.parse_mountinfo(MOUNTINFO + "50 22 0:60 / /opt/dlami/nvme rw - nfs4 srv:/ rw\n")
    assert host.mount_type("/opt/dlami/nvme", over) == "nfs4"  # the later mount hides the earlier
    assert [host.is_network_fs(t) for t in ("nfs", "lustre", "fuse.sshfs", "fuse", "xfs", "ext4", "tmpfs")] == [
        True,
        True,
        True,
        True,
        False,
        False,
        False,
    ]


def test_network_filesystems_in_host_filesystems_are_never_touched(tmp_path, caplog):
    """/fsx (Lustre), /mnt/efs (NFS) and an S3 FUSE mount are in host_filesystems: never stat'ed (a hung
    server would block the call for good), one warning each naming it; the local disks are read."""
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    (tmp_path / "meminfo").write_text(meminfo())
    disks = FakeDisks({"/": (1, 1000, 600, 550), "/opt/dlami/nvme": (2, 1000, 100, 100)})
    touched = []

    def stat(path):
        touched.append(path)
        return disks.stat(path)

    paths = ("/", "/fsx", "/mnt/efs", "/mnt/my bucket", "/opt/dlami/nvme")
    reader = HostReader(paths, str(tmp_path / "meminfo"), disks.statvfs, stat, mountinfo=str(tmp_path / "mountinfo"))
    with caplog.at_level("WARNING", logger="gpufleet.publisher"):
        first, second = reader.read(), reader.read()
    assert touched == ["/", "/opt/dlami/nvme"] * 2
    assert first.disk_used_percent == pytest.approx(90.0) and second == first
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and all("not read" in w for w in warnings)
    assert "/fsx is on lustre" in warnings[0] and "/mnt/my bucket is on fuse.mountpoint-s3" in warnings[2]


class HungMount:
    """A stat that never answers for one path until the test lets it go (an NFS GETATTR to a server
    that is gone), counting the calls that reached it."""

    def __init__(self, path):
        self.path = path
        self.release = threading.Event()
        self.in_stat = threading.Event()
        self.entered = 0

    def stat(self, path):
        if path == self.path:
            self.entered += 1
            self.in_stat.set()
            self.release.wait()
        return os.stat_result((0, 0, 1 if path == "/" else 2, 0, 0, 0, 0, 0, 0, 0))

    def statvfs(self, path):
        return os.statvfs_result((4096, 4096, 1000, 500, 500, 0, 0, 0, 0, 255))


def test_a_hung_disk_read_is_unknown_never_waits_twice_and_starts_no_second_read(tmp_path, caplog):
    """The mount table does not know /shared (a symlink to an NFS, or no /proc): the deadline guards.
    The hung read is waited for once; later rounds see it still running and neither wait nor start
    another; when the server answers, the disks are back."""
    (tmp_path / "meminfo").write_text(meminfo())
    hung = HungMount("/shared")
    reader = HostReader(
        ("/", "/shared"), str(tmp_path / "meminfo"), hung.statvfs, hung.stat, mountinfo=str(tmp_path / "none")
    )
    reader.deadline_s = 0.01  # the hung call never ends by itself: whatever the deadline, it passes
    try:
        with caplog.at_level("WARNING", logger="gpufleet.publisher"):
            samples = [reader.read()]
            assert hung.in_stat.wait(30)  # the worker is now stuck in the call
            samples += [reader.read() for _ in range(4)]
        assert [s.disk_used_percent for s in samples] == [None] * 5
        assert [s.memory_used_percent for s in samples] == [40.0] * 5  # memory still read each round
        assert hung.entered == 1  # one stuck thread, never a second
        hung_warnings = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
        assert len(hung_warnings) == 1 and "GPU sampling goes on" in hung_warnings[0]
    finally:
        hung.release.set()
    assert reader.worker.wait(30)
    reader.deadline_s = 30.0
    assert reader.read().disk_used_percent == pytest.approx(50.0)
    assert hung.entered == 2


def test_a_hung_nfs_in_host_filesystems_does_not_stop_gpu_sampling(tmp_path):
    """Three minutes of sampling rounds with /fsx hung from the start: every round ends, each minute's
    window is sent with its GPU series and NVMLUp; the disk series is simply absent."""
    (tmp_path / "meminfo").write_text(meminfo())
    hung = HungMount("/fsx")
    reader = HostReader(("/", "/fsx"), str(tmp_path / "meminfo"), hung.statvfs, hung.stat, mountinfo="/nonexistent")
    reader.deadline_s = 0.01
    cw = FakeCloudWatch()
    pub = Publisher(
        SimulatedBackend(gpus=2), Identity("i-0", "us-east-1", asg_name="g"), Sender(cw), host=HostFeed(reader)
    )
    pub.start(xid_thread=False)
    rounds = []

    def loop():
        for second in range(181):
            pub.step(T0 + timedelta(seconds=second))
            rounds.append(second)

    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    sampler.join(60)  # a safety net only: on the old code the first round never ends
    try:
        assert len(rounds) == 181
        assert len(cw.calls) == 3
        for call in cw.calls:
            names = {d["MetricName"] for d in call["MetricData"]}
            assert {schema.NVML_UP.name, "GPUUtilization", schema.HOST_MEMORY_USED_PERCENT.name} <= names
            assert schema.HOST_DISK_USED_PERCENT.name not in names
        assert hung.in_stat.wait(30) and hung.entered == 1
    finally:
        hung.release.set()
