"""A self-signed certificate for 127.0.0.1, for tests that serve a stand-in API over TLS."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def self_signed_certificate(folder: Path) -> tuple[str, str]:
    """(certificate, key) files for CN kube-api, IP 127.0.0.1, made with openssl; the test is skipped where
    there is no openssl."""
    cert, key = folder / "api.crt", folder / "api.key"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kube-api"]
    command += ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"no openssl to make a test certificate: {err}")
    return str(cert), str(key)
