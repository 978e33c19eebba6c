"""`gpufleet-node busy -- COMMAND`: the node marked busy while a job runs, unmarked after (success,
failure, SIGTERM), shared by overlapping jobs, exit code passed through. Against a fake IMDSv2 on loopback
and fake STS and DynamoDB clients whose every call is checked against botocore's own models. Python >= 3.9."""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from fakes import FakeImds
from gpufleet_node import busy, cli

META = {"instance-id": "i-0abc", "placement/region": "eu-west-1", "instance-type": "g5.xlarge"}
ASG_TAGS = {"aws:autoscaling:groupName": "train-jobs"}
PY = sys.executable


USERID = "AROAEXAMPLEROLEID:i-0abc"  # an instance profile's aws:userid: role id, then the instance id


class FakeAws:
    """The two services the helper calls, as AWS takes them: sts:GetCallerIdentity (this instance's
    profile unless `userid` says otherwise) and the busy mark's PutItem / DeleteItem, parameters checked
    against botocore's own models (a wrong name or type raises ParamValidationError). The mark's state is
    kept in a file so the command itself can read it; `fail` makes every DynamoDB call raise like a denied one."""

    def __init__(self, state: Path, fail: bool = False, userid: str = USERID) -> None:
        import botocore.session

        session = botocore.session.get_session()
        self.models = {s: session.get_service_model(s) for s in ("dynamodb", "sts")}
        self.state = state
        self.fail = fail
        self.userid = userid
        self.calls: List[Dict[str, Any]] = []
        state.write_text("unprotected")

    def _checked(self, service: str, operation: str, params: Dict[str, Any]) -> None:
        from botocore.validate import validate_parameters

        validate_parameters(params, self.models[service].operation_model(operation).input_shape)
        if service == "dynamodb":
            self.calls.append(dict(params, operation=operation))
        if self.fail and service == "dynamodb":
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, operation)

    def get_caller_identity(self) -> Dict[str, Any]:
        self._checked("sts", "GetCallerIdentity", {})
        return {"UserId": self.userid, "Account": "123456789012", "Arn": "arn:aws:sts::123456789012:assumed-role/r/x"}

    def put_item(self, **params: Any) -> Dict[str, Any]:
        self._checked("dynamodb", "PutItem", params)
        assert params["Item"]["node"] == {"S": self.userid} and params["TableName"] == "gpufleet-busy"
        self.state.write_text("protected")
        return {}

    def delete_item(self, **params: Any) -> Dict[str, Any]:
        self._checked("dynamodb", "DeleteItem", params)
        assert params["Key"] == {"node": {"S": self.userid}}
        self.state.write_text("unprotected")
        return {}

    def protections(self) -> List[bool]:
        return [c["operation"] == "PutItem" for c in self.calls]


FakeAutoScaling = FakeAws  # the helper's interface is unchanged: the tests below read "protected" as "marked"


@pytest.fixture
def node(tmp_path: Path):
    """(run, fake): `run(args)` is `gpufleet-node busy ARGS` on instance i-0abc of ASG train-jobs."""
    fake = FakeAutoScaling(tmp_path / "protection")
    with FakeImds(META, instance_tags=ASG_TAGS) as imds:
        config = tmp_path / "publisher.json"
        config.write_text(json.dumps({"imds_url": imds.url, "identity_cache": None}))
        state = str(tmp_path / "busy")

        def run(args: List[str], client: Optional[FakeAutoScaling] = None) -> int:
            factory = lambda service, region, endpoint: client or fake  # noqa: E731
            return cli.main(["busy", "--state-dir", state, "--config", str(config), *args], factory)

        yield run, fake


def sees(fake: FakeAutoScaling, out: Path) -> List[str]:
    """A command that writes what Auto Scaling holds for the instance while it runs."""
    return [PY, "-c", "import shutil; shutil.copy(%r, %r)" % (str(fake.state), str(out))]


