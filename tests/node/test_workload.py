"""The workload model: keys, teams, labels and records. Python >= 3.9."""

import pytest

from gpufleet_node.workload import KINDS, UNKNOWN_WORKLOAD, Workload

UID = "5f6c0d2e-8a1b-4c3d-9e7f-0123456789ab"


@pytest.mark.parametrize(
    ("workload", "key", "team", "label"),
    [
        (
            Workload("pod", namespace="team-a", pod="trainer-0", container="main", pod_uid=UID),
            "pod:team-a/trainer-0/main",
            "team-a",
            "team-a/trainer-0 (main)",
        ),
        (
            Workload("pod", pod_uid=UID, container_id="ab" * 32),
            "pod:%s/%s" % (UID, "ab" * 32),
            "pod:" + UID,
            "pod " + UID,
        ),
        (Workload("slurm", job_id="4242", user="alice"), "slurm:4242", "alice", "Slurm job 4242 (alice)"),
        (Workload("slurm", job_id="4242"), "slurm:4242", "__unknown__", "Slurm job 4242"),
        (Workload("unit", unit="ollama.service"), "unit:ollama.service", "ollama.service", "unit ollama.service"),
        (Workload("unit", unit="vllm.service", user="bob"), "unit:vllm.service", "bob", "unit vllm.service"),
        (Workload("user", user="alice"), "user:alice", "alice", "user alice"),
        (UNKNOWN_WORKLOAD, "unknown", "__unknown__", "unknown owner"),
    ],
)
def test_key_team_and_label(workload, key, team, label):
    assert (workload.key, workload.team, workload.label()) == (key, team, label)


def test_records_are_compact_and_round_trip():
    pod = Workload("pod", namespace="team-a", pod="p", container="main", pod_uid=UID, container_id="cd" * 32)
    record = pod.to_record()
    assert record == {"kind": "pod", "namespace": "team-a", "pod": "p", "container": "main", "pod_uid": UID}
    assert Workload.from_record(record) == pod
    assert Workload.from_record({"kind": "martian"}).kind == "unknown"
    assert Workload.from_record({}) == UNKNOWN_WORKLOAD


def test_replace_copies_with_changes_and_keeps_the_original():
    ids = Workload("pod", pod_uid=UID, container_id="ef" * 32)
    named = ids.replace(namespace="team-a", pod="p", container="main")
    assert (named.kind, named.pod_uid, named.container_id, named.namespace) == ("pod", UID, "ef" * 32, "team-a")
    assert ids.namespace is None


def test_equal_by_key_and_hashable():
    assert Workload("user", user="alice") == Workload("user", user="alice")
    assert len({Workload("user", user="alice"), Workload("user", user="alice"), UNKNOWN_WORKLOAD}) == 2
    assert Workload("user", user="alice") != "user:alice"


def test_kinds_are_checked():
    assert KINDS == ("pod", "slurm", "unit", "user", "unknown")
    with pytest.raises(ValueError, match="workload kind"):
        Workload("job")
