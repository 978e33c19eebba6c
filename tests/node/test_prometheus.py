"""The Prometheus endpoint, scraped over real HTTP on loopback and read back with prometheus_client's
own parsers: gpufleet's names, dcgm-exporter's names and labels, and a scrape that never fails.
Runs under Python 3.9 (Amazon Linux 2023) and 3.13."""

import re
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from gpufleet_node import prometheus
from gpufleet_node.nvml import GpuSample, ProcessUse
from gpufleet_node.prometheus import FIELDS, GpuCollector, GpuView, serve
from gpufleet_node.scrape_server import Limits
from gpufleet_node.usage import Holder
from gpufleet_node.workload import Workload

MIB = 1024 * 1024
MODEL = "NVIDIA H100 80GB HBM3"
HOST = "ip-10-0-1-23.ec2.internal"
DCGM_BASE = {"gpu", "UUID", "device", "modelName", "Hostname"}
TRAINER = Workload("pod", namespace="team-a", pod="trainer-0", container="main")
INFER_A = Workload("pod", namespace="team-b", pod="infer-a", container="server")
INFER_B = Workload("pod", namespace="team-c", pod="infer-b", container="server")
SLURM_JOB = Workload("slurm", job_id="4242", user="alice")

Series = List[Tuple[Dict[str, str], float]]
FRESH = Limits(render_every_s=0, responses_per_s=1000)


def busy(**overrides: object) -> GpuSample:
    """A busy H100: every field NVML offers is known."""
    fields: Dict[str, object] = {
        "utilization": 87.0,
        "mem_controller_busy": 41.0,
        "memory_total_mib": 81559.0,
        "memory_used_mib": 40000.0,
        "memory_free_mib": 41000.0,
        "power_w": 612.5,
        "power_limit_w": 700.0,
        "temperature_c": 66.0,
        "memory_temperature_c": 74.0,
        "throttle_reasons": 0x4,
        "ecc_double_bit_total": 0.0,
        "remapped_uncorrectable_total": 0.0,
        "process_count": 1,
        "top_process_mib": 40000.0,
        "processes": [ProcessUse(4100, 40000.0, 80.0)],
        "sm_clock_mhz": 1980.0,
    }
    fields.update(overrides)
    return GpuSample(**fields)  # type: ignore[arg-type]


def view(index: int, sample: Optional[GpuSample] = None, **kw: object) -> GpuView:
    return GpuView(index, "GPU-%08d" % index, MODEL, sample or busy(), **kw)  # type: ignore[arg-type]


class Scraper:
    """One endpoint on 127.0.0.1 (a free port) and its scrapes, parsed. Every scrape renders afresh and
    the response rate is out of the way: these tests change the views between scrapes
    (test_prometheus_bounds.py tests the cache and the bounds)."""

    def __init__(self, collector: GpuCollector) -> None:
        self.collector = collector
        self.endpoint = serve(collector, 0, "127.0.0.1", FRESH)

    def text(self, accept: Optional[str] = None) -> str:
        headers = {"Accept": accept} if accept else {}
        req = urllib.request.Request("http://127.0.0.1:%d/metrics" % self.endpoint.port, headers=headers)
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
            return resp.read().decode("utf-8")

    def scrape(self) -> Dict[str, Series]:
        """Sample name -> [(labels, value)], from the Prometheus text format."""
        out: Dict[str, Series] = {}
        for family in text_string_to_metric_families(self.text()):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), s.value))
        return out


@pytest.fixture(scope="module")
def shared() -> Iterator[Scraper]:
    """One real endpoint for the module."""
    scraper = Scraper(GpuCollector(HOST, list, "i-0abc"))
    yield scraper
    scraper.endpoint.stop()


@pytest.fixture
def endpoint(shared: Scraper) -> Callable[..., Scraper]:
    """Points the shared endpoint's collector at these views, with these switches, errors at 0."""

    def start(
        views: Callable[[], Sequence[GpuView]], dcgm: bool = True, engine_active_from_nvml: bool = True
    ) -> Scraper:
        c = shared.collector
        c.views, c.dcgm, c.engine_active_from_nvml, c.errors = views, dcgm, engine_active_from_nvml, 0
        return shared

    return start


