"""A Slurm job's account and partition in the usage records (slurm_jobs.py), against a fake squeue: an
injected runner, and a script named squeue on PATH. A HyperPod node's records carry its instance group.
Python >= 3.9."""

import os
import stat
import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from fakes import FakeCloudWatch, FakeLogs
from gpufleet_node import schema
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import ProcessUse, SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import LogSender, Sender
from gpufleet_node.slurm_jobs import SlurmJobs, parse, run_squeue, squeue_command
from gpufleet_node.tracker import UsageTracker
from gpufleet_node.workload import SLURM, UNKNOWN_WORKLOAD, Workload

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)
# What `squeue --noheader --format=%A|%a|%P --jobs=...` prints (squeue(1): %A job id, %a account, %P partition)
SQUEUE_OUT = ["4242|ml-research|train", "4243|(null)|debug"]


class Runner:
    def __init__(self, lines=SQUEUE_OUT, error=None):
        self.lines, self.error, self.calls = lines, error, []

    def __call__(self, args):
        self.calls.append(list(args))
        if self.error is not None:
            raise self.error
        wanted = args[-1].split("=", 1)[1].split(",")
        return [line for line in self.lines if line.split("|")[0] in wanted]


def test_parse_squeue_lines():
    assert parse([*SQUEUE_OUT, "garbage", "|x|y"]) == {"4242": ("ml-research", "train"), "4243": (None, "debug")}


def test_one_squeue_per_new_ids_and_answers_are_cached_bounded():
    runner = Runner()
    jobs = SlurmJobs(runner, max_jobs=2)
    assert jobs.lookup(["4242", "4243", "4242"]) == {"4242": ("ml-research", "train"), "4243": (None, "debug")}
    assert runner.calls == [squeue_command(["4242", "4243"])]
    assert jobs.lookup(["4242"]) == {"4242": ("ml-research", "train")} and len(runner.calls) == 1
    assert jobs.lookup(["9999"]) == {"9999": (None, None)}  # ended: remembered as unknown, not asked again
    jobs.lookup(["9999"])
    assert len(runner.calls) == 2
    assert len(jobs._known) == 2  # bounded: 4242 forgotten first


def test_no_squeue_on_the_node_is_never_asked_again():
    runner = Runner(error=FileNotFoundError("squeue"))
    jobs = SlurmJobs(runner)
    assert jobs.lookup(["1"]) == {} and jobs.disabled
    jobs.lookup(["2"])
    assert len(runner.calls) == 1


def test_a_failing_squeue_leaves_the_jobs_unknown():
    jobs = SlurmJobs(Runner(error=subprocess.CalledProcessError(1, "squeue", stderr="Invalid job id specified")))
    assert jobs.lookup(["1"]) == {"1": (None, None)}


def test_a_squeue_script_on_path(tmp_path, monkeypatch):
    script = tmp_path / "squeue"
    script.write_text("#!/bin/sh\necho \"$@\" > %s/args\necho '4242|ml-research|train'\n" % tmp_path)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", "%s%s%s" % (tmp_path, os.pathsep, os.environ.get("PATH", "")))
    assert SlurmJobs(run_squeue).lookup(["4242"]) == {"4242": ("ml-research", "train")}
    assert (tmp_path / "args").read_text().split() == ["--noheader", "--format=%A|%a|%P", "--jobs=4242"]


class OneJob:
    def workload_of(self, pid):
        return Workload(SLURM, job_id="4242", user="alice") if pid == 101 else UNKNOWN_WORKLOAD

    def unknown(self):
        return {}


@pytest.mark.parametrize("jobs", [None, "squeue"])
def test_the_usage_record_carries_the_jobs_account_partition_and_instance_group(jobs):
    backend = SimulatedBackend(gpus=1)
    identity = Identity("i-0a2", "us-west-2", "ml.p5.48xlarge", hyperpod_cluster="ml-cluster", instance_group="gpu-a")
    logs, metrics = FakeLogs(schema.USAGE_LOG_GROUP), Sender(FakeCloudWatch())
    runner = Runner()
    usage = UsageTracker(
        OneJob(),
        None,
        [backend.describe(0).uuid],
        LogSender(logs, schema.USAGE_LOG_GROUP, identity.instance_id),
        metrics,
        window_s=300,
        sample_s=10.0,
        jobs=SlurmJobs(runner) if jobs else None,
    )
    publisher = Publisher(backend, identity, metrics, detail="adaptive", usage=usage)
    publisher.start(xid_thread=False)
    backend.set(0, 90, 50)
    backend.set_processes(0, [ProcessUse(101, 1000.0, 90.0)])
    simulate(publisher, T0, 600, every_s=10.0)
    publisher.finish(T0 + timedelta(seconds=600))
    records = logs.records()
    assert records and all(r["group"] == "hyperpod:ml-cluster/gpu-a" for r in records)
    [w] = records[0]["w"].values()
    if jobs:
        assert (w["job_id"], w["account"], w["partition"]) == ("4242", "ml-research", "train")
        assert len(runner.calls) == 1  # two windows, one squeue
    else:
        assert "account" not in w and "partition" not in w
