"""/etc/gpufleet/publisher.json: every mistake is exit code 2 and one line naming the field and the value
(never a traceback and exit 1). Python >= 3.9."""

import json
from pathlib import Path

import pytest

from gpufleet_node import config, schema
from gpufleet_node.__main__ import EXIT_CONFIG, main

REPO = Path(__file__).resolve().parents[2]

BAD = [
    ('{"log_level": "LOUD"}', ["log_level", "'LOUD'"]),
    ('{"window_s": 1000000000000000000000000000000}', ["window_s", "1000000000000000000000"]),
    ('{"sample_interval_s": 1e400}', ["sample_interval_s", "inf"]),
    ('{"sample_interval_s": NaN}', ["sample_interval_s", "nan"]),
    ('{"buffer_max_age_s": 100000000000000000000}', ["buffer_max_age_s", "100000000000000000000"]),
    ('{"buffer_max_age_s": 60}', ["buffer_max_age_s", "60"]),
    ('{"buffer_max_age_s": 200, "window_s": 120}', ["buffer_max_age_s 200", "window_s 120"]),
    ('{"window_s": true}', ["window_s", "True"]),
    ('{"detail": "verbose"}', ["detail", "'verbose'", "adaptive"]),
    ('{"detail_gpus": "sometimes"}', ["detail_gpus", "'sometimes'"]),
    ('{"detail_memory_off_percent": 80}', ["detail_memory_off_percent", "80", "70"]),
    ('{"tag_refresh_s": 5}', ["tag_refresh_s", "5"]),
    ('{"region": "../../etc"}', ["region", "'../../etc'"]),
    ('{"endpoint_url": "ftp://x"}', ["endpoint_url", "'ftp://x'"]),
    ('{"identity_cache": "relative.json"}', ["identity_cache", "'relative.json'"]),
    ("[" * 20000 + "]" * 20000, ["nested too deeply"]),
    ("{" + " " * 70000 + "}", ["larger than"]),
    ('{"sample_interval": 1}', ["unknown key 'sample_interval'"]),
    ("[1, 2]", ["expected a JSON object"]),
    ("{not json", ["unreadable"]),
    # found by the fuzzer (tests/unit/test_fuzz_inputs.py): an integer past a float's range, lone surrogates
    ('{"sample_interval_s": 1%s}' % ("0" * 400), ["sample_interval_s", "between 0.1 and 60", "1000000"]),
    ('{"detail_memory_on_percent": -1%s}' % ("0" * 400), ["detail_memory_on_percent", "between 1 and 100"]),
    ('{"proc_root": "/proc\\udc00"}', ["proc_root", "UTF-8", "'/proc\\udc00'"]),
    ('{"identity_cache": "/var/lib/\\ud800x.json"}', ["identity_cache", "UTF-8", "\\ud800"]),
    ('{"host_filesystems": ["/", "/var/lib/c\\udc00ontainerd"]}', ["host_filesystems", "UTF-8", "\\udc00"]),
    ('{"endpoint_url": "https://logs\\udfff.example"}', ["endpoint_url", "UTF-8", "\\udfff"]),
    ('{"imds_url": "http://169.254.169.254/\\udbff"}', ["imds_url", "UTF-8", "\\udbff"]),
]


@pytest.mark.parametrize(("text", "said"), BAD, ids=[b[1][0][:30] for b in BAD])
def test_a_bad_value_is_exit_code_2_with_the_field_and_the_value(tmp_path, capsys, text, said):
    path = tmp_path / "publisher.json"
    path.write_text(text)
    assert main(["--config", str(path)]) == EXIT_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    for part in said:
        assert part in err[0]


def test_defaults_and_the_shipped_file_are_valid_and_adaptive():
    assert config.load(None)["detail"] == schema.DEFAULT_DETAIL == "adaptive"
    shipped = config.load(str(REPO / "ami" / "publisher.json"))
    assert shipped["detail"] == "adaptive" and shipped["detail_gpus"] == "auto"
    assert set(json.loads((REPO / "ami" / "publisher.json").read_text())) <= set(config.DEFAULTS)


def test_the_log_level_is_case_insensitive(tmp_path):
    path = tmp_path / "publisher.json"
    path.write_text('{"log_level": "debug", "detail": "full", "buffer_max_age_s": 600}')
    loaded = config.load(str(path))
    assert loaded["log_level"] == "DEBUG" and loaded["detail"] == "full"


def test_the_endpoint_address_is_an_ip_address(tmp_path):
    from gpufleet_node import config as cfg

    # every interface by default: a Prometheus in the pod network must reach the node's IP
    assert cfg.DEFAULTS["prometheus_address"] == "0.0.0.0"
    for good in ("0.0.0.0", "127.0.0.1", "::", "::1", "::ffff:10.0.0.1"):
        path = tmp_path / "ok.json"
        path.write_text('{"prometheus_address": "%s"}' % good)
        assert cfg.load(str(path))["prometheus_address"] == good
    for bad in ("999.1.1.1", "cafe", "localhost"):
        path = tmp_path / "bad.json"
        path.write_text('{"prometheus_address": "%s"}' % bad)
        with pytest.raises(cfg.ConfigError, match="prometheus_address must be an IP address"):
            cfg.load(str(path))
