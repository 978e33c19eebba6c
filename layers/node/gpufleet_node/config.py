"""The publisher's configuration: /etc/gpufleet/publisher.json, every key optional. Python >= 3.9.

Every value is checked against its type and range here, so a mistake stops the service with exit code 2
and one line naming the field and the value, never a traceback later (a log level logging does not know,
a number too big for a timedelta, JSON nested deeper than the parser's recursion limit).
"""

import ipaddress
import json
import re
from typing import Any, Callable, Dict, Optional, Tuple

from gpufleet_node import schema

DEFAULT_PATH = "/etc/gpufleet/publisher.json"
MAX_FILE_BYTES = 64 * 1024
WINDOWS = (10, 30, 60, 120, 300)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_BUFFER_AGE_S = 21600  # the buffer lives in memory: 6 h of full-detail windows is ~60k datums

DEFAULTS: Dict[str, Any] = {
    "sample_interval_s": 1.0,  # NVML reads per GPU per second
    "window_s": 60,  # one PutMetricData per window
    "detail": schema.DEFAULT_DETAIL,  # "adaptive" | "essential" | "full" (schema.py: what each sends)
    "detail_gpus": "auto",  # "always": every GPU's own series all the time (adaptive; like the tag)
    "detail_memory_on_percent": schema.DETAIL_MEMORY_ON_PERCENT,  # a GPU's series on at this memory use
    "detail_memory_off_percent": schema.DETAIL_MEMORY_OFF_PERCENT,  # ... and off again below this
    "high_resolution": False,  # also send GPUUtilization / GPUMemoryUsedPercent every 10 s (1 s storage)
    "buffer_max_age_s": 7200,  # keep unsent windows this long while CloudWatch is unreachable
    "imds_url": "http://169.254.169.254",
    "identity_cache": "/var/lib/gpufleet/identity.json",
    # A SageMaker HyperPod node's cluster and instance group (identity.py); absent elsewhere.
    "hyperpod_resource_config": "/opt/ml/config/resource_config.json",
    "tag_refresh_s": 600,  # read the instance tags again this often (gpufleet:detail); 0 = only at start
    "region": None,  # default: from IMDS
    "endpoint_url": None,  # every AWS call the node makes (a local stack); per service: AWS_ENDPOINT_URL_<SERVICE>
    "log_level": "INFO",
    # Who used the GPUs (docs/attribution.md): each GPU process's pod, Slurm job, unit or user, and the
    # GPUs the kubelet allocated to pods; one record per usage window to CloudWatch Logs.
    "attribution": True,
    "usage_window_s": schema.USAGE_WINDOW_S,
    "usage_log_group": schema.USAGE_LOG_GROUP,
    "pod_resources_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
    "proc_root": "/proc",
    "kubelet_log_root": "/var/log",  # the kubelet's pods/ and containers/ name the pods behind cgroups
    # The Prometheus endpoint (docs/prometheus.md): off unless switched on; dcgm-exporter's port.
    "prometheus": False,
    "prometheus_port": 9400,
    # Every interface by default: a Prometheus in the pod network (or the AMP scraper in the VPC) reaches
    # the node's IP. An agent on the node itself: "127.0.0.1"; one interface only: the node's IP. Who may
    # connect is the security group's business; how much a connection may take is scrape_server.py's.
    "prometheus_address": "0.0.0.0",
    # The host under the GPUs (host.py): memory, swap, the fullest of these filesystems; EFA in `full`.
    "host_metrics": True,
    "host_filesystems": list(schema.DEFAULT_HOST_FILESYSTEMS),
}

_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")
_LOG_GROUP = re.compile(r"^[A-Za-z0-9_\-/.#]{1,512}$")  # CloudWatch Logs' log group name characters

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")


class ConfigError(ValueError):
    pass


def _number(low: float, high: float) -> Callable[[Any], Optional[str]]:
    def check(value: Any) -> Optional[str]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "a number"
        if not low <= value <= high:  # False for NaN; exact for an int past a float's range (no OverflowError)
            return "between %g and %g" % (low, high)
        return None

    return check


def _integer(low: int, high: int, also: Tuple[int, ...] = ()) -> Callable[[Any], Optional[str]]:
    def check(value: Any) -> Optional[str]:
        if isinstance(value, bool) or not isinstance(value, int):
            return "an integer"
        if value not in also and not low <= value <= high:
            return "an integer between %d and %d%s" % (low, high, "".join(" or %d" % a for a in also))
        return None

    return check


def _one_of(*allowed: Any) -> Callable[[Any], Optional[str]]:
    def check(value: Any) -> Optional[str]:
        if isinstance(value, bool) or value not in allowed:
            return "one of " + ", ".join(str(a) for a in allowed)
        return None

    return check


def _text(pattern: "re.Pattern[str]", what: str, optional: bool) -> Callable[[Any], Optional[str]]:
    def check(value: Any) -> Optional[str]:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not pattern.match(value):
            return what + (" or null" if optional else "")
        return None

    return check


