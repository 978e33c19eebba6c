"""What `local send` leaves on the notification queue after the notifier answers: Lambda's SQS event
source rules for ReportBatchItemFailures (AWS Lambda developer guide, "Handling errors for an SQS event
source"), as a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet_tools.local import batch_failures

IDS = ["m1", "m2", "m3"]


@pytest.mark.parametrize(
    ("response", "left"),
    [
        (None, []),  # no answer: every record succeeded
        ({}, []),
        ({"batchItemFailures": []}, []),
        ({"batchItemFailures": None}, []),
        ({"batchItemFailures": [{"itemIdentifier": "m2"}]}, ["m2"]),  # only the failed one stays
        ({"batchItemFailures": [{"itemIdentifier": "m3"}, {"itemIdentifier": "m1"}]}, ["m1", "m3"]),
        ({"batchItemFailures": [{"itemIdentifier": ""}]}, IDS),  # an empty id: the whole batch failed
        ({"batchItemFailures": [{"itemIdentifier": None}]}, IDS),
        ({"batchItemFailures": [{"itemId": "m2"}]}, IDS),  # a bad key name
        ({"batchItemFailures": [{"itemIdentifier": "not-in-batch"}]}, IDS),
        ({"batchItemFailures": "m2"}, IDS),
    ],
)
def test_the_records_left_on_the_queue(response: Any, left: list[str]) -> None:
    assert batch_failures(response, IDS) == left


@pytest.mark.parametrize(
    "args",
    [["ml", "ns/p", "--gpus", "-3"], ["ml", "ns/", "--gpus", "1"], ["ml", "ns/p", "--selector", "no-equals"]],
)
def test_a_malformed_local_pod_is_refused_in_one_line_before_anything_is_read(args: list[str], tmp_path: Path) -> None:
    from gpufleet_tools.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["local", "pod", *args, "--dir", str(tmp_path)])
    assert str(exc.value).startswith("error: ") and "want NAMESPACE/NAME, --gpus >= 1" in str(exc.value)
    assert list(tmp_path.iterdir()) == []
