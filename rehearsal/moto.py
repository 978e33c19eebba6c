"""Start moto server on 127.0.0.1 (a real HTTP endpoint) and point boto3 at it."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REGION = "us-east-1"
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _server_env() -> dict[str, str]:
    """A speed-up, not an emulation: for each region's EC2 backend moto builds its ~2,000 ECS-optimised
    AMIs, on every reset (which rebuilds every loaded backend) and again on the first EC2 call after it,
    0.2 s each time. Only moto's own 44 default AMIs are served (MOTO_AMIS_PATH, moto's documented knob):
    the images DescribeImages lists first and the tests name; nothing here launches anything else."""
    from importlib import resources

    import moto

    amis = Path(tempfile.gettempdir()) / f"gpufleet-moto-{moto.__version__}-default-amis.json"
    if not amis.exists():
        data = gzip.decompress((resources.files("moto") / "ec2/resources/amis.json.gz").read_bytes())
        partial = amis.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(data)
        partial.replace(amis)  # whole or absent: two sessions starting at once both write it
    return {**os.environ, "MOTO_AMIS_PATH": str(amis)}


class MotoServer:
    """A moto server subprocess bound to loopback; `reset()` wipes every backend."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            # moto server plus injectable scaling activities (rehearsal.moto_ext: emulation, labelled there)
            [sys.executable, "-m", "rehearsal.moto_ext", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=self._log,
            env=_server_env(),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self._proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto server did not start within 30 s")

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=120):  # every backend reset: seconds on a loaded machine
            pass

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        if hasattr(self._log, "close"):
            self._log.close()


@contextmanager
def aws_environment(endpoint: str) -> Iterator[None]:
    """Every boto3 client created inside talks to `endpoint` with fake credentials."""
    saved = dict(os.environ)
    os.environ.update(FAKE_CREDENTIALS)
    os.environ["AWS_DEFAULT_REGION"] = REGION
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ.pop("AWS_PROFILE", None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def moto_server(log_path: Path | None = None) -> Iterator[MotoServer]:
    server = MotoServer(log_path)
    try:
        with aws_environment(server.url):
            yield server
    finally:
        server.stop()
