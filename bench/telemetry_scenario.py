"""The telemetry benchmark's month of one node, in a module of its own: the scenario (GPU and host values at
any second) and the fake host files the real publisher reads them from. Both the pricing side
(bench/telemetry.py) and each side's process (bench/telemetry_run.py) import it, so neither imports the other.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MONTH_START = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)
DAYS = 30
SAMPLE_EVERY_S = 10
GPUS = 8
POWER_CAP = 0x4  # nvml.THROTTLE_SW_POWER_CAP
DAY = 86400
HOUR = 3600
QUICK_DAYS = 3  # --quick: covers the day-2 detail episode; the XID is moved into it


class Scenario:
    """GPU values at any second of the month: (utilization %, memory used %, throttle reasons)."""

    gpus = GPUS
    xids: tuple[tuple[int, int, int], ...] = ((10 * DAY + 14 * HOUR + 22 * 60, 3, 94),)  # (offset, GPU, XID)

    def __init__(self, days: int = DAYS) -> None:
        self.days, self.seconds = days, days * DAY
        if days < DAYS:  # a short run (--quick) still goes through the XID path: one on day 1 instead
            self.xids = ((1 * DAY + 14 * HOUR + 22 * 60, 3, 94),)

    def at(self, offset: int, gpu: int) -> tuple[float, float, int]:
        day, hour = divmod(offset, DAY)[0], (offset % DAY) // HOUR
        if day % 7 < 5 and 8 <= hour < 20:
            util = 60 + (gpu * 7 + hour * 3 + day) % 36
            memory = 35.0 + (gpu * 5 + day) % 20
        else:
            util, memory = gpu % 3, 2.0 + gpu % 3
        memory = self._episode(offset, day, gpu, memory)
        return float(util), memory, POWER_CAP if util >= 90 else 0

    @staticmethod
    def _episode(offset: int, day: int, gpu: int, memory: float) -> float:
        t = offset % DAY
        if day == 2 and gpu == 2 and 10 * HOUR <= t < 14 * HOUR:
            return 82.0
        if day == 9 and gpu in (5, 6) and 9 * HOUR <= t < 12 * HOUR:
            return 76.0
        if day == 16 and gpu == 4 and 13 * HOUR <= t < 15 * HOUR:
            return 72.0 if (t // 60) % 10 < 5 else 64.0
        if day == 22 and gpu == 1 and 14 * HOUR <= t < 15 * HOUR + 30 * 60:
            return 50.0 + 0.5 * (t - 14 * HOUR) / 60
        return memory

    @staticmethod
    def host(offset: int) -> tuple[float, float, float]:
        """The host at any second: (memory used %, root filesystem %, data filesystem %). Busy hours 45-59 %
        memory, idle 18 %; day 11 (a Friday) 10:00-13:00 a dataloader leaks 0.2 %/min from 50 % to 86 %,
        then restarts; the root volume 38 %; the instance store (checkpoints) 55 %, at 83 % on day 18
        09:00-15:00 until old checkpoints are deleted. No swap (the EKS AMI and the DLAMI run without)."""
        day, t = divmod(offset, DAY)
        hour = t // HOUR
        memory = 45.0 + (hour * 2 + day) % 15 if day % 7 < 5 and 8 <= hour < 20 else 18.0
        if day == 11 and 10 * HOUR <= t < 13 * HOUR:
            memory = 50.0 + 0.2 * (t - 10 * HOUR) / 60
        data = 83.0 if day == 18 and 9 * HOUR <= t < 15 * HOUR else 55.0
        return memory, 38.0, data

    def idle_hours(self) -> int:
        return sum(1 for h in range(self.days * 24) if not (h // 24 % 7 < 5 and 8 <= h % 24 < 20))


class FakeHost:
    """The host's files for the real HostReader: a /proc/meminfo written when the scenario's memory
    changes, and statvfs/stat answering for "/" and the instance store from the scenario's disk use."""

    def __init__(self, directory: Path) -> None:
        from gpufleet_node.host import HostReader

        self.meminfo = directory / "meminfo"
        self.disks = {"/": 38.0, "/opt/dlami/nvme": 55.0}
        self._memory: float | None = None
        self.reader = HostReader(("/", "/opt/dlami/nvme"), str(self.meminfo), self._statvfs, self._stat)

    def set(self, memory: float, root: float, data: float) -> None:
        if memory != self._memory:
            total = 1_152_000_000  # p4d: 1,152 GiB, in kB
            self.meminfo.write_text(
                f"MemTotal: {total} kB\nMemAvailable: {int(total * (100 - memory) / 100)} kB\n"
                "SwapTotal: 0 kB\nSwapFree: 0 kB\n"
            )
            self._memory = memory
        self.disks["/"], self.disks["/opt/dlami/nvme"] = root, data

    def _stat(self, path: str) -> Any:
        return os.stat_result((0, 0, 1 if path == "/" else 2, 0, 0, 0, 0, 0, 0, 0))

    def _statvfs(self, path: str) -> Any:
        free = int(1_000_000 * (100 - self.disks[path]) / 100)
        return os.statvfs_result((4096, 4096, 1_000_000, free, free, 0, 0, 0, 0, 255))
