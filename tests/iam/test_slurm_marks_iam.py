"""IAM of the Slurm marks (aws/slurm_marks.py, ami/slurm_pending_gpus.py --marks-table): the scaler writes
its `slurm-marks#<cluster>` items; the controller node's role reads only those (GetItem, limited by
`dynamodb:LeadingKeys` to that prefix, the key absent denied by `Null`) and writes none of the table."""

from __future__ import annotations

import json

import pytest

from gpufleet.domain import defaults
from rehearsal.calls import ACCOUNT, REGION, CallRecord, Resource
from tests.conftest import ROOT
from tests.iam.evaluator import evaluate
from tests.iam.test_conformance import denials

TABLE = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpufleet-state"
MARKS = defaults.SLURM_MARKS_KEY_PREFIX + "ml-cluster"
OWN = {"aws:ResourceAccount": ACCOUNT, "aws:PrincipalAccount": ACCOUNT}


@pytest.mark.parametrize("action", ["dynamodb:GetItem", "dynamodb:UpdateItem"])
def test_the_scaler_may_read_and_write_the_marks_items(action: str) -> None:
    call = CallRecord("scaler", action, [Resource(TABLE, {"dynamodb:LeadingKeys": [MARKS]})])
    assert denials([call]) == []


def _controller(action: str, keys: list[str] | None, account: str = ACCOUNT) -> bool:
    statements = json.loads((ROOT / "ami/hyperpod/execution-role-controller.json").read_text())["Statement"]
    context: dict[str, object] = {**OWN, "aws:ResourceAccount": account}
    if keys is not None:
        context["dynamodb:LeadingKeys"] = keys
    return evaluate(statements, action, TABLE.replace(ACCOUNT, account), context).allowed


def test_the_controller_node_reads_only_the_marks_items() -> None:
    assert _controller("dynamodb:GetItem", [MARKS])
    assert not _controller("dynamodb:GetItem", ["GROUP#hyperpod:ml-cluster/gpu-a"])  # the scaler's state
    assert not _controller("dynamodb:GetItem", ["POLICY"])
    assert not _controller("dynamodb:GetItem", None)  # no leading key in the request: denied (Null)
    assert not _controller("dynamodb:GetItem", [MARKS], account="999999999999")
    for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:Query", "dynamodb:Scan"):
        assert not _controller(action, [MARKS]), action