def test_protected_while_the_command_runs_and_cleared_after(node, tmp_path: Path) -> None:
    run, fake = node
    assert run(["--", *sees(fake, tmp_path / "seen")]) == 0
    assert (tmp_path / "seen").read_text() == "protected"
    assert fake.protections() == [True, False]
    since = fake.calls[0]["Item"].pop("since")["S"]  # when the mark was made (UTC): the scaler tells old ones
    assert len(since) == 20 and since.endswith("Z"), since
    assert fake.calls[0] == {
        "operation": "PutItem",
        "TableName": "gpufleet-busy",
        "Item": {"node": {"S": USERID}, "instance": {"S": "i-0abc"}, "asg": {"S": "train-jobs"}},
    }
    assert fake.calls[1] == {"operation": "DeleteItem", "TableName": "gpufleet-busy", "Key": {"node": {"S": USERID}}}
    assert fake.state.read_text() == "unprotected"


@pytest.mark.parametrize("code", [1, 3, 42])
def test_a_failing_command_clears_the_protection_and_its_exit_code_is_returned(node, code: int) -> None:
    run, fake = node
    assert run(["--", PY, "-c", "import sys; sys.exit(%d)" % code]) == code
    assert fake.protections() == [True, False]


def test_a_command_that_cannot_be_run_clears_the_protection(node) -> None:
    run, fake = node
    assert run(["--", "/nonexistent/worker"]) == busy.EXIT_NOT_FOUND
    assert fake.protections() == [True, False]


