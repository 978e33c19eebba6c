"""A Kubernetes API server on 127.0.0.1 (EMULATED: not Kubernetes; the demo labels what it shows from here
`[emulated]`). It serves what gpufleet reads, in the API's own JSON, and misbehaves on purpose.

- `GET /api/v1/pods` and `GET /api/v1/namespaces/{ns}/pods`: a PodList, pods in key order (namespace,
  name), paged by `limit` and `continue` over a snapshot taken at the first page (as the API serves a
  paged list from one resourceVersion), `remainingItemCount` included; `fieldSelector` on status.phase,
  spec.nodeName, metadata.name and metadata.namespace with =, == and !=, comma-separated terms ANDed (any
  other field: 400 BadRequest "field label not supported", as the API answers); answers over 128 KiB
  gzipped when the client accepts it, as the API server does.
- Errors as `Status` documents: 401 for a missing or unknown bearer token, 403 when `forbidden` (a role
  with an access entry but no view policy), 410 Expired for a continue token whose snapshot is gone
  (`expire_continue_tokens()`: etcd compacted it), 404 for any other path.
- Authentication: the static `tokens`, and, when `eks_cluster` is set, any token shaped as
  aws-iam-authenticator wants (`k8s-aws-v1.` + base64url of a presigned STS GetCallerIdentity URL with
  x-k8s-aws-id signed in). The shape is checked, not the signature: nothing here calls STS.
- `script`: per-request misbehaviour, one entry a request ("ok" when empty): "delay:<s>" (answer late),
  "garbage" (a body that is not JSON), "expire" (compact first: a continue token in this request is too
  old), "500", "429".

- Nodes: `GET /api/v1/nodes` (a NodeList, paged by `limit`; `labelSelector` in the API's string form:
  `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`, terms ANDed,
  `!=` and `notin` also matching a node without the key, as apimachinery's labels.Requirement.Matches does;
  kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors; anything else: 400
  BadRequest), `GET /api/v1/nodes/NAME`, and
  `PATCH /api/v1/nodes/NAME` (JSON merge patch or strategic merge patch; a `metadata.resourceVersion` in it
  is a precondition: 409 Conflict when the node changed, as the API server answers), each patch recorded in
  `patches`. `may` holds the verbs on nodes the caller is granted (403 Forbidden for the others), and
  `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews` answers from it (201, status.allowed);
  for a custom resource below it allows get and list unless the plural is in `refuse`.

- Custom resources (Kueue, Volcano: their CRDs' objects, as `kubectl get -o json` shows them):
  `GET /apis/GROUP/VERSION/PLURAL` lists every object added with `add_object(plural, doc)` for that
  apiVersion, all namespaces, as a `KINDList` paged by `limit`/`continue`; a plural never added is 404
  (its CRD is not installed, as the API answers); a plural in `refuse` is 403 Forbidden, worded as the
  API server words it (the role lacks `list` on it). `GET /apis/GROUP/VERSION` (discovery) names the
  plurals served there (an APIResourceList), 404 when none is.

Pods are added, bound, finished and removed through methods; `pod()` builds a document the way
`kubectl run --dry-run=client -o json` would, with the status the scheduler would give it.
"""

from __future__ import annotations

import base64
import binascii
import copy
import gzip
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rehearsal.loopback import serve

LABEL = "[emulated]"
GZIP_OVER = 128 * 1024  # the API server compresses answers larger than this
FIELDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "status.phase": lambda p: str(p.get("status", {}).get("phase", "")),
    "spec.nodeName": lambda p: str(p.get("spec", {}).get("nodeName", "")),
    "metadata.name": lambda p: str(p["metadata"]["name"]),
    "metadata.namespace": lambda p: str(p["metadata"]["namespace"]),
}
EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of "
    "the results. Continuing with the provided token results in an inconsistent list - objects that were "
    "created, modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


