"""One tick's Kubernetes listing against a large loopback cluster, at the scaler Lambda's CPU share.

The cluster is pods as the API server writes them (`GET /api/v1/pods`: compact JSON, managedFields,
the projected service-account volume, the default tolerations, container statuses: 4-8 KB each, as
`kubectl get pods -o json` shows on EKS), 30 % waiting for GPUs and the rest running, served in pages
by `limit` and `continue` and gzipped as the API server does (over 128 KiB, gzip level 1:
k8s.io/apiserver responsewriters, `defaultGzipContentEncodingLevel`). Pages are made when asked for, so
a 50k-pod cluster never sits in memory here.

The reader (`gpufleet.kubernetes.cluster.PodReader`, the code the scaler runs) reads it in a subprocess, so
its CPU time is its own; the server runs in this process. The Lambda's share is then CPU time / share:
Lambda gives a function 1 vCPU at 1,769 MB and proportionally less below
(docs.aws.amazon.com/lambda/latest/dg/configuration-memory.html), so the scaler's 512 MB is 0.29 vCPU.
This scales CPU only: it leaves out the API server's own time per page on EKS and the network's, and
that an x86 core here is not a Graviton2 core there (see bench/README.md for what that means).

`python -m bench.kube_listing [--pods 50000]` prints the table; `bench/__main__.py` runs it as a section.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import resource
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parents[1]
SCALER_MB = 512  # template.yaml, Globals.Function.MemorySize (the scaler does not override it)
FULL_VCPU_MB = 1769  # Lambda: one full vCPU at this memory, proportionally less below
GZIP_OVER = 128 * 1024
TOKEN = "bench-token"
NODES = 400
HEAD = ["| measure | sizes | here | at the scaler's CPU share |", "|---|---|---|---|"]


def share(memory_mb: int = SCALER_MB) -> float:
    return min(memory_mb / FULL_VCPU_MB, 1.0)


def realistic_pod(i: int) -> dict[str, Any]:
    """Pod i of the cluster, as the API server returns it: every 10th pod of 10 waits for GPUs in 3 of
    10, the others run on one of NODES nodes (GPU pods and CPU pods). Sizes vary with the env list."""
    waiting = i % 10 < 3
    gpus = 0 if i % 10 == 9 else (8 if i % 7 == 0 else 1)
    team = f"team-{i % 23}"
    job = f"train-{i // 4:06d}"
    name = f"{job}-{i % 4}-{uuid.uuid5(uuid.NAMESPACE_OID, str(i)).hex[:5]}"
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{i}"))
    at = f"2026-11-26T08:{i // 60 % 60:02d}:{i % 60:02d}Z"
    node = f"ip-10-0-{i % NODES // 250}-{i % 250}.ec2.internal"
    env: list[dict[str, Any]] = [
        {"name": f"SETTING_{k}", "value": f"value-{i}-{k}-" + "x" * (k * 7 % 40)} for k in range(4 + i % 24)
    ]
    env += [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}]
    resources: dict[str, Any] = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "16Gi"}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
    managed = [
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "apiVersion": "v1",
            "time": at,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {
                    "f:labels": {".": {}, "f:app": {}, "f:job-name": {}, "f:team": {}},
                    "f:ownerReferences": {".": {}, f'k:{{"uid":"{uid}"}}': {}},
                },
                "f:spec": {
                    "f:containers": {
                        'k:{"name":"main"}': {
                            ".": {},
                            "f:args": {},
                            "f:env": {".": {}, **{f'k:{{"name":"{e["name"]}"}}': {} for e in env}},
                            "f:image": {},
                            "f:imagePullPolicy": {},
                            "f:name": {},
                            "f:resources": {".": {}, "f:limits": {}, "f:requests": {}},
                            "f:terminationMessagePath": {},
                            "f:volumeMounts": {},
                        }
                    },
                    "f:dnsPolicy": {},
                    "f:restartPolicy": {},
                    "f:schedulerName": {},
                    "f:tolerations": {},
                },
            },
        },
        {
            "manager": "kubelet" if not waiting else "kube-scheduler",
            "operation": "Update",
            "apiVersion": "v1",
            "time": at,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:conditions": {".": {}, 'k:{"type":"PodScheduled"}': {}}}},
            "subresource": "status",
        },
    ]
    metadata = {
        "name": name,
        "generateName": f"{job}-{i % 4}-",
        "namespace": team,
        "uid": uid,
        "resourceVersion": str(100_000 + i),
        "creationTimestamp": at,
        "labels": {"app": job, "job-name": job, "team": team, "batch.kubernetes.io/job-name": job},
        "annotations": {"prometheus.io/scrape": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, job)),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": managed,
    }
    spec: dict[str, Any] = {
        "volumes": [
            {
                "name": "kube-api-access-" + uid[:5],
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                    }
                                ]
                            }
                        },
                    ],
                    "defaultMode": 420,
                },
            }
        ],
        "containers": [
            {
                "name": "main",
                "image": f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{team}/trainer:2026.11.{i % 30}",
                "args": ["--config", f"/etc/{job}/config.yaml", "--epochs", "10"],
                "env": env,
                "resources": resources,
                "volumeMounts": [
                    {
                        "name": "kube-api-access-" + uid[:5],
                        "readOnly": True,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            *({"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
              for t in ("not-ready", "unreachable")),
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }  # fmt: skip
    if waiting:
        message = f"0/{NODES} nodes are available: {NODES} Insufficient nvidia.com/gpu. preemption: 0/{NODES} nodes"
        status = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": at,
                    "reason": "Unschedulable",
                    "message": message + " are available: No preemption victims found for incoming pod.",
                }
            ],
            "qosClass": "Burstable",
        }
        return {"metadata": metadata, "spec": spec, "status": status}
    spec["nodeName"] = node
    conditions = [
        {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": at}
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    container = {
        "name": "main",
        "state": {"running": {"startedAt": at}},
        "lastState": {},
        "ready": True,
        "restartCount": 0,
        "image": spec["containers"][0]["image"],
        "imageID": spec["containers"][0]["image"] + "@sha256:" + uuid.uuid5(uuid.NAMESPACE_DNS, team).hex * 2,
        "containerID": "containerd://" + uuid.uuid5(uuid.NAMESPACE_X500, uid).hex * 2,
        "started": True,
    }
    ip = f"10.0.{i % 200}.{i % 250}"
    status = {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "10.0.1.7",
        "hostIPs": [{"ip": "10.0.1.7"}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": at,
        "containerStatuses": [container],
        "qosClass": "Burstable",
    }
    return {"metadata": metadata, "spec": spec, "status": status}


def page(start: int, limit: int, total: int) -> dict[str, Any]:
    """The PodList page the API server would give for `limit` pods from `start` of `total`."""
    end = min(start + limit, total)
    metadata: dict[str, Any] = {"resourceVersion": "200000"}
    if end < total:
        token = {"v": "meta.k8s.io/v1", "rv": 200000, "start": end}
        metadata["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
        metadata["remainingItemCount"] = total - end
    items = [realistic_pod(i) for i in range(start, end)]
    return {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}


def encoded(document: dict[str, Any]) -> tuple[bytes, bool]:
    body = json.dumps(document, separators=(",", ":")).encode()
    if len(body) <= GZIP_OVER:
        return body, False
    return gzip.compress(body, compresslevel=1), True


@contextmanager
def cluster(total: int) -> Iterator[tuple[str, list[int]]]:
    """(URL, bytes sent per page) of a loopback API server with `total` pods."""
    from rehearsal.loopback import serve

    sent: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
            start = json.loads(base64.b64decode(query["continue"]))["start"] if query.get("continue") else 0
            body, gzipped = encoded(page(start, int(query.get("limit") or total), total))
            sent.append(len(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serve(Handler) as url:
        yield url, sent


def read_once(url: str, page_size: int, budget_s: float) -> dict[str, Any]:
    """In the subprocess: one PodReader.read, its wall and CPU time and peak memory."""
    from pydantic import SecretStr

    from gpufleet.domain.errors import ClusterUnreadable
    from gpufleet.kubernetes.cluster import PodReader
    from gpufleet.settings import KubeEndpoint

    endpoint = {"bench": KubeEndpoint(url=url, token=SecretStr(TOKEN))}
    reader = PodReader(None, None, endpoint, page_size=page_size, budget_s=budget_s)  # type: ignore[arg-type]
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        found = reader.read("bench")
        outcome: dict[str, Any] = {
            "waiting": len(found.waiting),
            "gpu_nodes": len(found.gpu_nodes),
            "pages": found.pages,
        }
    except ClusterUnreadable as err:
        outcome = {"unreadable": str(err)}
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**outcome, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "rss_mb": rss_mb}


def parse_page_cpu(page_size: int = 500, repeat: int = 5) -> dict[str, float]:
    """CPU seconds to inflate, parse and tally one page here, and its sizes (bytes on the wire, inflated)."""
    from gpufleet.kubernetes.pods import PodTally

    body, gzipped = encoded(page(0, page_size, page_size * 2))
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        raw = zlib.decompress(body, 16 + zlib.MAX_WBITS) if gzipped else body
        PodTally("bench").add(json.loads(raw)["items"])
        best = min(best, time.process_time() - started)
    inflated = len(zlib.decompress(body, 16 + zlib.MAX_WBITS)) if gzipped else len(body)
    return {"cpu_s": best, "wire_mb": len(body) / 2**20, "inflated_mb": inflated / 2**20}


def bench_kube_listing(pods: int = 50_000, page_size: int = 500, budget_s: float = 120.0) -> list[str]:
    """Table rows: one page's parse cost, then one whole listing of `pods` (budget lifted so it finishes;
    what matters is the time it takes at the Lambda's share against the scaler's BUDGET_S)."""
    from gpufleet.kubernetes.cluster import BUDGET_S

    one = parse_page_cpu(page_size)
    cpu_share = share()
    rows = [
        f"| one page of {page_size} pods: inflate + parse + tally | {one['wire_mb']:.2f} MB gzipped, "
        f"{one['inflated_mb']:.2f} MB JSON ({one['inflated_mb'] * 2**20 / page_size / 1024:.1f} KB a pod) | "
        f"{one['cpu_s'] * 1000:.0f} ms CPU here | {one['cpu_s'] / cpu_share * 1000:.0f} ms at {cpu_share:.2f} vCPU |"
    ]
    with cluster(pods) as (url, _sent):
        code = (
            "import json, sys; from bench.kube_listing import read_once; "
            f"print(json.dumps(read_once({url!r}, {page_size}, {budget_s})))"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900, check=True
        )
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "unreadable" in got:
        return [*rows, f"| {pods:,} pods | unreadable: {got['unreadable']} | | |"]
    at_share = got["cpu_s"] / cpu_share
    verdict = "fits" if at_share <= BUDGET_S else "does NOT fit"
    at_full = got["cpu_s"] / share(FULL_VCPU_MB)
    rows.append(
        f"| one listing of {pods:,} pods, {got['pages']} pages of {page_size} (PodReader in a subprocess) | "
        f"{got['waiting']:,} waiting, {got['gpu_nodes']} GPU nodes; peak RSS {got['rss_mb']:.0f} MB | "
        f"{got['cpu_s']:.2f} s CPU, {got['wall_s']:.2f} s wall here | "
        f"**{at_share:.1f} s** at {cpu_share:.2f} vCPU ({SCALER_MB} MB): {verdict} in the {BUDGET_S:g} s budget; "
        f"{at_full:.1f} s at 1 vCPU ({FULL_VCPU_MB:,} MB) |"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kube_listing")
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--page-size", type=int, default=500)
    args = parser.parse_args(argv)
    print("\n".join(HEAD))
    for row in bench_kube_listing(args.pods, args.page_size):
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