def of_gpu(series: Series, uuid: str, key: str = "UUID") -> Series:
    return [(labels, value) for labels, value in series if labels.get(key) == uuid]


def test_attributed_gpu_gets_dcgm_names_with_pod_labels_and_gpufleet_names_in_base_units(endpoint):
    got = endpoint(lambda: [view(0, workloads=[TRAINER])]).scrape()
    expected = {
        "DCGM_FI_DEV_GPU_UTIL": 87.0,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0,
        "DCGM_FI_DEV_FB_USED": 40000.0,
        "DCGM_FI_DEV_FB_FREE": 41000.0,
        "DCGM_FI_DEV_FB_RESERVED": 559.0,
        "DCGM_FI_DEV_POWER_USAGE": 612.5,
        "DCGM_FI_DEV_GPU_TEMP": 66.0,
        "DCGM_FI_DEV_MEMORY_TEMP": 74.0,
        "DCGM_FI_DEV_SM_CLOCK": 1980.0,
        "DCGM_FI_DEV_XID_ERRORS": 0.0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.87,
    }
    for name, value in expected.items():
        assert len(got[name]) == 1, name
        labels, got_value = got[name][0]
        assert got_value == pytest.approx(value), name
        assert labels == {
            "gpu": "0",
            "UUID": "GPU-00000000",
            "device": "nvidia0",
            "modelName": MODEL,
            "Hostname": HOST,
            "pod": "trainer-0",
            "namespace": "team-a",
            "container": "main",
        }, name
    base = {"gpu": "0", "uuid": "GPU-00000000", "model": MODEL, "hostname": HOST, "instance_id": "i-0abc"}
    gpufleet = {
        "gpufleet_gpu_utilization_percent": 87.0,
        "gpufleet_gpu_memory_used_bytes": 40000.0 * MIB,
        "gpufleet_gpu_memory_free_bytes": 41000.0 * MIB,
        "gpufleet_gpu_memory_total_bytes": 81559.0 * MIB,
        "gpufleet_gpu_power_watts": 612.5,
        "gpufleet_gpu_power_limit_watts": 700.0,
        "gpufleet_gpu_temperature_celsius": 66.0,
        "gpufleet_gpu_memory_temperature_celsius": 74.0,
        "gpufleet_gpu_sm_clock_hertz": 1.98e9,
        "gpufleet_gpu_clock_event_reasons": 4.0,
        "gpufleet_gpu_processes": 1.0,
        "gpufleet_gpu_ecc_double_bit_errors_total": 0.0,
        "gpufleet_gpu_remapped_rows_uncorrectable_total": 0.0,
        "gpufleet_gpu_last_xid": 0.0,
        "gpufleet_gpu_lost": 0.0,
        "gpufleet_gpu_workloads": 1.0,
    }
    for name, value in gpufleet.items():
        assert got[name] == [(base, pytest.approx(value))], name  # one series per GPU, no pod labels


def test_unattributed_gpu_has_no_pod_labels_at_all(endpoint):
    got = endpoint(lambda: [view(0, workloads=[TRAINER]), view(1)]).scrape()
    idle = of_gpu(got["DCGM_FI_DEV_GPU_UTIL"], "GPU-00000001")
    assert len(idle) == 1
    labels = idle[0][0]
    assert set(labels) == DCGM_BASE  # absent, not empty: OpenCost's container!="" drops it, as dcgm-exporter's
    assert "container" not in labels and "pod" not in labels and "namespace" not in labels
    # OpenCost's usage query: DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""} by (container, pod, namespace)
    with_container = [(lb, v) for lb, v in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] if lb.get("container", "") != ""]
    assert [(lb["pod"], lb["gpu"]) for lb, _ in with_container] == [("trainer-0", "0")]
    assert 0.0 <= with_container[0][1] <= 1.0  # a ratio, as DCGM's profiling field
    assert got["gpufleet_gpu_workloads"][1][1] == 0.0
    assert "gpufleet_gpu_workload_info" not in got or not of_gpu(
        got["gpufleet_gpu_workload_info"], "GPU-00000001", "uuid"
    )


