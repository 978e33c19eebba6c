"""The HyperPod execution roles gpufleet ships (ami/hyperpod/execution-role-*.json), evaluated on Slurm's
report (issue 41): alone, with AWS's CloudWatchAgentServerPolicy beside them, and as ONE role shared by the
controller and worker groups (what AWS's samples and Terraform modules do: both documents on one role).

HyperPod names every node's execution-role session `SageMaker` (defaults.HYPERPOD_SESSION_NAME), so a
node's aws:userid is `<its group's role id>:SageMaker`: one per role, not per node. What IAM enforces: a
principal may write Slurm's report only into `Slurm/${aws:userid}`, its role's own; every other Slurm
namespace (plain `Slurm`, another role's) is denied whatever else the role allows. With one shared role
the workers' aws:userid IS the controller's, so IAM lets them write the controller's namespace: that is
why the scaler trusts no report of a cluster whose controller role another group shares
(tests/integration/test_hyperpod_moto.py, test_a_controller_role_shared_with_the_workers_trusts_no_report)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet.domain import defaults
from gpufleet_node import schema
from tests.conftest import ROOT
from tests.iam.evaluator import evaluate
from tests.iam.test_node_policy import CLOUDWATCH_AGENT

SESSION = defaults.HYPERPOD_SESSION_NAME
CONTROLLER = f"AROAHYPERPODCONTROLLER:{SESSION}"  # the controller group's role of its own
WORKER = f"AROAHYPERPODWORKERS:{SESSION}"  # the worker groups' role
SHARED = f"AROAHYPERPODSHARED:{SESSION}"  # one role for both: every node's aws:userid


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
@pytest.mark.parametrize("userid", [CONTROLLER, WORKER, SHARED], ids=["controller", "worker", "shared"])
def test_no_node_writes_plain_slurm_nor_another_roles_namespace(role: str, userid: str) -> None:
    statements = _roles()[role]
    others = [u for u in (CONTROLLER, WORKER, SHARED) if u != userid]
    for namespace in (
        schema.SLURM_NAMESPACE,
        *(schema.slurm_namespace(u) for u in others),  # a worker role never writes the controller role's
        schema.slurm_namespace(userid) + "/x",
        schema.slurm_namespace("*"),  # a literal '*' is no wildcard in StringEquals
    ):
        assert not _put(statements, userid, namespace), (role, userid, namespace)


@pytest.mark.parametrize(
    ("role", "userid", "own_allowed"),
    [
        ("controller", CONTROLLER, True),  # the publisher's write
        ("controller+agent", CONTROLLER, True),
        ("worker", WORKER, False),  # a worker role of its own grants no Slurm namespace at all
        ("worker+agent", WORKER, True),  # the agent's Allow opens only the role's own (the Deny spares it)...
        ("shared", SHARED, True),  # one role: the workers write `Slurm/SHARED:SageMaker`, the controller's own
        ("shared+agent", SHARED, True),
    ],
)
def test_a_node_may_write_only_its_roles_own_slurm_namespace(role: str, userid: str, own_allowed: bool) -> None:
    """...which the scaler reads only for the controller group's role, and only when no other group shares
    it: a worker role's own namespace is ignored, a shared role's is not trusted."""
    assert _put(_roles()[role], userid, schema.slurm_namespace(userid)) is own_allowed, (role, userid)


def test_with_one_shared_role_iam_cannot_tell_a_worker_from_the_controller() -> None:
    """The same aws:userid on every node: the controller's namespace is the workers' own too."""
    worker_node_write = _put(_roles()["shared"], SHARED, schema.slurm_namespace(SHARED))
    assert worker_node_write  # allowed: so the scaler refuses a shared controller role (see the docstring)


def test_the_agents_own_namespaces_stay_open_and_gpufleet_nodes_own_stays_its_own() -> None:
    both = _roles()["shared+agent"]
    assert _put(both, SHARED, "CWAgent")
    assert _put(both, SHARED, schema.node_namespace(SHARED))
    assert not _put(both, SHARED, schema.node_namespace(CONTROLLER))


def test_the_controller_role_grants_slurm_only_through_the_policy_variable() -> None:
    """Without aws:userid in the request (not a role session's credentials) nothing matches."""
    assert not _put(_doc("execution-role-controller"), "", schema.slurm_namespace(CONTROLLER))
    assert not evaluate(
        _doc("execution-role-controller"), "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "Slurm"}
    ).allowed