def status(code: int, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    """An API error as the API server writes it (a meta/v1 Status)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": extra.pop("metadata", {}),
        "status": "Failure",
        "message": message,
        "reason": reason,
        **extra,
        "code": code,
    }


def pod(
    name: str,
    namespace: str = "default",
    *,
    gpus: int = 1,
    since: str = "2026-11-23T09:00:00Z",
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    owner: str = "Job",
    image: str = "public.ecr.aws/example/trainer:1.0",
    requests: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod waiting for GPUs: what `kubectl run NAME --image IMAGE --dry-run=client -o json` prints (plus
    the GPU limit, selectors and an owner), then what the API server and the scheduler add: uid,
    creationTimestamp, phase Pending and PodScheduled False/Unschedulable. `requests`: its container's
    other requests (cpu, memory, ...), as quantities."""
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    if requests:
        resources["requests"] = dict(requests)
    spec: dict[str, Any] = {
        "containers": [{"name": name.split("-")[0], "image": image, "resources": resources}],
        "restartPolicy": "Never" if owner == "Job" else "Always",
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = list(tolerations)
    owner_name = name.rsplit("-", 1)[0]
    metadata = {
        "name": name,
        "namespace": namespace,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}")),
        "creationTimestamp": since,
        "labels": {"run": name},
        "ownerReferences": [{"apiVersion": "batch/v1" if owner == "Job" else "apps/v1", "kind": owner,
                             "name": owner_name, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, owner_name)),
                             "controller": True, "blockOwnerDeletion": True}],
    }  # fmt: skip
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    condition = {"type": "PodScheduled", "status": "False", "lastProbeTime": None, "lastTransitionTime": since,
                 "reason": "Unschedulable", "message": message}  # fmt: skip
    return {"metadata": metadata, "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort",
                                                         "conditions": [condition]}}  # fmt: skip


def eks_token_shape_ok(token: str) -> bool:
    """Is this an aws-iam-authenticator token by its shape (the signature is not checked)?"""
    if not token.startswith("k8s-aws-v1."):
        return False
    encoded = token.removeprefix("k8s-aws-v1.")
    try:
        url = urlsplit(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    query = {k.lower(): v[0] for k, v in parse_qs(url.query).items()}
    signed = query.get("x-amz-signedheaders", "").split(";")
    return (
        query.get("action") == "GetCallerIdentity"
        and "x-k8s-aws-id" in signed
        and 0 <= int(query.get("x-amz-expires", "-1")) <= 900
        and bool(query.get("x-amz-date"))
    )


def _selector(text: str) -> list[tuple[str, bool, str]]:
    """fieldSelector terms as (field, equal, value); ValueError names an unsupported field."""
    terms = []
    for term in filter(None, text.split(",")):
        equal = "!=" not in term
        key, value = term.split("!=" if not equal else ("==" if "==" in term else "="), 1)
        if key.strip() not in FIELDS:
            raise ValueError(f'"{key.strip()}" is not a known field selector: only "metadata.name", '
                             '"metadata.namespace", "spec.nodeName", "status.phase"')  # fmt: skip
        terms.append((key.strip(), equal, value.strip()))
    return terms


def _label_terms(text: str) -> list[str]:
    """A labelSelector split on the commas between its terms (not those inside `in (...)`)."""
    terms, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(text[start:at])
            start = at + 1
    return [t.strip() for t in [*terms, text[start:]] if t.strip()]


def label_matcher(text: str) -> Callable[[dict[str, str]], bool]:
    """A labelSelector as a test of one object's labels; ValueError for a term it cannot parse."""
    terms: list[tuple[str, str, frozenset[str]]] = []  # (key, operator, values)
    for term in _label_terms(text):
        words = term.split(None, 1)
        if len(words) == 2 and words[1].split("(", 1)[0].strip() in ("in", "notin"):
            op, _, rest = words[1].partition("(")
            if not rest.endswith(")"):
                raise ValueError(f"unable to parse requirement: {term!r}")
            terms.append((words[0], op.strip(), frozenset(v.strip() for v in rest[:-1].split(","))))
        elif "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key.strip(), "notin", frozenset({value.strip()})))
        elif "=" in term:
            key, value = term.replace("==", "=", 1).split("=", 1)
            terms.append((key.strip(), "in", frozenset({value.strip()})))
        elif " " not in term:
            terms.append((term.lstrip("!"), "absent" if term.startswith("!") else "present", frozenset()))
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")

    def holds(labels: dict[str, str], key: str, op: str, values: frozenset[str]) -> bool:
        if op in ("present", "absent"):
            return (key in labels) == (op == "present")
        return (labels.get(key) in values) == (op == "in")  # notin and != also match a node without the key

    return lambda labels: all(holds(labels, *term) for term in terms)


def node(name: str, *, gpus: int = 1, unschedulable: bool = False) -> dict[str, Any]:
    """A node as `kubectl get node NAME -o json` shows it (the parts gpufleet reads)."""
    doc: dict[str, Any] = {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"node/{name}")),
                     "labels": {"kubernetes.io/hostname": name}, "annotations": {}},
        "spec": {"providerID": f"aws:///us-east-1a/i-{uuid.uuid5(uuid.NAMESPACE_URL, name).hex[:17]}"},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "capacity": {"nvidia.com/gpu": str(gpus)}},
    }  # fmt: skip
    if unschedulable:
        doc["spec"]["unschedulable"] = True
    return doc


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _forbidden(verb: str, resource: str) -> dict[str, Any]:
    message = (f'{resource} is forbidden: User "arn:aws:sts::123456789012:assumed-role/gpufleet-scaler/gpufleet" '
               f'cannot {verb} resource "{resource}" in API group "" at the cluster scope')  # fmt: skip
    return status(403, "Forbidden", message, details={"kind": resource})


