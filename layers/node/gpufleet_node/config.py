"""The publisher's configuration: /etc/gpufleet/publisher.json, every key optional. Python >= 3.9."""

import json
from typing import Any, Dict, Optional

DEFAULT_PATH = "/etc/gpufleet/publisher.json"

DEFAULTS: Dict[str, Any] = {
    "sample_interval_s": 1.0,  # NVML reads per GPU per second
    "window_s": 60,  # one PutMetricData per window
    "detail": "full",  # or "essential": only the series the controller reads (CloudWatch bills per series)
    "high_resolution": False,  # also send GPUUtilization / GPUMemoryUsedPercent every 10 s (1 s storage)
    "buffer_max_age_s": 7200,  # keep unsent windows this long while CloudWatch is unreachable
    "imds_url": "http://169.254.169.254",
    "identity_cache": "/var/lib/gpufleet/identity.json",
    "region": None,  # default: from IMDS
    "endpoint_url": None,  # e.g. a VPC endpoint for CloudWatch
    "log_level": "INFO",
}

_TYPES = {
    "sample_interval_s": (int, float),
    "window_s": (int,),
    "detail": (str,),
    "high_resolution": (bool,),
    "buffer_max_age_s": (int,),
    "imds_url": (str,),
    "identity_cache": (str, type(None)),
    "region": (str, type(None)),
    "endpoint_url": (str, type(None)),
    "log_level": (str,),
}


class ConfigError(ValueError):
    pass


def load(path: Optional[str]) -> Dict[str, Any]:
    """Defaults overlaid with the file (a missing default path is fine; a missing explicit one is not)."""
    config = dict(DEFAULTS)
    if path is None:
        return config
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        if path == DEFAULT_PATH:
            return config
        raise ConfigError("config file %s not found" % path) from None
    except (OSError, ValueError) as exc:
        raise ConfigError("config file %s unreadable: %s" % (path, exc)) from None
    if not isinstance(doc, dict):
        raise ConfigError("%s: expected a JSON object" % path)
    for key, value in doc.items():
        if key not in DEFAULTS:
            raise ConfigError("%s: unknown key %r (known: %s)" % (path, key, ", ".join(sorted(DEFAULTS))))
        if (isinstance(value, bool) and bool not in _TYPES[key]) or not isinstance(value, _TYPES[key]):
            raise ConfigError(
                "%s: %s must be %s (got %r)" % (path, key, "/".join(t.__name__ for t in _TYPES[key]), value)
            )
        config[key] = value
    if not 0.1 <= float(config["sample_interval_s"]) <= 60:
        raise ConfigError("%s: sample_interval_s must be between 0.1 and 60" % path)
    if config["detail"] not in ("full", "essential"):
        raise ConfigError("%s: detail must be 'full' or 'essential'" % path)
    if config["window_s"] not in (10, 30, 60, 120, 300):
        raise ConfigError("%s: window_s must be one of 10, 30, 60, 120, 300" % path)
    return config