def wait_for(path: Path, timeout_s: float = 20.0) -> None:
    """Until the file exists (a mechanism, not a timing: the limit only ends a hung test)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, "%s never appeared" % path
        time.sleep(0.01)


def sigterm_once(started: Path) -> threading.Thread:
    """Sends this process SIGTERM once the command says it started (the helper forwards it)."""
    t = threading.Thread(target=lambda: (wait_for(started), os.kill(os.getpid(), signal.SIGTERM)), daemon=True)
    t.start()
    return t


def test_sigterm_is_forwarded_to_the_command_and_the_protection_cleared(node, tmp_path: Path) -> None:
    """A worker that traps SIGTERM (finishes its step, then exits 7): the helper waits for it and passes its code."""
    run, fake = node
    started, got = tmp_path / "started", tmp_path / "got"
    worker = (
        "import signal, sys, time, pathlib\n"
        "def stop(n, f):\n"
        "    pathlib.Path(%r).write_text(str(n)); sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "pathlib.Path(%r).write_text('x')\n"
        "while True: time.sleep(0.05)\n"
    ) % (str(got), str(started))
    t = sigterm_once(started)
    assert run(["--", PY, "-c", worker]) == 7
    t.join()
    assert got.read_text() == str(int(signal.SIGTERM))
    assert fake.protections() == [True, False]


def test_a_command_killed_by_the_forwarded_sigterm_exits_143(node, tmp_path: Path) -> None:
    run, fake = node
    started = tmp_path / "started"
    t = sigterm_once(started)
    code = run(["--", "sh", "-c", "touch %s; exec sleep 60" % started])
    t.join()
    assert code == 128 + signal.SIGTERM
    assert fake.protections() == [True, False]


def test_two_overlapping_jobs_clear_the_protection_only_when_the_last_ends(node, tmp_path: Path) -> None:
    """Job A (the CLI) starts; job B (a second holder on the same state dir, on a thread) joins; A ends while
    B runs: still protected; B ends: cleared. One set by the first, one clear by the last."""
    run, fake = node
    state = tmp_path / "busy"
    b_joined, b_may_end, after_a = tmp_path / "b-joined", tmp_path / "b-may-end", tmp_path / "after-a"
    protection = busy.BusyMark(fake, USERID, "i-0abc", "train-jobs")
    b = busy.Holders(str(state), name="job-b")

    def job_b() -> None:
        wait_for(state / ("%d.holder" % os.getpid()))  # A holds the node
        b.acquire(lambda: protection.set(True))
        b_joined.write_text("x")
        wait_for(b_may_end)
        b.release(lambda: protection.set(False))

    t = threading.Thread(target=job_b, daemon=True)
    t.start()
    a = [PY, "-c", "import pathlib, time\nwhile not pathlib.Path(%r).exists(): time.sleep(0.01)" % str(b_joined)]
    assert run(["--", *a]) == 0
    after_a.write_text(fake.state.read_text())
    b_may_end.write_text("x")
    t.join(timeout=30)
    assert after_a.read_text() == "protected"  # A ended while B ran
    assert fake.protections() == [True, False]
    assert fake.state.read_text() == "unprotected"


def finished_pid() -> int:
    import subprocess

    proc = subprocess.Popen([PY, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_holder_whose_helper_and_command_are_gone_does_not_keep_the_node(node, tmp_path: Path) -> None:
    """A helper killed with SIGKILL leaves its file: the next job to leave prunes it and clears."""
    run, fake = node
    state = tmp_path / "busy"
    state.mkdir()
    dead = finished_pid()
    (state / "lost.holder").write_text(json.dumps({"processes": [{"pid": dead, "started": None}]}))
    assert run(["--", PY, "-c", "pass"]) == 0
    assert fake.protections() == [True, False]
    assert not (state / "lost.holder").exists()


def test_a_command_still_running_after_its_helper_was_killed_keeps_the_node(node, tmp_path: Path) -> None:
    import subprocess

    run, fake = node
    state = tmp_path / "busy"
    state.mkdir()
    # Alive until the test ends it: it waits on its stdin, which only the test closes.
    orphan = subprocess.Popen([PY, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        processes = [
            {"pid": finished_pid(), "started": None},
            {"pid": orphan.pid, "started": busy._started(orphan.pid)},
        ]
        (state / "killed.holder").write_text(json.dumps({"processes": processes}))
        assert run(["--", PY, "-c", "pass"]) == 0
        assert fake.protections() == []  # the orphan's job holds it: neither set again nor cleared
        assert fake.state.read_text() == "unprotected"  # (the fake started unprotected: nothing was called)
    finally:
        orphan.kill()
        orphan.wait()


def test_a_denied_call_runs_the_command_unprotected_with_one_warning(node, tmp_path: Path, capsys) -> None:
    run, _ = node
    denied = FakeAutoScaling(tmp_path / "denied", fail=True)
    assert run(["--", PY, "-c", "import sys; sys.exit(5)"], client=denied) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "AccessDenied" in err[0] and "without a busy mark" in err[0]
    assert denied.protections() == [True]  # never joined, so nothing to clear
    assert not list((tmp_path / "busy").glob("*.holder"))


def test_strict_refuses_to_run_unprotected(node, tmp_path: Path) -> None:
    run, _ = node
    denied = FakeAutoScaling(tmp_path / "denied", fail=True)
    ran = tmp_path / "ran"
    assert run(["--strict", "--", "touch", str(ran)], client=denied) == busy.EXIT_TEMPFAIL
    assert not ran.exists()


def test_an_instance_outside_any_auto_scaling_group_runs_the_command_and_says_so(tmp_path: Path, capsys) -> None:
    fake = FakeAutoScaling(tmp_path / "protection")
    with FakeImds(META, instance_tags={}) as imds:
        config = tmp_path / "publisher.json"
        config.write_text(json.dumps({"imds_url": imds.url, "identity_cache": None}))
        code = cli.main(
            ["busy", "--config", str(config), "--", PY, "-c", "import sys; sys.exit(3)"], lambda s, r, e: fake
        )
    assert code == 3 and fake.calls == []
    assert "in no Auto Scaling group" in capsys.readouterr().err


def test_usage_errors(capsys) -> None:
    assert cli.main(["busy"]) == busy.EXIT_USAGE
    assert "no command given" in capsys.readouterr().err
    assert cli.main([]) == busy.EXIT_USAGE


def test_credentials_that_are_not_the_instance_profile_write_no_mark(tmp_path: Path, capsys) -> None:
    """Credentials of another principal (IRSA, static keys) have an aws:userid without this instance's id:
    the scaler would never take their mark, so none is written and the command runs, said once."""
    other = FakeAws(tmp_path / "protection", userid="AROAEXAMPLEROLEID:i-0other")
    with FakeImds(META, instance_tags=ASG_TAGS) as imds:
        config = tmp_path / "publisher.json"
        config.write_text(json.dumps({"imds_url": imds.url, "identity_cache": None}))
        code = cli.main(
            ["busy", "--config", str(config), "--", PY, "-c", "import sys; sys.exit(3)"], lambda s, r, e: other
        )
    assert code == 3 and other.calls == []
    err = capsys.readouterr().err
    assert "not instance i-0abc's profile" in err and err.count("\n") == 1