def test_shared_gpu_gives_one_series_per_pod(endpoint):
    got = endpoint(lambda: [view(0, workloads=[INFER_A, INFER_B])]).scrape()
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"):
        pods = sorted((lb.get("namespace"), lb.get("pod")) for lb, _ in got[name])
        assert pods == [("team-b", "infer-a"), ("team-c", "infer-b")], name  # no device-level series
        assert {v for _, v in got[name]} == {got[name][0][1]}  # each carries the device value
    assert got["gpufleet_gpu_workloads"][0][1] == 2.0
    assert len(got["gpufleet_gpu_utilization_percent"]) == 1  # gpufleet's names stay one series per GPU
    info = sorted(lb["pod"] for lb, _ in got["gpufleet_gpu_workload_info"])
    assert info == ["infer-a", "infer-b"]


def test_shared_gpu_with_process_sums_gives_each_pod_its_own_util_and_memory(endpoint):
    sample = busy(
        utilization=70.0,
        memory_used_mib=30000.0,
        processes=[ProcessUse(10, 24000.0, 55.0), ProcessUse(11, 6000.0, 15.0)],
        process_count=2,
    )
    holders = [Holder(INFER_A, 24000.0, 55.0, 1), Holder(INFER_B, 6000.0, 15.0, 1)]
    got = endpoint(lambda: [view(0, sample, holders=holders)]).scrape()

    def by_pod(name: str) -> Dict[Optional[str], float]:
        return {lb.get("pod"): v for lb, v in got[name]}

    # dcgm-exporter >= 4.5.3 with time-slicing: the device-level series plus each pod's processes' part.
    assert by_pod("DCGM_FI_DEV_FB_USED") == {None: 30000.0, "infer-a": 24000.0, "infer-b": 6000.0}
    assert by_pod("DCGM_FI_DEV_GPU_UTIL") == {None: 70.0, "infer-a": 55.0, "infer-b": 15.0}
    assert by_pod("DCGM_FI_DEV_POWER_USAGE") == {"infer-a": 612.5, "infer-b": 612.5}  # others: copies
    mem = {lb["pod"]: v for lb, v in got["gpufleet_gpu_workload_memory_bytes"]}
    assert mem == {"infer-a": 24000.0 * MIB, "infer-b": 6000.0 * MIB}
    sm = {lb["pod"]: v for lb, v in got["gpufleet_gpu_workload_sm_utilization_percent"]}
    assert sm == {"infer-a": 55.0, "infer-b": 15.0}


def test_shared_gpu_without_per_process_utilization_falls_back_to_copies(endpoint):
    sample = busy(processes=[ProcessUse(10, 24000.0, None), ProcessUse(11, 6000.0, None)], process_count=2)
    holders = [Holder(INFER_A, 24000.0, None, 1), Holder(INFER_B, 6000.0, None, 1)]
    got = endpoint(lambda: [view(0, sample, holders=holders)]).scrape()
    assert {lb.get("pod"): v for lb, v in got["DCGM_FI_DEV_GPU_UTIL"]} == {"infer-a": 87.0, "infer-b": 87.0}
    assert {lb.get("pod"): v for lb, v in got["DCGM_FI_DEV_FB_USED"]} == {
        None: 40000.0,
        "infer-a": 24000.0,
        "infer-b": 6000.0,
    }
    assert "gpufleet_gpu_workload_sm_utilization_percent" not in got


def test_slurm_job_gets_dcgm_hpc_job_label_and_gpufleet_workload_labels(endpoint):
    got = endpoint(lambda: [view(0, workloads=[SLURM_JOB])]).scrape()
    labels = got["DCGM_FI_DEV_GPU_UTIL"][0][0]
    assert labels["hpc_job"] == "4242" and "pod" not in labels
    info = got["gpufleet_gpu_workload_info"][0][0]
    assert info["kind"] == "slurm" and info["slurm_job"] == "4242" and info["user"] == "alice"
    assert info["team"] == "alice"
    assert "job" not in info  # Prometheus's own target label; it would become exported_job


def test_workload_info_carries_kind_namespace_pod_container_team(endpoint):
    got = endpoint(lambda: [view(3, workloads=[TRAINER])]).scrape()
    assert got["gpufleet_gpu_workload_info"] == [
        (
            {
                "gpu": "3",
                "uuid": "GPU-00000003",
                "model": MODEL,
                "hostname": HOST,
                "instance_id": "i-0abc",
                "kind": "pod",
                "namespace": "team-a",
                "pod": "trainer-0",
                "container": "main",
                "team": "team-a",
            },
            1.0,
        )
    ]


