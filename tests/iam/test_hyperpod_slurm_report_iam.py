"""The HyperPod execution roles gpufleet ships (ami/hyperpod/execution-role-*.json), evaluated on Slurm's
report (issue 41): alone, with AWS's CloudWatchAgentServerPolicy beside them, and as ONE role shared by the
controller and worker groups (what AWS's samples and Terraform modules do: both documents on one role).

What IAM enforces: a principal may write Slurm's report only into `Slurm/${aws:userid}`, its own; every
other Slurm namespace (plain `Slurm`, another node's) is denied whatever else the role allows. With one
shared role a worker may therefore write `Slurm/ROLEID:i-worker`: allowed by IAM, never read by the scaler,
which reads only `Slurm/ROLEID:<the controller group's one instance>` (tests/integration/test_hyperpod_moto.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet_node import schema
from tests.conftest import ROOT
from tests.iam.evaluator import evaluate
from tests.iam.test_node_policy import CLOUDWATCH_AGENT

ROLE_ID = "AROAHYPERPODSHARED"
CONTROLLER = f"{ROLE_ID}:i-0c0c0c0c0c0c0c0c0"
WORKER = f"{ROLE_ID}:i-0a0a0a0a0a0a0a0a0"


def _doc(name: str) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = json.loads((ROOT / f"ami/hyperpod/{name}.json").read_text())["Statement"]
    return statements


def _roles() -> dict[str, list[dict[str, Any]]]:
    controller, worker = _doc("execution-role-controller"), _doc("execution-role-worker")
    return {
        "controller": controller,
        "worker": worker,
        "shared": [*controller, *worker],
        "controller+agent": [*controller, CLOUDWATCH_AGENT],
        "worker+agent": [*worker, CLOUDWATCH_AGENT],
        "shared+agent": [*controller, *worker, CLOUDWATCH_AGENT],
    }


def _put(statements: list[dict[str, Any]], userid: str, namespace: str) -> bool:
    context = {"aws:userid": userid, "cloudwatch:namespace": namespace}
    return evaluate(statements, "cloudwatch:PutMetricData", "*", context).allowed


@pytest.mark.parametrize("role", sorted(_roles()))
@pytest.mark.parametrize("userid", [CONTROLLER, WORKER], ids=["controller-node", "worker-node"])
def test_no_node_writes_another_nodes_slurm_namespace_nor_plain_slurm(role: str, userid: str) -> None:
    statements = _roles()[role]
    other = WORKER if userid == CONTROLLER else CONTROLLER
    for namespace in (
        schema.SLURM_NAMESPACE,
        schema.slurm_namespace(other),  # a worker never writes the controller's namespace, nor the reverse
        schema.slurm_namespace("AROAOTHERROLE:" + userid.split(":")[1]),  # nor its instance under another role
        schema.slurm_namespace(userid) + "/x",
        schema.slurm_namespace("*"),  # a literal '*' is no wildcard in StringEquals
    ):
        assert not _put(statements, userid, namespace), (role, userid, namespace)


@pytest.mark.parametrize(
    ("role", "own_allowed"),
    [
        ("controller", True),  # the publisher's write
        ("controller+agent", True),
        ("shared", True),  # the shared role's controller statements are on the workers too...
        ("shared+agent", True),
        ("worker", False),  # a worker role of its own grants no Slurm namespace at all
        ("worker+agent", True),  # ...and the agent's Allow opens only the node's own (the Deny spares it)
    ],
)
def test_a_node_may_write_only_its_own_slurm_namespace(role: str, own_allowed: bool) -> None:
    """Where a worker may write its own `Slurm/ROLEID:i-worker`, the scaler ignores it (it reads only the
    controller instance's): tests/integration/test_hyperpod_moto.py shows a forgery there removes nothing."""
    statements = _roles()[role]
    for userid in (CONTROLLER, WORKER):
        assert _put(statements, userid, schema.slurm_namespace(userid)) is own_allowed, (role, userid)
    assert schema.slurm_namespace_instance(schema.slurm_namespace(WORKER)) == "i-0a0a0a0a0a0a0a0a0"


def test_the_agents_own_namespaces_stay_open_and_gpufleet_nodes_own_stays_its_own() -> None:
    both = _roles()["shared+agent"]
    assert _put(both, WORKER, "CWAgent")
    assert _put(both, WORKER, schema.node_namespace(WORKER))
    assert not _put(both, WORKER, schema.node_namespace(CONTROLLER))


def test_the_controller_role_grants_slurm_only_through_the_policy_variable() -> None:
    """Without aws:userid in the request (not an instance's or role session's credentials) nothing matches."""
    assert not _put(_doc("execution-role-controller"), "", schema.slurm_namespace(CONTROLLER))
    assert not evaluate(
        _doc("execution-role-controller"), "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "Slurm"}
    ).allowed