def _encode(payload: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()


@dataclass
class KubeApi:
    tokens: set[str] = field(default_factory=lambda: {"gpufleet-local-token"})
    eks_cluster: str | None = None  # accept EKS-shaped tokens (for this cluster)
    forbidden: bool = False
    script: deque[str] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)  # path and query of each GET (no headers)
    _pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    _nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    patches: list[dict[str, Any]] = field(default_factory=list)  # each node PATCH: name, content type, body, code
    may: set[str] = field(default_factory=lambda: {"get", "list", "patch"})  # verbs on nodes the caller holds
    # Called with (api, node name) after a PATCH arrives and before it is applied: another actor's move.
    interfere: Callable[[KubeApi, str], None] | None = None
    _snapshots: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    # (apiVersion, plural) -> (namespace, name) -> object; plurals whose listing is 403 Forbidden
    _objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = field(default_factory=dict)
    refuse: set[str] = field(default_factory=set)
    _version: int = 1000
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the cluster's pods
    def add(self, *docs: dict[str, Any]) -> None:
        with self._lock:
            for doc in docs:
                self._version += 1
                doc = copy.deepcopy(doc)
                doc["metadata"]["resourceVersion"] = str(self._version)
                self._pods[(doc["metadata"].get("namespace", "default"), doc["metadata"]["name"])] = doc

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            self._version += 1
            self._pods.pop((namespace, name), None)

    def bind(self, namespace: str, name: str, node: str, at: str = "2026-11-23T09:05:00Z") -> None:
        """The scheduler placed the pod and the kubelet started it: nodeName set, Running, conditions True."""
        with self._lock:
            doc = self._pods[(namespace, name)]
            doc["spec"]["nodeName"] = node
            doc["status"] = {"phase": "Running", "hostIP": "10.0.1.7", "startTime": at, "conditions": [
                {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": at}
                for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ]}  # fmt: skip
            self._version += 1
            doc["metadata"]["resourceVersion"] = str(self._version)

    def finish(self, namespace: str, name: str, phase: str = "Succeeded") -> None:
        with self._lock:
            self._pods[(namespace, name)]["status"]["phase"] = phase
            self._version += 1

    def expire_continue_tokens(self) -> None:
        """etcd compacted past every listing in progress: their next page is 410 Expired."""
        with self._lock:
            self._snapshots.clear()

    # -- custom resources (Kueue, Volcano)
    def add_object(self, plural: str, *docs: dict[str, Any]) -> None:
        """Add (or replace) objects of one custom resource; the resource is served from then on."""
        with self._lock:
            for doc in docs:
                self._version += 1
                doc = copy.deepcopy(doc)
                meta = doc.setdefault("metadata", {})
                meta["resourceVersion"] = str(self._version)
                key = (str(doc.get("apiVersion")), plural)
                self._objects.setdefault(key, {})[(meta.get("namespace", ""), meta["name"])] = doc

    def install(self, api_version: str, *plurals: str) -> None:
        """Serve these resources (their CRDs are installed), with no objects yet."""
        with self._lock:
            for plural in plurals:
                self._objects.setdefault((api_version, plural), {})

    def remove_object(self, plural: str, api_version: str, namespace: str, name: str) -> None:
        with self._lock:
            self._objects.get((api_version, plural), {}).pop((namespace, name), None)

    def object_doc(self, plural: str, api_version: str, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._objects[(api_version, plural)][(namespace, name)])

    def list_objects(self, api_version: str, plural: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if plural in self.refuse:
            group = api_version.split("/")[0]
            user = "arn:aws:sts::123456789012:assumed-role/gpufleet-scaler/gpufleet"
            message = (
                f'{plural}.{group} is forbidden: User "{user}" cannot list resource "{plural}" in API group '
                f'"{group}" at the cluster scope'
            )
            return 403, status(403, "Forbidden", message, details={"group": group, "kind": plural})
        with self._lock:
            found = self._objects.get((api_version, plural))
            if found is None:
                return 404, status(404, "NotFound", "the server could not find the requested resource")
            items = [copy.deepcopy(found[k]) for k in sorted(found)]
            rv = str(self._version)
        kind = (items[0].get("kind") if items else None) or _KINDS.get(plural, plural.title())
        start = int(json.loads(base64.b64decode(query["continue"]))["start"]) if query.get("continue") else 0
        limit = int(query.get("limit") or 0) or len(items) or 1
        metadata: dict[str, Any] = {"resourceVersion": rv}
        if start + limit < len(items):
            metadata["continue"] = _encode({"v": "meta.k8s.io/v1", "rv": int(rv), "start": start + limit})
            metadata["remainingItemCount"] = len(items) - start - limit
        page = items[start : start + limit]
        return 200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": metadata, "items": page}

    # -- the cluster's nodes
    def add_node(self, *docs: dict[str, Any]) -> None:
        with self._lock:
            for doc in docs:
                self._version += 1
                doc = copy.deepcopy(doc)
                doc["metadata"]["resourceVersion"] = str(self._version)
                self._nodes[doc["metadata"]["name"]] = doc

    def node_doc(self, name: str) -> dict[str, Any]:
        """The node as stored now (a copy)."""
        with self._lock:
            return copy.deepcopy(self._nodes[name])

    def cordon(self, name: str, on: bool = True) -> None:
        """Someone else (kubectl cordon) cordons or uncordons the node: no gpufleet annotation."""
        with self._lock:
            doc = self._nodes[name]
            if on:
                doc.setdefault("spec", {})["unschedulable"] = True
            else:
                doc.get("spec", {}).pop("unschedulable", None)
            self._version += 1
            doc["metadata"]["resourceVersion"] = str(self._version)

    def list_nodes(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if "list" not in self.may:
            return 403, _forbidden("list", "nodes")
        try:
            matches = label_matcher(query.get("labelSelector", ""))
        except ValueError as err:
            return 400, status(400, "BadRequest", str(err))
        with self._lock:
            chosen = [copy.deepcopy(self._nodes[k]) for k in sorted(self._nodes)]
            rv = self._version
        chosen = [n for n in chosen if matches(n["metadata"].get("labels") or {})]
        limit = int(query.get("limit") or 0)
        start = int(json.loads(base64.b64decode(query["continue"]))["start"]) if query.get("continue") else 0
        page = chosen[start : start + limit] if limit else chosen[start:]
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and start + limit < len(chosen):
            metadata["continue"] = _encode({"v": "meta.k8s.io/v1", "rv": rv, "start": start + limit})
        return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": metadata, "items": page}

    def get_node(self, name: str) -> tuple[int, dict[str, Any]]:
        if "get" not in self.may:
            return 403, _forbidden("get", "nodes")
        with self._lock:
            if name not in self._nodes:
                return 404, status(
                    404, "NotFound", f'nodes "{name}" not found', details={"name": name, "kind": "nodes"}
                )
            return 200, copy.deepcopy(self._nodes[name])

    def patch_node(self, name: str, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """A JSON merge patch (or a strategic merge patch, the same for the maps a cordon touches); a
        `metadata.resourceVersion` in it is a precondition (409 Conflict when the node moved on)."""
        code, answer = self._patch(name, content_type, body)
        self.patches.append({"name": name, "content_type": content_type, "body": json.loads(body or b"null"),
                             "code": code})  # fmt: skip
        return code, answer

    def _patch(self, name: str, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if "patch" not in self.may:
            return 403, _forbidden("patch", "nodes")
        if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return 415, status(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                               "accepted media types include: application/merge-patch+json")  # fmt: skip
        patch = json.loads(body)
        if self.interfere is not None:
            self.interfere(self, name)
        with self._lock:
            if name not in self._nodes:
                return 404, status(
                    404, "NotFound", f'nodes "{name}" not found', details={"name": name, "kind": "nodes"}
                )
            doc = self._nodes[name]
            wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
            if wanted is not None and wanted != doc["metadata"]["resourceVersion"]:
                message = (f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; please '
                           "apply your changes to the latest version and try again")  # fmt: skip
                return 409, status(409, "Conflict", message, details={"name": name, "kind": "nodes"})
            merged = merge_patch(doc, patch)
            self._version += 1
            merged["metadata"]["resourceVersion"] = str(self._version)
            self._nodes[name] = merged
            return 200, copy.deepcopy(merged)

    def access_review(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """A SelfSubjectAccessReview answered from `may` for nodes; for a custom resource (Kueue, Volcano),
        `get` and `list` are allowed unless its plural is in `refuse` (as its listing answers); anything
        else is denied."""
        review = json.loads(body)
        attributes = review.get("spec", {}).get("resourceAttributes", {})
        resource, verb = attributes.get("resource"), attributes.get("verb")
        if resource == "nodes":
            allowed, binding = verb in self.may, "gpufleet-node-marks"
        else:
            plurals = {plural for _, plural in self._objects} | set(_KINDS)
            allowed = resource in plurals and resource not in self.refuse and verb in ("get", "list")
            binding = "gpufleet-queued-jobs"
        reason = f'RBAC: allowed by ClusterRoleBinding "{binding}"' if allowed else ""
        return 201, {**review, "status": {"allowed": allowed, "reason": reason}}

    def discovery(self, api_version: str) -> tuple[int, dict[str, Any]]:
        """`GET /apis/GROUP/VERSION`: the resources served there (an APIResourceList), 404 when none is
        (no CRD of that group and version installed). Any authenticated caller may read it (the default
        ClusterRoleBinding system:discovery, to system:authenticated)."""
        with self._lock:
            plurals = sorted(plural for version, plural in self._objects if version == api_version)
        if not plurals:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        resources = [
            {"name": p, "kind": _KINDS.get(p, p.title()), "namespaced": p not in _CLUSTER_SCOPED, "verbs": _VERBS}
            for p in plurals
        ]
        return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": resources}

    # -- the API
    def list_pods(self, namespace: str | None, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        try:
            terms = _selector(query.get("fieldSelector", ""))
            limit = int(query.get("limit") or 0)
        except ValueError as err:
            return 400, status(400, "BadRequest", f"unable to parse requested fields: {err}")
        with self._lock:
            if query.get("continue"):
                try:
                    token = json.loads(base64.b64decode(query["continue"]))
                    rv, start = int(token["rv"]), int(token["start"])
                except (ValueError, KeyError, TypeError):
                    return 400, status(400, "BadRequest", "continue key is not valid: invalid continue token")
                if rv not in self._snapshots:
                    return 410, status(410, "Expired", EXPIRED_MESSAGE, metadata={"continue": query["continue"]})
                snapshot = self._snapshots[rv]
            else:
                rv, start = self._version, 0
                snapshot = [copy.deepcopy(self._pods[k]) for k in sorted(self._pods)]
            chosen = [
                p for p in snapshot
                if (namespace is None or p["metadata"]["namespace"] == namespace)
                and all((FIELDS[f](p) == v) == equal for f, equal, v in terms)
            ]  # fmt: skip
            more = bool(limit) and start + limit < len(chosen)
            if more:
                self._snapshots[rv] = snapshot  # the listing goes on from this resourceVersion
        page = chosen[start : start + limit] if limit else chosen[start:]
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if more:
            metadata["continue"] = _encode({"v": "meta.k8s.io/v1", "rv": rv, "start": start + limit})
            metadata["remainingItemCount"] = len(chosen) - start - limit
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": page}

    def authenticate(self, header: str | None) -> tuple[int, dict[str, Any]] | None:
        """None when the request may go on, else the error answer."""
        token = (header or "").removeprefix("Bearer ").strip() if (header or "").startswith("Bearer ") else ""
        if not (token in self.tokens or (self.eks_cluster and eks_token_shape_ok(token))):
            return 401, status(401, "Unauthorized", "Unauthorized")
        if self.forbidden:
            message = ('pods is forbidden: User "arn:aws:sts::123456789012:assumed-role/gpufleet-scaler/gpufleet" '
                       'cannot list resource "pods" in API group "" at the cluster scope')  # fmt: skip
            return 403, status(403, "Forbidden", message, details={"kind": "pods"})
        return None

    def next_behaviour(self) -> str:
        with self._lock:
            return self.script.popleft() if self.script else "ok"


def request_handler(api: KubeApi) -> type[BaseHTTPRequestHandler]:
    """The HTTP request handler that serves `api`, for a server that outlives a `with kube_api()` block (the
    local stack's, gpufleet_tools.local_kube). Long because each verb's routes sit with the replies they share."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the API server

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            gzipped = len(body) > GZIP_OVER and "gzip" in (self.headers.get("Accept-Encoding") or "")
            body = gzip.compress(body) if gzipped else body
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with suppress(OSError):  # the client gave up already (its timeout)
                self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            api.requests.append({"path": url.path, "query": query})
            behaviour = api.next_behaviour()
            if behaviour == "expire":
                api.expire_continue_tokens()
            if behaviour.startswith("delay:"):
                time.sleep(float(behaviour.split(":", 1)[1]))
            if behaviour in ("500", "429"):
                code = int(behaviour)
                reason = "InternalError" if code == 500 else "TooManyRequests"
                return self._reply(code, json.dumps(status(code, reason, reason)).encode())
            refused = api.authenticate(self.headers.get("Authorization"))
            if refused:
                return self._reply(refused[0], json.dumps(refused[1]).encode())
            parts = url.path.strip("/").split("/")
            if parts == ["api", "v1", "nodes"]:
                return self._reply(*_json_answer(api.list_nodes(query)))
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                return self._reply(*_json_answer(api.get_node(parts[3])))
            if parts == ["api", "v1", "pods"] or (len(parts) == 5 and parts[2] == "namespaces" and parts[4] == "pods"):
                code, doc = api.list_pods(parts[3] if len(parts) == 5 else None, query)
                if behaviour == "garbage":
                    return self._reply(200, b'{"kind": "PodList", "items": [{"metadata": ')
                return self._reply(code, json.dumps(doc).encode())
            if parts[0] == "apis" and len(parts) == 3:
                return self._reply(*_json_answer(api.discovery(f"{parts[1]}/{parts[2]}")))
            if parts[0] == "apis" and len(parts) == 4:
                return self._reply(*_json_answer(api.list_objects(f"{parts[1]}/{parts[2]}", parts[3], query)))
            missing = status(404, "NotFound", "the server could not find the requested resource")
            return self._reply(404, json.dumps(missing).encode())

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_PATCH(self) -> None:
            url, body = urlsplit(self.path), self._body()
            api.requests.append({"path": url.path, "query": {}, "method": "PATCH"})
            refused = api.authenticate(self.headers.get("Authorization"))
            if refused:
                return self._reply(refused[0], json.dumps(refused[1]).encode())
            parts = url.path.strip("/").split("/")
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                return self._reply(*_json_answer(api.patch_node(parts[3], content_type, body)))
            return self._reply(
                404, json.dumps(status(404, "NotFound", "the server could not find the requested resource")).encode()
            )

        def do_POST(self) -> None:
            url, body = urlsplit(self.path), self._body()
            api.requests.append({"path": url.path, "query": {}, "method": "POST"})
            refused = api.authenticate(self.headers.get("Authorization"))
            if refused:
                return self._reply(refused[0], json.dumps(refused[1]).encode())
            if url.path.rstrip("/") == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
                return self._reply(*_json_answer(api.access_review(body)))
            return self._reply(
                404, json.dumps(status(404, "NotFound", "the server could not find the requested resource")).encode()
            )

    return Handler


# A resource's kind where no object of it was added yet (an empty list still names its kind).
_KINDS = {
    "workloads": "Workload",
    "clusterqueues": "ClusterQueue",
    "localqueues": "LocalQueue",
    "resourceflavors": "ResourceFlavor",
    "podgroups": "PodGroup",
    "jobs": "Job",
}


_CLUSTER_SCOPED = {"clusterqueues", "resourceflavors"}
_VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]


def _json_answer(answer: tuple[int, dict[str, Any]]) -> tuple[int, bytes]:
    return answer[0], json.dumps(answer[1]).encode()


@contextmanager
def kube_api(api: KubeApi | None = None, tls: tuple[str, str] | None = None) -> Iterator[tuple[KubeApi, str]]:
    """(api, base URL): a Kubernetes API on a free loopback port for as long as the block runs; over HTTPS
    with `tls` (certificate file, key file), as an EKS endpoint is."""
    api = api or KubeApi()
    with serve(request_handler(api), tls) as url:
        yield api, url