def test_a_none_field_leaves_only_that_series_out(endpoint):
    partial = busy(memory_temperature_c=None, sm_clock_mhz=None, power_w=None, memory_free_mib=None)
    got = endpoint(lambda: [view(0, partial), view(1)]).scrape()
    for name in (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",  # needs total, used and free
        "gpufleet_gpu_memory_temperature_celsius",
        "gpufleet_gpu_sm_clock_hertz",
        "gpufleet_gpu_power_watts",
    ):
        key = "uuid" if name.startswith("gpufleet") else "UUID"
        assert [lb[key] for lb, _ in got[name]] == ["GPU-00000001"], name
    assert len(got["DCGM_FI_DEV_GPU_UTIL"]) == 2 and len(got["gpufleet_gpu_temperature_celsius"]) == 2


def test_a_lost_gpu_shows_only_gpufleet_gpu_lost(endpoint):
    got = endpoint(lambda: [view(0), view(1, GpuSample(lost=True), workloads=[TRAINER])]).scrape()
    lost = {lb["uuid"]: v for lb, v in got["gpufleet_gpu_lost"]}
    assert lost == {"GPU-00000000": 0.0, "GPU-00000001": 1.0}
    for name, series in got.items():
        if name == "gpufleet_gpu_lost":
            continue
        assert not of_gpu(series, "GPU-00000001") and not of_gpu(series, "GPU-00000001", "uuid"), name


class Exploding:
    """A sample whose reading fails halfway: a bug, or a field of the wrong kind."""

    lost = False
    utilization = 50.0
    processes = None

    def __getattr__(self, name: str) -> object:
        raise RuntimeError("broken sample: %s" % name)


def test_a_gpu_that_fails_to_render_is_left_out_whole_and_counted(endpoint):
    bad = GpuView(1, "GPU-00000001", MODEL, Exploding())  # type: ignore[arg-type]
    scraper = endpoint(lambda: [view(0), bad, view(2)])
    got = scraper.scrape()
    for series in got.values():
        assert not of_gpu(series, "GPU-00000001") and not of_gpu(series, "GPU-00000001", "uuid")
    assert sorted(lb["gpu"] for lb, _ in got["DCGM_FI_DEV_GPU_UTIL"]) == ["0", "2"]
    assert got["gpufleet_prometheus_collect_errors_total"] == [({"hostname": HOST}, 1.0)]


def test_views_that_raise_still_answer_the_scrape_and_count_the_error(endpoint):
    calls = []

    def views() -> Sequence[GpuView]:
        calls.append(1)
        if len(calls) <= 2:
            raise OSError("publisher state unreadable")
        return [view(0)]

    scraper = endpoint(views)
    first = scraper.scrape()
    assert first == {"gpufleet_prometheus_collect_errors_total": [({"hostname": HOST}, 1.0)]}
    assert scraper.scrape()["gpufleet_prometheus_collect_errors_total"][0][1] == 2.0
    third = scraper.scrape()  # the endpoint lived through it and serves GPUs again
    assert third["DCGM_FI_DEV_GPU_UTIL"][0][1] == 87.0
    assert third["gpufleet_prometheus_collect_errors_total"][0][1] == 2.0


def test_values_that_are_not_numbers_are_left_out(endpoint):
    got = endpoint(lambda: [view(0, busy(power_w=float("nan"), temperature_c="hot"))]).scrape()  # type: ignore[arg-type]
    assert "DCGM_FI_DEV_POWER_USAGE" not in got and "gpufleet_gpu_temperature_celsius" not in got
    assert got["DCGM_FI_DEV_GPU_UTIL"][0][1] == 87.0


