"""The RBAC that consolidation's cordon needs: deploy/kubernetes/gpufleet-node-marks.yaml grants exactly
nodes: get, list, patch to the Kubernetes group the template's scaler access entries name, and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpufleet.domain import defaults
from tests.test_template import _CfnLoader

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "deploy" / "kubernetes" / "gpufleet-node-marks.yaml"


def _documents() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def test_the_cluster_role_grants_exactly_get_list_patch_on_nodes() -> None:
    docs = _documents()
    assert set(docs) == {"ClusterRole", "ClusterRoleBinding"}
    rules = docs["ClusterRole"]["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]


def test_the_binding_gives_that_role_to_the_node_marks_group_only() -> None:
    docs = _documents()
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": docs["ClusterRole"]["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": defaults.NODE_MARKS_GROUP}
    ]


def test_every_scaler_access_entry_puts_the_scaler_in_the_node_marks_group() -> None:
    template = yaml.load((ROOT / "template.yaml").read_text(), Loader=_CfnLoader)
    entries = {name: r for name, r in template["Resources"].items() if name.startswith("ScalerEksAccess")}
    assert len(entries) == 3
    for name, resource in entries.items():
        assert resource["Type"] == "AWS::EKS::AccessEntry", name
        assert defaults.NODE_MARKS_GROUP in resource["Properties"]["KubernetesGroups"], name
    others = [
        name
        for name, r in template["Resources"].items()
        if r.get("Type") == "AWS::EKS::AccessEntry" and not name.startswith("ScalerEksAccess")
    ]
    for name in others:  # only the scaler marks nodes: spot_watch and the rest stay view-only
        assert "KubernetesGroups" not in template["Resources"][name]["Properties"], name
