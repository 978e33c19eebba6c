"""The local stack's Kubernetes API (EMULATED: not Kubernetes). moto's EKS answers DescribeCluster with an
endpoint nobody serves and a certificate authority of random text, so neither the scaler nor `doctor` can
read a local cluster's pods there. `gpufleet local nodegroup` starts one of these per cluster on
127.0.0.1 (plain http: only loopback may) and hands it to both through GPUFLEET_KUBE_ENDPOINTS, with a
static token, as a cluster outside EKS's DescribeCluster is given. It serves the pod listing of
`rehearsal.kube_api` (the API's own JSON, paging, field selectors) from a JSON file of pods that
`gpufleet local pod` writes: each new listing reads the file again.

It also serves the cluster's Namespaces (`LocalKubeApi`): `GET /api/v1/namespaces` (a NamespaceList,
paged by `limit`/`continue`, each Namespace labelled `kubernetes.io/metadata.name` as the API server
labels every one) and `GET /api/v1/namespaces/NAME`, what Kueue's ClusterQueue namespaceSelector is
matched against. `local_kube_api()` serves one on loopback for tests, as rehearsal.kube_api.kube_api.

Run as `python -m gpufleet_tools.local_kube --pods FILE --port PORT`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpufleet_tools.local_servers import await_answer
from rehearsal.kube_api import KubeApi, pod, request_handler, status
from rehearsal.loopback import serve

TOKEN = "gpufleet-local-token"  # the emulator's static token: local only, never a secret
NAME_LABEL = "kubernetes.io/metadata.name"  # the API server sets it on every Namespace (immutable)


@dataclass
class LocalKubeApi(KubeApi):
    """KubeApi that also serves Namespaces (module docstring). `default` exists, as in any cluster."""

    _namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.add_namespace("default")

    def add_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Add (or relabel) a Namespace; its name label is the API server's, whatever `labels` say."""
        with self._lock:
            self._version += 1
            self._namespaces[name] = {
                "kind": "Namespace", "apiVersion": "v1",
                "metadata": {"name": name, "uid": f"ns-{name}", "resourceVersion": str(self._version),
                             "labels": {**(labels or {}), NAME_LABEL: name}},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"},
            }  # fmt: skip

    def list_namespaces(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            items = [copy.deepcopy(self._namespaces[k]) for k in sorted(self._namespaces)]
            rv = self._version
        start = int(json.loads(base64.b64decode(query["continue"]))["start"]) if query.get("continue") else 0
        limit = int(query.get("limit") or 0) or len(items) or 1
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if start + limit < len(items):
            token = {"v": "meta.k8s.io/v1", "rv": rv, "start": start + limit}
            metadata["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
        page = items[start : start + limit]
        return 200, {"kind": "NamespaceList", "apiVersion": "v1", "metadata": metadata, "items": page}

    def get_namespace(self, name: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if name in self._namespaces:
                return 200, copy.deepcopy(self._namespaces[name])
        return 404, status(404, "NotFound", f'namespaces "{name}" not found', details={"name": name})


def local_handler(api: KubeApi) -> type[BaseHTTPRequestHandler]:
    """rehearsal.kube_api's handler, with the Namespaces of a LocalKubeApi served in front of it."""
    base: Any = request_handler(api)

    class Handler(base):  # type: ignore[misc]
        def do_GET(self) -> None:  # noqa: N802 (http.server names it)
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if not isinstance(api, LocalKubeApi) or parts[:3] != ["api", "v1", "namespaces"] or len(parts) > 4:
                return super().do_GET()  # type: ignore[no-any-return]
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            api.requests.append({"path": url.path, "query": query})
            refused = api.authenticate(self.headers.get("Authorization"))
            code, doc = refused or (api.list_namespaces(query) if len(parts) == 3 else api.get_namespace(parts[3]))
            return self._reply(code, json.dumps(doc).encode())  # type: ignore[no-any-return]

    return Handler


@contextlib.contextmanager
def local_kube_api(api: LocalKubeApi | None = None) -> Iterator[tuple[LocalKubeApi, str]]:
    """(api, base URL): a LocalKubeApi on a free loopback port for as long as the block runs."""
    api = api or LocalKubeApi()
    with serve(local_handler(api)) as url:
        yield api, url


@dataclass
class FileKubeApi(LocalKubeApi):
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
    server = ThreadingHTTPServer(("127.0.0.1", args.port), local_handler(api))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