def test_dashboard_12239_and_opencost_names_are_present(endpoint):
    """Grafana dashboard 12239 (dcgm-exporter's grafana/dcgm-exporter-dashboard.json) selects by `instance`
    (Prometheus's target label) and `gpu`, its variables come from label_values(DCGM_FI_DEV_GPU_TEMP, ...);
    OpenCost groups DCGM series by container, pod, namespace, device, modelName and UUID."""
    got = endpoint(lambda: [view(i, workloads=[TRAINER] if i == 0 else ()) for i in range(8)]).scrape()
    dashboard = (
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
    )
    for name in dashboard:
        assert sorted(int(lb["gpu"]) for lb, _ in got[name]) == list(range(8)), name
    opencost = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_XID_ERRORS")
    for name in opencost:
        attributed = [lb for lb, _ in got[name] if lb.get("container")]
        assert attributed and {"container", "pod", "namespace", "device", "modelName", "UUID"} <= set(attributed[0])
    # The tensor-core panel (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) needs DCGM profiling: NVML has no such counter.
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in got


def test_openmetrics_scrape_parses_and_counters_end_in_total(endpoint):
    scraper = endpoint(lambda: [view(0, holders=[Holder(TRAINER, 40000.0, 80.0, 1)]), view(1)])
    text = scraper.text("application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert text.rstrip().endswith("# EOF")
    families = {f.name: f for f in parse_openmetrics(text)}
    assert families["gpufleet_gpu_ecc_double_bit_errors"].type == "counter"
    assert families["gpufleet_gpu_ecc_double_bit_errors"].samples[0].name.endswith("_total")
    assert families["gpufleet_gpu_workload"].type == "info"
    assert families["DCGM_FI_DEV_GPU_UTIL"].type == "gauge"
    assert families["gpufleet_gpu_workload_memory_bytes"].samples[0].value == 40000.0 * MIB


def test_concurrent_scrapes_all_answer_whole(endpoint):
    scraper = endpoint(lambda: [view(i, workloads=[TRAINER] if i < 4 else ()) for i in range(8)])
    with ThreadPoolExecutor(max_workers=4) as pool:
        texts = list(pool.map(lambda _: scraper.text(), range(32)))
    counts = {sum(len(f.samples) for f in text_string_to_metric_families(t)) for t in texts}
    assert len(counts) == 1 and counts.pop() > 8 * 20


def test_dcgm_names_and_the_engine_ratio_can_be_switched_off(endpoint):
    plain = endpoint(lambda: [view(0)], dcgm=False).scrape()
    assert not [n for n in plain if n.startswith("DCGM_")]
    assert "gpufleet_gpu_utilization_percent" in plain
    no_ratio = endpoint(lambda: [view(0)], engine_active_from_nvml=False).scrape()
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in no_ratio and "DCGM_FI_DEV_GPU_UTIL" in no_ratio


def test_own_registry_has_no_process_or_python_series(endpoint):
    got = endpoint(lambda: [view(0)]).scrape()
    assert all(n.startswith(("gpufleet_", "DCGM_")) for n in got), sorted(got)


def test_stop_frees_the_port_for_a_restart():
    collector = GpuCollector(HOST, lambda: [view(0)])
    first = serve(collector, 0, "127.0.0.1")
    port = first.port
    first.stop()
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))  # released
    again = serve(collector, port, "127.0.0.1")
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as resp:
            assert b"DCGM_FI_DEV_GPU_UTIL" in resp.read()
    finally:
        again.stop()


def test_metric_table_is_one_consistent_source():
    names = [f.gpufleet.name for f in FIELDS if f.gpufleet] + [f.dcgm.name for f in FIELDS if f.dcgm]
    assert len(names) == len(set(names))
    for f in FIELDS:
        if f.gpufleet:
            assert re.match(r"^gpufleet_gpu_[a-z0-9_]+$", f.gpufleet.name), f.gpufleet.name
            assert not f.gpufleet.name.endswith("_total")  # counters get it when exposed
            assert f.gpufleet.kind in ("gauge", "counter")
        if f.dcgm:
            assert re.match(r"^DCGM_FI_(DEV|PROF)_[A-Z_]+$", f.dcgm.name) and f.dcgm.kind == "gauge"
    units = {"_percent", "_bytes", "_watts", "_celsius", "_hertz"}
    gauges = [f.gpufleet.name for f in FIELDS if f.gpufleet and f.gpufleet.kind == "gauge"]
    assert sum(any(n.endswith(u) for u in units) for n in gauges) >= 9
    assert prometheus.workload_labels(Workload("unit", unit="train.service")) == {
        "kind": "unit",
        "unit": "train.service",
        "team": "train.service",
    }
