"""The local stack's Kubernetes API (EMULATED: not Kubernetes). moto's EKS answers DescribeCluster with an
endpoint nobody serves and a certificate authority of random text, so neither the scaler nor `doctor` can
read a local cluster's pods there. `gpufleet local nodegroup` starts one of these per cluster on
127.0.0.1 (plain http: only loopback may) and hands it to both through GPUFLEET_KUBE_ENDPOINTS, with a
static token, as a cluster outside EKS's DescribeCluster is given. It serves the pod listing of
`rehearsal.kube_api` (the API's own JSON, paging, field selectors) from a JSON file of pods that
`gpufleet local pod` writes: each new listing reads the file again.

Run as `python -m gpufleet_tools.local_kube --pods FILE --port PORT`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpufleet_tools.local_servers import await_answer
from rehearsal.kube_api import KubeApi, pod, request_handler

TOKEN = "gpufleet-local-token"  # the emulator's static token: local only, never a secret


@dataclass
class FileKubeApi(KubeApi):
    """KubeApi whose pods are the file's, read again at the start of each listing."""

    pods_file: Path | None = None

    def list_pods(self, namespace: str | None, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        self.requests.clear()  # a long-lived server keeps no request log
        if self.pods_file is not None and not query.get("continue"):
            docs = json.loads(self.pods_file.read_text()) if self.pods_file.exists() else []
            with self._lock:
                self._pods.clear()
            self.add(*docs)
        return super().list_pods(namespace, query)


def _files(state_dir: Path, cluster: str) -> tuple[Path, Path, Path]:
    """(pid, url, pods) files of one cluster's API in the local stack's directory."""
    return state_dir / f"kube-{cluster}.pid", state_dir / f"kube-{cluster}.url", state_dir / f"kube-{cluster}.json"


def start(state_dir: Path, cluster: str, port: int) -> str:
    """The cluster's API URL, starting its server (in its own session, as moto's) when not yet running."""
    pid_file, url_file, pods = _files(state_dir, cluster)
    if url_file.exists():
        return url_file.read_text()
    pods.write_text("[]")
    log = open(state_dir / f"kube-{cluster}.log", "w")  # noqa: SIM115 (the server keeps it)
    command = [sys.executable, "-m", "gpufleet_tools.local_kube", "--pods", str(pods), "--port", str(port)]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    url = f"http://127.0.0.1:{port}"
    await_answer(f"{url}/api/v1/pods", proc, "the local Kubernetes API", Path(log.name))  # 401 answers too
    url_file.write_text(url)
    return url


def endpoints(state_dir: Path) -> dict[str, dict[str, str]]:
    """GPUFLEET_KUBE_ENDPOINTS for every local cluster with an API: its URL and the static token."""
    found = {}
    for url_file in sorted(state_dir.glob("kube-*.url")):
        found[url_file.name.removeprefix("kube-").removesuffix(".url")] = {"url": url_file.read_text(), "token": TOKEN}
    return found


def add_pod(state_dir: Path, cluster: str, doc: dict[str, Any]) -> None:
    """A pod in the cluster's file (the same namespace/name replaces it)."""
    pods = _files(state_dir, cluster)[2]
    if not pods.exists():
        raise SystemExit(f"error: no local cluster {cluster!r}: make it with `gpufleet local nodegroup {cluster}/NAME`")
    key = (doc["metadata"]["namespace"], doc["metadata"]["name"])
    docs = [d for d in json.loads(pods.read_text()) if (d["metadata"]["namespace"], d["metadata"]["name"]) != key]
    pods.write_text(json.dumps([*docs, doc]))


def waiting_pod(namespace: str, name: str, gpus: int, node_selector: dict[str, str], now: datetime) -> dict[str, Any]:
    """A pod the scheduler could not place (Pending, Unschedulable), asking for `gpus` GPUs."""
    since = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod(name, namespace, gpus=gpus, since=since, node_selector=node_selector or None)


def stop_all(state_dir: Path) -> None:
    """Stop every local cluster's API server."""
    for pid_file in state_dir.glob("kube-*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", required=True, type=Path)
    parser.add_argument("--port", required=True, type=int)
    args = parser.parse_args()
    api = FileKubeApi(tokens={TOKEN}, pods_file=args.pods)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), request_handler(api))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
