"""The NVML path through the official binding (nvidia-ml-py) against a fake libnvidia-ml.so.1 built from
fake_nvml/fake_nvml.c: no GPU needed, no Python mock of our own wrapper. Python >= 3.9."""

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def drive(node_env, tmp_path, scenario, rounds=65, xids=0):
    path = tmp_path / "scenario.txt"
    path.write_text(scenario)
    env = dict(node_env, GPUFLEET_FAKE_NVML_SCENARIO=str(path))
    proc = subprocess.run(
        [sys.executable, str(HERE / "drive_publisher.py"), str(rounds), str(xids)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def series(out, name, gpu=None):
    found = []
    for d in out["datums"]:
        dims = {x["Name"]: x["Value"] for x in d["Dimensions"]}
        if d["MetricName"] == name and (gpu is None or dims.get("GpuIndex") == str(gpu)):
            found.append(d)
    return found


TWO_GPUS = """
gpus 2
gpu 0 util 80
gpu 0 mem_util 35
gpu 0 mem_total_mib 24000
gpu 0 mem_used_mib 12000
gpu 0 mem_reserved_mib 400
gpu 0 power_mw 150000
gpu 0 power_limit_mw 300000
gpu 0 temp 70
gpu 0 mem_temp 80
gpu 0 proc 4242 9000
gpu 0 proc 4343 3000
gpu 1 util 10
gpu 1 mem_total_mib 24000
gpu 1 mem_used_mib 100
gpu 1 notsupported power
gpu 1 notsupported mem_temp
gpu 1 notsupported ecc
at 30
gpu 0 throttle 0x40
gpu 0 ecc_dbe 2
"""


def test_fields_units_and_memory_info_v2(node_env, tmp_path):
    out, _ = drive(node_env, tmp_path, TWO_GPUS)
    assert out["calls"] == 2  # window 08:00 and the closing 08:01 window
    [used] = [d for d in series(out, "GPUMemoryUsed", 0) if d["Timestamp"].startswith("2026-11-23 08:00")]
    assert used["StatisticValues"]["Maximum"] == 12000.0  # v2: driver-reserved memory is not "used"
    [pct] = [d for d in series(out, "GPUMemoryUsedPercent", 0) if d["Timestamp"].startswith("2026-11-23 08:00")]
    assert pct["StatisticValues"]["Maximum"] == 50.0
    [util] = [d for d in series(out, "GPUUtilization", 0) if d["Timestamp"].startswith("2026-11-23 08:00")]
    assert util["Values"] == [80.0] and util["Counts"] == [60.0]
    [busy] = [d for d in series(out, "GPUMemoryControllerBusy", 0) if d["Timestamp"].startswith("2026-11-23 08:00")]
    assert busy["Values"] == [35.0]
    [top] = [d for d in series(out, "GPUTopProcessMemory", 0) if d["Timestamp"].startswith("2026-11-23 08:00")]
    assert top["StatisticValues"]["Maximum"] == 9000.0
    [power] = [d for d in series(out, "GPUPowerPercentOfLimit", 0) if d["Timestamp"].startswith("2026-11-23 08:00")]
    assert power["StatisticValues"]["Maximum"] == 50.0


def test_not_supported_fields_are_skipped_for_that_gpu_only(node_env, tmp_path):
    out, log = drive(node_env, tmp_path, TWO_GPUS)
    assert series(out, "GPUPowerDrawWatts", 1) == [] and series(out, "GPUPowerDrawWatts", 0)
    assert series(out, "GPUMemoryTemperatureCelsius", 1) == [] and series(out, "GPUMemoryTemperatureCelsius", 0)
    assert series(out, "GPUUtilization", 1)
    assert log.count("GPU 1: power not supported") == 1  # remembered, not retried every second


def test_throttle_samples_and_ecc_deltas(node_env, tmp_path):
    out, _ = drive(node_env, tmp_path, TWO_GPUS)
    first = {
        d["MetricName"]: d["Value"]
        for d in out["datums"]
        if "Value" in d
        and d["Timestamp"].startswith("2026-11-23 08:00")
        and {"Name": "GpuIndex", "Value": "0"} in d["Dimensions"]
    }
    assert first["GPUThrottleThermal"] == 30.0 and first["GPUThrottleHardwareSlowdown"] == 0.0
    assert first["GPUEccDoubleBitErrors"] == 2.0  # 0 -> 2 during the window


def test_lost_gpu_and_xid_79(node_env, tmp_path):
    scenario = TWO_GPUS + "at 10\ngpu 1 lost 1\nxid 1 79\n"
    out, log = drive(node_env, tmp_path, scenario, xids=1)
    lost = series(out, "GPULost", 1)
    assert sum(d["Value"] for d in lost) >= 50  # every round after round 10
    assert sum(d["Value"] for d in series(out, "GPUXidErrors", 1)) == 1.0
    assert series(out, "GPUUtilization", 0)[0]["Counts"] == [60.0]  # GPU 0 unaffected
    assert "XID 79 on GPU 1" in log and "GPU 1 is lost" in log


def test_old_driver_without_memory_info_v2_falls_back_to_v1(node_env, tmp_path):
    out, _ = drive(node_env, tmp_path, "no_memory_v2 1\n" + TWO_GPUS)
    [used] = [d for d in series(out, "GPUMemoryUsed", 0) if d["Timestamp"].startswith("2026-11-23 08:00")]
    assert used["StatisticValues"]["Maximum"] == 12400.0  # v1 counts the reserved 400 MiB as used


def run_main(env, tmp_path):
    config = tmp_path / "publisher.json"
    config.write_text(json.dumps({"imds_url": "http://127.0.0.1:9", "identity_cache": None}))
    return subprocess.run(
        [sys.executable, "-m", "gpufleet_node", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _real_nvml_installed():
    """A machine with NVIDIA's driver finds its libnvidia-ml.so.1 through the loader's cache whatever
    LD_LIBRARY_PATH says: the missing-library path cannot be staged there (seen on an H100 machine)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_no_library_is_one_clear_line_and_exit_code_3(node_env, tmp_path):
    if _real_nvml_installed():
        pytest.skip("NVIDIA's own libnvidia-ml.so.1 is installed here: a missing library cannot be staged")
    env = dict(node_env, LD_LIBRARY_PATH=str(tmp_path))  # no libnvidia-ml.so.1 there
    proc = run_main(env, tmp_path)
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no NVIDIA driver/NVML" in lines[0]


def test_driver_not_loaded_is_exit_code_3(node_env, tmp_path):
    scenario = tmp_path / "s.txt"
    scenario.write_text("driver_not_loaded 1\n")
    proc = run_main(dict(node_env, GPUFLEET_FAKE_NVML_SCENARIO=str(scenario)), tmp_path)
    assert proc.returncode == 3 and "Driver Not Loaded" in proc.stderr


def test_bad_config_is_exit_code_2(node_env, tmp_path):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"sample_interval": 1}))
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_node", "--config", str(config)], env=node_env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unknown key 'sample_interval'" in proc.stderr


SAMPLE_PROCESSES = """
import json, logging
from gpufleet_node.nvml import NvmlBackend
logging.basicConfig(level=logging.INFO)
b = NvmlBackend()
n = b.init()
b.process_utilization = True
b.clocks = True
out = []
for _ in range(3):
    for i in range(n):
        s = b.sample(i)
        out.append({"gpu": i, "clock": s.sm_clock_mhz, "uuid": b.describe(i).uuid, "name": b.describe(i).name,
                    "procs": None if s.processes is None else [[p.pid, p.memory_mib, p.sm_util] for p in s.processes]})
print(json.dumps(out))
"""

PROCESSES = """
gpus 3
gpu 0 util 70
gpu 0 sm_clock 1410
gpu 0 proc 4242 9000 60
gpu 0 proc 4343 3000 5
gpu 1 util 30
gpu 1 proc 5151 2000
gpu 1 notsupported clock
gpu 2 util 50
gpu 2 proc 6161 1000 50
gpu 2 notsupported proc_util
"""


def test_processes_with_their_sm_share_and_the_sm_clock(node_env, tmp_path):
    """Per-process utilization through nvmlDeviceGetProcessUtilization: only new samples are read (the
    second round of GPU 0 still has its shares because the fake stamps each round); a GPU without it
    (MIG, older boards) gives processes with no share and is not asked again; NotFound is quiet."""
    path = tmp_path / "scenario.txt"
    path.write_text(PROCESSES)
    env = dict(node_env, GPUFLEET_FAKE_NVML_SCENARIO=str(path))
    proc = subprocess.run([sys.executable, "-c", SAMPLE_PROCESSES], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rounds = json.loads(proc.stdout)
    first = {r["gpu"]: r for r in rounds[:3]}
    assert first[0]["procs"] == [[4242, 9000.0, 60.0], [4343, 3000.0, 5.0]] and first[0]["clock"] == 1410
    assert first[0]["uuid"] == "GPU-fake-0000" and first[0]["name"] == "Fake NVIDIA A10G"
    assert first[1]["procs"] == [[5151, 2000.0, None]] and first[1]["clock"] is None  # no share: NotFound
    assert first[2]["procs"] == [[6161, 1000.0, None]]  # not supported: remembered, no warning
    assert all(r["procs"][0][2] == 60.0 for r in rounds if r["gpu"] == 0)
    assert "WARNING" not in proc.stderr and proc.stderr.count("per-process utilization not supported") == 1
