"""Run the deployed notifier handler once with X-Ray tracing on, as inside Lambda, and print every
trace document it emitted (JSON lines). Usage: python xray_probe.py deployed|patch-httplib EVENT_FILE.

LAMBDA_TASK_ROOT and _X_AMZN_TRACE_ID make the X-Ray SDK take its in-Lambda path (a facade segment,
subsegments streamed out); the emitter is replaced by one that keeps the documents here. With
`patch-httplib` the probe additionally patches http.client first - the control that proves this capture
sees HTTP calls and would catch a URL.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from aws_xray_sdk.core import patch, xray_recorder

ROOT = Path(__file__).resolve().parents[2]
documents: list[dict[str, Any]] = []


class CaptureEmitter:
    def send_entity(self, entity: Any) -> None:
        documents.append(json.loads(entity.serialize()))

    def set_daemon_address(self, address: str) -> None:
        pass

    @property
    def ip(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return 2000


def main() -> None:
    mode, event_file = sys.argv[1], sys.argv[2]
    xray_recorder.configure(emitter=CaptureEmitter(), sampling=False, context_missing="LOG_ERROR")
    if mode == "patch-httplib":
        patch(["httplib"])
    spec = importlib.util.spec_from_file_location("notifier_app", ROOT / "functions" / "notifier" / "app.py")
    assert spec is not None and spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    from gpufleet_tools.invoke import LocalLambdaContext

    app.lambda_handler(json.loads(Path(event_file).read_text()), LocalLambdaContext("notifier"))
    for doc in documents:
        print(json.dumps(doc))


if __name__ == "__main__":
    main()
