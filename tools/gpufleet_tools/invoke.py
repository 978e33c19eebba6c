"""Docker-free local invoke: import functions/<name>/app.py in-process and call its handler once, with a
Lambda context good enough for Powertools. Used by `gpufleet invoke`, `local send`, the rehearsal and tests."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from gpufleet.domain import defaults
from gpufleet_tools.session import account_id, use_endpoint

DEFAULT_TABLE = "gpufleet-state"


class LocalLambdaContext:
    """Enough of the Lambda context object for Powertools and our handlers."""

    def __init__(self, function_name: str, timeout_s: int = 60, memory_mb: int = 512) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = str(uuid.uuid4())
        region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
        self.invoked_function_arn = f"arn:aws:lambda:{region}:000000000000:function:{function_name}"
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def find_function(name: str, functions_dir: str | None) -> Path:
    candidates = [Path(functions_dir)] if functions_dir else []
    here = Path.cwd()
    candidates += [p / "functions" for p in (here, *here.parents)]
    candidates.append(Path(__file__).resolve().parents[2] / "functions")
    for base in candidates:
        app = base / name / "app.py"
        if app.is_file():
            return app
    raise SystemExit(f"error: no functions/{name}/app.py found (try --functions-dir)")


def invoke(
    function: str,
    event: Any,
    *,
    endpoint: str | None,
    policy: str | None,
    table: str | None,
    dry_run: bool,
    functions_dir: str | None = None,
) -> Any:
    """Import functions/<function>/app.py in-process and call its handler once."""
    env = os.environ
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env["POWERTOOLS_TRACE_DISABLED"] = "true"
    env[defaults.ENV_STATE_TABLE] = table or env.get(defaults.ENV_STATE_TABLE, DEFAULT_TABLE)
    use_endpoint(endpoint)
    if defaults.ENV_ACCOUNT_ID not in env and (account := account_id()):  # as Lambda's would be; unknown: unchecked
        env[defaults.ENV_ACCOUNT_ID] = account
    if policy:
        env[defaults.ENV_POLICY_FILE] = str(Path(policy).resolve())
    if dry_run:
        env[defaults.ENV_DRY_RUN] = "true"
    app = find_function(function, functions_dir)
    spec = importlib.util.spec_from_file_location(f"gpufleet_local_{function}", app)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load {app}")
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(sys.stderr):  # the function's logs and EMF: stderr; its result: stdout
        spec.loader.exec_module(module)
        return module.lambda_handler(event, LocalLambdaContext(function))
