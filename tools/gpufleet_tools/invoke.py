"""Docker-free local invoke: import functions/<name>/app.py in-process and call its handler once, with a
Lambda context good enough for Powertools. Used by `gpufleet invoke`, `local send`, the rehearsal and tests."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.aws.clients import error_code, is_loopback
from gpufleet.domain import defaults
from gpufleet_tools.session import LOCAL_UP, account_id, aws_trouble, client, use_endpoint

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig
    from aws_lambda_powertools.utilities.idempotency.hook import IdempotentHookFunction
    from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord

DEFAULT_TABLE = "gpufleet-state"
# Powertools Metrics warns on every invocation that added none (a rejected event): it tells a person at a
# terminal nothing, so the local tools drop it. Lambda keeps it.
EMPTY_METRICS_WARNING = "No application metrics to publish"


class NotReady(Exception):
    """What must exist before a function can run here, in one line with what to do: the alternative is a
    Powertools traceback from deep inside the first call."""


@dataclass(frozen=True)
class StoredResult:
    """A result the idempotency store handed back: the event was handled before, nothing was done again.
    Powertools says so only at debug level, and the result reads like a fresh one."""

    event_id: str
    processed_at: datetime | None

    def notice(self) -> str:
        when = f"{self.processed_at:%Y-%m-%d %H:%M:%S} UTC" if self.processed_at else "an earlier call"
        return (
            f"already handled: event id {self.event_id} was processed at {when}; "
            "this is the stored result, nothing was changed again"
        )

    def as_json(self) -> dict[str, str | None]:
        return {"event_id": self.event_id, "processed_at": self.processed_at.isoformat() if self.processed_at else None}


@dataclass
class Invocation:
    result: Any = None
    already_handled: list[StoredResult] = field(default_factory=list)
    module: Any = field(default=None, repr=False)  # the imported app.py: `local send` reads why records failed


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


def prepare(endpoint: str | None, policy: str | None, table: str | None, dry_run: bool) -> None:
    """The environment Lambda would give the functions, in this process, once before the first invoke():
    NotReady when the state table is not there (before any function is imported); the account the
    credentials answer for, looked up once (unknown: left unset, not asked again)."""
    check_state_table(_environment(endpoint, policy, table, dry_run), endpoint)
    env = os.environ
    if defaults.ENV_ACCOUNT_ID not in env and (account := account_id()):  # as Lambda's would be; unknown: unchecked
        env[defaults.ENV_ACCOUNT_ID] = account


def invoke(app: Path, event: Any) -> Invocation:
    """Import a function's app.py (find_function) in-process and call its handler once, in the environment
    prepare() set."""
    function = app.parent.name
    spec = importlib.util.spec_from_file_location(f"gpufleet_local_{function}", app)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load {app}")
    module = importlib.util.module_from_spec(spec)
    done = Invocation(module=module)
    # The function's logs and EMF: stderr; its result: stdout.
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=EMPTY_METRICS_WARNING)
        spec.loader.exec_module(module)
        _watch_stored_results(module, done.already_handled)
        done.result = module.lambda_handler(event, LocalLambdaContext(function))
    return done


def _environment(endpoint: str | None, policy: str | None, table: str | None, dry_run: bool) -> str:
    """The environment Lambda would give the function, in this process; the state table's name."""
    env = os.environ
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env["POWERTOOLS_TRACE_DISABLED"] = "true"
    env[defaults.ENV_STATE_TABLE] = table or env.get(defaults.ENV_STATE_TABLE, DEFAULT_TABLE)
    use_endpoint(endpoint)
    if policy:
        env[defaults.ENV_POLICY_FILE] = str(Path(policy).resolve())
    if dry_run:
        env[defaults.ENV_DRY_RUN] = "true"
    return env[defaults.ENV_STATE_TABLE]


def check_state_table(table: str, endpoint: str | None) -> None:
    """Every function keeps its leases, idempotency records or incidents in the state table; without it
    the first call fails inside Powertools (IdempotencyPersistenceLayerError). Other refusals (no
    DescribeTable permission) are left to the function."""
    where = endpoint or os.environ.get(defaults.ENV_ENDPOINT_URL)
    try:
        dynamodb = client("dynamodb")
        dynamodb.describe_table(TableName=table)
    except Exception as exc:
        if error_code(exc) == "ResourceNotFoundException":
            raise NotReady(missing_table(table, where)) from None
        if trouble := aws_trouble(exc, where):
            raise NotReady(trouble) from None


def missing_table(table: str, endpoint: str | None) -> str:
    if endpoint and is_loopback(endpoint):
        return (
            f"no state table {table!r} at {endpoint}: start the local stack (moto with the template's table, "
            f"queues and policy) with `{LOCAL_UP}` and run this again without --endpoint, or pass --table NAME"
        )
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return (
        f"no state table {table!r} at {endpoint or f'AWS ({region})'}: pass --table with the stack's "
        f"StateTableName output (or set {defaults.ENV_STATE_TABLE}), or try it locally first with `{LOCAL_UP}`"
    )


def _watch_stored_results(module: Any, sink: list[StoredResult]) -> None:
    """Note every result a function's idempotency store hands back instead of running (Powertools'
    response hook, on each IdempotencyConfig the app module holds): exact, where comparing the table
    before and after could not tell a stored result from an expired record run again."""
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig

    for config in {id(v): v for v in vars(module).values() if isinstance(v, IdempotencyConfig)}.values():
        config.response_hook = _recording(config, sink)


def _recording(config: IdempotencyConfig, sink: list[StoredResult]) -> IdempotentHookFunction:
    previous = config.response_hook

    def hook(response: Any, idempotent_data: DataRecord) -> Any:
        event_id = response.get("event_id") if isinstance(response, dict) else None
        expiry = idempotent_data.expiry_timestamp  # written with the result: its time + the TTL (a Decimal)
        processed = datetime.fromtimestamp(float(expiry) - config.expires_after_seconds, UTC) if expiry else None
        sink.append(StoredResult(str(event_id or idempotent_data.idempotency_key), processed))
        return previous(response, idempotent_data) if previous else response

    return hook