def _boolean(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else "true or false"


def _path(value: Any) -> Optional[str]:
    if value is None or (isinstance(value, str) and value.startswith("/") and "\0" not in value):
        return None
    return "an absolute path or null"


def _ip_address(value: Any) -> Optional[str]:
    try:
        ipaddress.ip_address(value if isinstance(value, str) else "")
    except ValueError:
        return "an IP address to listen on (0.0.0.0: every interface)"
    return None


def _paths(value: Any) -> Optional[str]:
    """Mount points: a list of 1 to 16 absolute paths."""
    if not isinstance(value, list) or not 1 <= len(value) <= 16 or any(_path(v) or v is None for v in value):
        return "a list of 1 to 16 absolute paths"
    return None


def _log_level(value: Any) -> Optional[str]:
    if isinstance(value, str) and value.upper() in LOG_LEVELS:
        return None
    return "one of " + ", ".join(LOG_LEVELS)


_CHECKS: Dict[str, Callable[[Any], Optional[str]]] = {
    "sample_interval_s": _number(0.1, 60),
    "window_s": _one_of(*WINDOWS),
    "detail": _one_of(*schema.DETAIL_MODES),
    "detail_gpus": _one_of("auto", "always"),
    "detail_memory_on_percent": _number(1, 100),
    "detail_memory_off_percent": _number(0, 99),
    "high_resolution": _boolean,
    "buffer_max_age_s": _integer(120, MAX_BUFFER_AGE_S),
    "imds_url": _text(_URL, "an http:// or https:// URL", optional=False),
    "identity_cache": _path,
    "hyperpod_resource_config": _path,
    "tag_refresh_s": _integer(60, 86400, also=(0,)),
    "region": _text(_REGION, "an AWS region name like us-east-1", optional=True),
    "endpoint_url": _text(_URL, "an http:// or https:// URL", optional=True),
    "log_level": _log_level,
    "attribution": _boolean,
    "usage_window_s": _one_of(60, 300, 600, 900, 1800, 3600),
    "usage_log_group": _text(_LOG_GROUP, "a CloudWatch Logs group name", optional=False),
    "pod_resources_socket": _path,
    "proc_root": _path,
    "kubelet_log_root": _path,
    "prometheus": _boolean,
    "prometheus_port": _integer(1, 65535),
    "prometheus_address": _ip_address,
    "host_metrics": _boolean,
    "host_filesystems": _paths,
}


def _utf8(value: Any) -> Optional[str]:
    """JSON's \\ud800 escapes give lone surrogates, which no path, URL or log line can hold (nor a list
    of paths: host_filesystems)."""
    if isinstance(value, list):
        return next((w for w in map(_utf8, value) if w is not None), None)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "UTF-8 text (without a lone \\udXXX surrogate escape)"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _read(path: str) -> Any:
    with open(path, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError("config file %s is larger than %d bytes" % (path, MAX_FILE_BYTES))
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ConfigError("config file %s: JSON nested too deeply" % path) from None


def load(path: Optional[str]) -> Dict[str, Any]:
    """Defaults overlaid with the file (a missing default path is fine; a missing explicit one is not)."""
    config = dict(DEFAULTS)
    if path is None:
        return config
    try:
        doc = _read(path)
    except FileNotFoundError:
        if path == DEFAULT_PATH:
            return config
        raise ConfigError("config file %s not found" % path) from None
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, bad UTF-8, too many digits
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("config file %s unreadable: %s" % (path, exc)) from None
    if not isinstance(doc, dict):
        raise ConfigError("%s: expected a JSON object" % path)
    for key, value in doc.items():
        if key not in DEFAULTS:
            raise ConfigError("%s: unknown key %r (known: %s)" % (path, key, ", ".join(sorted(DEFAULTS))))
        wanted = _utf8(value) or _CHECKS[key](value)
        if wanted is not None:
            raise ConfigError("%s: %s must be %s (got %s)" % (path, key, wanted, _shown(value)))
        config[key] = value
    _cross_check(path, config)
    config["log_level"] = config["log_level"].upper()
    return config


def _cross_check(path: str, config: Dict[str, Any]) -> None:
    """Rules between fields: each names both values."""
    if config["buffer_max_age_s"] < 2 * config["window_s"]:
        raise ConfigError(
            "%s: buffer_max_age_s must be at least twice window_s, or windows expire before they are sent "
            "(got buffer_max_age_s %s, window_s %s)" % (path, config["buffer_max_age_s"], config["window_s"])
        )
    if config["detail_memory_off_percent"] >= config["detail_memory_on_percent"]:
        raise ConfigError(
            "%s: detail_memory_off_percent must be below detail_memory_on_percent (hysteresis) "
            "(got %s and %s)" % (path, config["detail_memory_off_percent"], config["detail_memory_on_percent"])
        )
