"""The RBAC that queued jobs need (issue 32): deploy/kubernetes/gpufleet-queued-jobs.yaml grants exactly
get and list on what gpufleet.kubernetes.queued_reader lists of Kueue and Volcano, and on Namespaces
(their labels: a ClusterQueue's namespaceSelector, issue 41), to the Kubernetes group the template's
scaler access entries name, and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpufleet.domain import defaults
from tests.test_template import _CfnLoader

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "deploy" / "kubernetes" / "gpufleet-queued-jobs.yaml"


def _documents() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def test_the_cluster_role_grants_exactly_get_list_on_what_the_scaler_lists() -> None:
    rules = _documents()["ClusterRole"]["rules"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {
        ("kueue.x-k8s.io", "workloads"),
        ("kueue.x-k8s.io", "clusterqueues"),
        ("kueue.x-k8s.io", "localqueues"),
        ("kueue.x-k8s.io", "resourceflavors"),
        ("scheduling.volcano.sh", "podgroups"),
        ("batch.volcano.sh", "jobs"),
        ("", "namespaces"),
    }
    assert all(rule["verbs"] == ["get", "list"] for rule in rules)  # no watch, no writes


def test_the_binding_gives_that_role_to_the_queued_jobs_group_only() -> None:
    docs = _documents()
    assert set(docs) == {"ClusterRole", "ClusterRoleBinding"}
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": defaults.QUEUED_JOBS_GROUP}
    ]


def test_every_scaler_access_entry_carries_both_groups() -> None:
    template = yaml.load((ROOT / "template.yaml").read_text(), Loader=_CfnLoader)
    entries = {name: r for name, r in template["Resources"].items() if name.startswith("ScalerEksAccess")}
    assert len(entries) == 3
    for name, resource in entries.items():
        groups = resource["Properties"]["KubernetesGroups"]
        assert groups == [defaults.NODE_MARKS_GROUP, defaults.QUEUED_JOBS_GROUP], name


def test_the_role_covers_every_path_the_queued_reader_lists() -> None:
    """Each resource queued_reader GETs (its module's paths) is granted: a path added there without its
    rule here would be a 403 on every cluster."""
    from gpufleet.kubernetes import queued_reader as q

    rules = _documents()["ClusterRole"]["rules"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    paths = [f"{q.KUEUE}/workloads", f"{q.VOLCANO_SCHEDULING}/podgroups", f"{q.VOLCANO_BATCH}/jobs", q.NAMESPACES]
    for path in paths:
        parts = path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        assert (group, parts[-1]) in granted, path
