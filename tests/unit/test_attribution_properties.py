"""Properties of the node's workload attribution parsers (gpufleet_node.attribution, .podresources): any
text is safe to parse, and the ids the kubelet and Slurm write come back out whatever surrounds them."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from gpufleet_node.attribution import container_log_name, parse_cgroup, start_time
from gpufleet_node.podresources import device_key
from gpufleet_node.workload import KINDS, Workload

HEX = "0123456789abcdef"
uuids = st.uuids().map(str)
container_ids = st.text(HEX, min_size=64, max_size=64)
dns_labels = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z")
cgroup_text = st.text(alphabet=string.printable + "\x00\u00e9\u2603", max_size=400)
cgroupish = st.lists(
    st.sampled_from(["0", "1", ":", "/", "kubepods", ".slice", "-pod", "pod", "_", "-", "job_", "slurm", "\n", "7"])
    | uuids
    | container_ids,
    max_size=30,
).map("".join)


@given(st.one_of(st.text(), cgroup_text, cgroupish))
def test_parse_cgroup_never_raises_and_always_returns_a_workload(text: str) -> None:
    found = parse_cgroup(text)
    assert isinstance(found, Workload)
    assert found.kind in KINDS


@given(
    uuids,
    container_ids,
    st.sampled_from(["burstable", "besteffort", "guaranteed"]),
    st.sampled_from(["cri-containerd", "crio", "docker"]),
    st.sampled_from(["", "/../", "/../../../"]),  # at the top, or seen from inside a cgroup namespace
)
def test_systemd_pod_cgroups_give_back_uid_and_container(uid: str, cid: str, qos: str, runtime: str, nest: str) -> None:
    pod = uid.replace("-", "_")
    root = (nest + "kubepods.slice") if nest else "/kubepods.slice"
    qos_part = "" if qos == "guaranteed" else f"/kubepods-{qos}.slice"
    qos_dash = "" if qos == "guaranteed" else qos + "-"
    pod_part = f"kubepods-{qos_dash}pod{pod}.slice"
    found = parse_cgroup(f"0::{root}{qos_part}/{pod_part}/{runtime}-{cid}.scope\n")
    assert (found.kind, found.pod_uid, found.container_id) == ("pod", uid, cid)


# What a user may name cgroups in their delegated subtree: owner names of every kind, and anything else.
owner_lookalikes = st.sampled_from(
    [
        "kubepods",
        "kubepods.slice",
        "kubepods-burstable.slice",
        "burstable",
        "slurm",
        "slurm_node7",
        "uid_0",
        "uid_2000",
        "job_4242",
        "step_0",
        "system.slice",
        "slurmstepd.scope",
        "node7_slurmstepd.scope",
        "user-0.slice",
        "user-2000.slice",
        "user@1000.service",
        "app.slice",
        "evil.service",
        "docker-" + "a" * 64 + ".scope",
    ]
)
segment = (
    owner_lookalikes
    | uuids.map(lambda u: "pod" + u)
    | uuids.map(lambda u: "kubepods-burstable-pod" + u.replace("-", "_") + ".slice")
    | container_ids
    | st.text(st.characters(blacklist_characters="/\n\r", blacklist_categories=["Cs"]), min_size=1, max_size=12)
).filter(lambda s: s not in (".", ".."))


@given(
    st.integers(0, 2**32 - 1),
    st.lists(segment, max_size=10),
    st.sampled_from(["/user.slice/", "/", "/../../", "/../../user.slice/"]),
    st.booleans(),
)
def test_anything_under_a_user_slice_is_that_users(uid: int, below: list[str], above: str, hybrid: bool) -> None:
    """Issue 29: a user's delegated subtree (user@.service, Delegate=yes) is theirs whatever it names."""
    path = above + f"user-{uid}.slice/" + "/".join(below)
    text = f"1:name=systemd:{path}\n4:cpu,cpuacct:/user.slice\n0::/\n" if hybrid else f"0::{path}\n"
    found = parse_cgroup(text)
    assert (found.kind, found.user, found.pod_uid, found.job_id) == ("user", str(uid), None, None)


@given(st.integers(1, 2**31), st.sampled_from(["slurm", "slurm_node7"]), st.integers(0, 2**31), st.integers(0, 9))
def test_slurm_v1_paths_give_back_job_and_uid(job: int, prepend: str, uid: int, step: int) -> None:
    found = parse_cgroup(f"4:freezer:/{prepend}/uid_{uid}/job_{job}/step_{step}/task_0\n0::/\n")
    assert (found.kind, found.job_id, found.user) == ("slurm", str(job), str(uid))


@given(dns_labels, dns_labels, dns_labels, container_ids)
def test_container_log_names_split_back(pod: str, namespace: str, container: str, cid: str) -> None:
    assert container_log_name(f"{pod}_{namespace}_{container}-{cid}.log") == (pod, namespace, container, cid)


@given(st.text(max_size=40), st.integers(0, 2**63))
def test_start_time_survives_any_comm(comm: str, start: int) -> None:
    fields = ["S", "1"] + ["0"] * 17 + [str(start), "1234", "56"]
    line = "42 (" + comm.replace("\n", " ") + ") " + " ".join(fields) + "\n"
    assert start_time(line) == start


@given(st.sampled_from(["GPU-", "MIG-"]), uuids, st.integers(0, 64))
def test_device_keys_strip_only_replicas(prefix: str, uid: str, replica: int) -> None:
    assert device_key(f"{prefix}{uid}::{replica}") == prefix + uid
