"""Per-process attribution against fake /proc and /var/log trees in the real formats. Python >= 3.9."""

import shutil
import tempfile
from pathlib import Path

import pytest
from proc_trees import (
    CID,
    OTHER_CID,
    OTHER_POD_UID,
    POD_UID,
    STATIC_POD_UID,
    ProcTree,
    cgroupfs_pod,
    run_unprivileged,
    stat_line,
    systemd_pod,
    v1,
    v2,
)

from gpufleet_node.attribution import Attributor, container_log_name, parse_cgroup, start_time
from gpufleet_node.workload import UNKNOWN_WORKLOAD

USERS = {0: "root", 1000: "alice", 1001: "bob"}
SLUID = "s5K1KKYAYG5D00"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tree(tmp_path):
    return ProcTree(tmp_path)


def attributor(tree, clock=None, **kw):
    return Attributor(tree.proc_root, tree.log_root, user_name=USERS.get, clock=clock or Clock(), **kw)


@pytest.mark.parametrize(
    ("cgroup", "uid", "cid"),
    [
        (v2(systemd_pod(POD_UID, CID, "burstable")), POD_UID, CID),
        (v2(systemd_pod(POD_UID, CID, "guaranteed")), POD_UID, CID),
        (v2(systemd_pod(POD_UID, CID, "besteffort")), POD_UID, CID),
        (v2(systemd_pod(POD_UID, CID, "burstable", runtime="crio")), POD_UID, CID),
        (v2(systemd_pod(POD_UID, CID, "besteffort", runtime="docker")), POD_UID, CID),
        (v2(cgroupfs_pod(POD_UID, CID)), POD_UID, CID),
        (v2(cgroupfs_pod(POD_UID, CID, "guaranteed")), POD_UID, CID),
        (v2(cgroupfs_pod(STATIC_POD_UID, CID)), STATIC_POD_UID, CID),
        (v1(cgroupfs_pod(POD_UID, CID)), POD_UID, CID),
        (v1(systemd_pod(POD_UID, CID), unified="/"), POD_UID, CID),
        (
            v2("/../../kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope" % (POD_UID.replace("-", "_"), CID)),
            POD_UID,
            CID,
        ),  # read from inside another cgroup namespace
        (
            v2("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice" % POD_UID.replace("-", "_")),
            POD_UID,
            None,
        ),  # in the pod's cgroup but no container's
    ],
)
def test_kubernetes_cgroups_name_the_pod_uid_and_container_id(cgroup, uid, cid):
    found = parse_cgroup(cgroup)
    assert (found.kind, found.pod_uid, found.container_id) == ("pod", uid, cid)
    assert found.namespace is None and found.pod is None  # names come from /var/log, not the cgroup


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        (v2("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"), ("slurm", "4242", None)),
        (v2("/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_special"), ("slurm", "4242", None)),
        (v2("/system.slice/node7_slurmstepd.scope/job_17/step_extern/user/task_0"), ("slurm", "17", None)),
        (v2("/system.slice/slurmstepd.scope/%s/step_0/user/task_1" % SLUID), ("slurm", SLUID, None)),
        (v1("/slurm/uid_1000/job_4242/step_0/task_0", "/system.slice/slurmd.service"), ("slurm", "4242", "1000")),
        (v1("/slurm_node7/uid_1001/job_9/step_batch/task_0"), ("slurm", "9", "1001")),
    ],
)
def test_slurm_cgroups_name_the_job(cgroup, expected):
    found = parse_cgroup(cgroup)
    assert (found.kind, found.job_id, found.user) == expected


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        (v2("/system.slice/ollama.service"), ("unit", "ollama.service", None)),
        (v2("/system.slice/triton-server.service/worker"), ("unit", "triton-server.service", None)),
        (v2("/system.slice/docker-%s.scope" % CID), ("unit", "docker-%s.scope" % CID, None)),
        (v2("/system.slice/slurmstepd.scope/system"), ("unit", "slurmstepd.scope", None)),
        (v1("/", "/system.slice/ollama.service"), ("unit", "ollama.service", None)),
        (v2("/user.slice/user-1000.slice/session-3.scope"), ("user", None, "1000")),
        (v2("/user.slice/user-1001.slice/user@1001.service/app.slice/jupyter.service"), ("user", None, "1001")),
        (v2("/"), ("unknown", None, None)),
        (v2("/init.scope"), ("unknown", None, None)),
        ("", ("unknown", None, None)),
    ],
)
def test_units_users_and_the_rest(cgroup, expected):
    found = parse_cgroup(cgroup)
    assert (found.kind, found.unit, found.user) == expected


@pytest.mark.parametrize(
    "garbage",
    [
        "\x00\x01",
        "0::",
        "::::",
        "0::kubepods/pod%s" % POD_UID,
        "no colons at all\n",
        "0::/kubepods.slice/podxyz\n",
        "3:cpu:/slurm/job_x/step_0",
        "0::/mypod%s.slice" % POD_UID.replace("-", "_"),
    ],
)
def test_garbage_cgroup_content_says_unknown(garbage):
    assert parse_cgroup(garbage).kind == "unknown"


def test_start_time_is_field_22_even_when_the_comm_holds_spaces_and_parens():
    assert start_time(stat_line(77, "python3 (worker) x)", 987654)) == 987654


def test_container_log_names_split_on_underscores_and_the_last_dash():
    assert container_log_name("trainer-0_team-a_main-ctr-%s.log" % CID) == ("trainer-0", "team-a", "main-ctr", CID)
    assert container_log_name("weird.log") is None
    assert container_log_name("a_b_c.txt") is None


def test_pod_names_come_from_the_container_log_symlinks(tree):
    tree.process(100, v2(systemd_pod(POD_UID, CID)))
    tree.pod_logs("team-a", "trainer-0", POD_UID, {"init-data": None, "main": CID})
    found = attributor(tree).workload_of(100)
    assert (found.namespace, found.pod, found.container) == ("team-a", "trainer-0", "main")
    assert (found.pod_uid, found.container_id) == (POD_UID, CID)
    assert (found.key, found.team, found.label()) == ("pod:team-a/trainer-0/main", "team-a", "team-a/trainer-0 (main)")


def test_a_pod_with_one_container_is_named_from_its_log_directory(tree):
    tree.process(100, v1(cgroupfs_pod(POD_UID, CID)))
    tree.pod_logs("team-b", "infer-7d9f", POD_UID, {"server": None})  # no symlink (legacy links switched off)
    found = attributor(tree).workload_of(100)
    assert found.key == "pod:team-b/infer-7d9f/server"


def test_a_container_not_found_keeps_the_pod_and_says_so(tree):
    tree.process(100, v2(systemd_pod(POD_UID, CID)))
    tree.pod_logs("team-a", "trainer-0", POD_UID, {"main": None, "sidecar": None})
    attr = attributor(tree)
    found = attr.workload_of(100)
    assert (found.namespace, found.pod, found.container, found.container_id) == ("team-a", "trainer-0", None, CID)
    assert found.key == "pod:team-a/trainer-0/%s" % CID
    assert attr.unknown() == {
        "containers": "container %s of team-a/trainer-0 not found under %s/containers" % (CID[:12], tree.log_root)
    }


def test_an_unresolved_pod_keeps_its_uid_and_says_why(tree):
    tree.process(100, v2(systemd_pod(POD_UID, CID)))
    tree.pod_logs("team-a", "other", OTHER_POD_UID, {"main": OTHER_CID})
    attr = attributor(tree)
    found = attr.workload_of(100)
    assert (found.kind, found.pod_uid, found.container_id, found.namespace) == ("pod", POD_UID, CID, None)
    assert found.team == "pod:%s" % POD_UID
    assert attr.unknown() == {"pods": "pod %s not found under %s/pods" % (POD_UID, tree.log_root)}


def test_without_kubelet_logs_the_reason_is_the_missing_directory(tree):
    tree.process(100, v2(cgroupfs_pod(POD_UID, CID)))
    attr = attributor(tree)
    assert attr.workload_of(100).pod_uid == POD_UID
    assert attr.unknown() == {"pods": "no %s/pods: pod names unknown" % tree.log_root}


def test_a_pod_named_later_is_resolved_on_retry(tree):
    clock = Clock()
    tree.process(100, v2(systemd_pod(POD_UID, CID)))
    attr = attributor(tree, clock, retry_s=30.0)
    assert attr.workload_of(100).namespace is None
    tree.pod_logs("team-a", "trainer-0", POD_UID, {"main": CID})
    clock.now += 5
    assert attr.workload_of(100).namespace is None  # cached until retry_s
    clock.now += 30
    assert attr.workload_of(100).key == "pod:team-a/trainer-0/main"
    clock.now += 301
    assert attr.unknown() == {}  # the old reason ages out


def test_slurm_jobs_are_charged_to_their_user(tree):
    tree.process(200, v2("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"), uid=1000)
    tree.process(201, v1("/slurm/uid_1001/job_77/step_0/task_0", "/system.slice/slurmd.service"), uid=0)
    attr = attributor(tree)
    v2_job, v1_job = attr.workload_of(200), attr.workload_of(201)
    assert (v2_job.key, v2_job.team, v2_job.label()) == ("slurm:4242", "alice", "Slurm job 4242 (alice)")
    assert (v1_job.key, v1_job.team) == ("slurm:77", "bob")  # v1 names the job's uid in the path


def test_units_run_by_root_are_charged_to_the_unit_and_others_to_their_user(tree):
    tree.process(300, v2("/system.slice/ollama.service"), uid=0)
    tree.process(301, v2("/system.slice/vllm.service"), uid=1001)
    attr = attributor(tree)
    assert (attr.workload_of(300).key, attr.workload_of(300).team) == ("unit:ollama.service", "ollama.service")
    assert (attr.workload_of(301).key, attr.workload_of(301).team) == ("unit:vllm.service", "bob")


def test_user_slices_and_the_plain_uid_fallback(tree):
    tree.process(400, v2("/user.slice/user-1000.slice/session-3.scope"), uid=1000)
    tree.process(401, v2("/"), uid=1001)  # e.g. a cgroup namespace that hides the path
    tree.process(402, v2("/init.scope"), uid=0)
    attr = attributor(tree)
    assert [attr.workload_of(p).key for p in (400, 401, 402)] == ["user:alice", "user:bob", "user:root"]
    assert attr.unknown() == {}


def test_a_uid_without_a_name_stays_a_number(tree):
    def broken(uid):
        if uid == 2000:
            raise RuntimeError("nss down")
        return None

    tree.process(500, v2("/user.slice/user-1234.slice/session-9.scope"), uid=1234)
    tree.process(501, v2("/"), uid=2000)
    attr = Attributor(tree.proc_root, tree.log_root, user_name=broken, clock=Clock())
    assert (attr.workload_of(500).key, attr.workload_of(501).key) == ("user:1234", "user:2000")
    assert attr.unknown() == {"users": "uid 2000 has no name (and 1 more)"}


def test_a_process_gone_before_it_is_read_is_unknown(tree):
    attr = attributor(tree)
    assert attr.workload_of(999) is UNKNOWN_WORKLOAD
    assert attr.unknown() == {"processes": "process 999 exited before it was read"}


def test_a_process_that_exits_between_two_reads_is_unknown(tree):
    tree.process(600, v2("/system.slice/ollama.service"))
    tree.exit(600, keep_stat=True)
    attr = attributor(tree)
    assert attr.workload_of(600) is UNKNOWN_WORKLOAD
    assert attr.unknown() == {"processes": "process 600 exited before it was read"}


def test_an_unparsable_stat_is_unknown_not_an_error(tree):
    tree.process(601, v2("/system.slice/ollama.service"))
    (Path(tree.proc_root) / "601" / "stat").write_text("601 (truncated")
    attr = attributor(tree)
    assert attr.workload_of(601) is UNKNOWN_WORKLOAD
    assert attr.unknown() == {"processes": "cannot parse %s/601/stat" % tree.proc_root}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() beside gRPC threads: the child only reads
def test_permission_denied_is_unknown_with_the_path():
    root = Path(tempfile.mkdtemp(prefix="gpufleet-proc-"))  # not under pytest's 0700 tmp: nobody must get in
    try:
        root.chmod(0o755)
        tree = ProcTree(root)
        tree.process(700, v2(systemd_pod(POD_UID, CID)))
        for d in (Path(tree.proc_root), Path(tree.proc_root) / "700"):
            d.chmod(0o755)
        (Path(tree.proc_root) / "700" / "cgroup").chmod(0o000)  # like /proc mounted with hidepid=1

        def attribute():
            attr = Attributor(tree.proc_root, tree.log_root, clock=Clock())
            return attr.workload_of(700).key, attr.unknown()

        key, unknown = run_unprivileged(attribute)
        assert key == "unknown"
        assert unknown == {"processes": "permission denied reading %s/700/cgroup" % tree.proc_root}
    finally:
        shutil.rmtree(str(root))


def test_a_reused_pid_is_read_afresh(tree):
    tree.process(800, v2(systemd_pod(POD_UID, CID)), start=1000)
    tree.pod_logs("team-a", "trainer-0", POD_UID, {"main": CID})
    attr = attributor(tree)
    assert attr.workload_of(800).key == "pod:team-a/trainer-0/main"
    tree.process(800, v2("/user.slice/user-1000.slice/session-3.scope"), uid=1000, start=1000)
    assert attr.workload_of(800).key == "pod:team-a/trainer-0/main"  # same start time: the cache answers
    tree.process(800, v2("/user.slice/user-1000.slice/session-3.scope"), uid=1000, start=2000)
    assert attr.workload_of(800).key == "user:alice"  # a new process under the old pid


def test_the_cache_is_bounded_and_pruned(tree):
    clock = Clock()
    for pid in (1, 2, 3):
        tree.process(pid, v2("/system.slice/a.service"))
    attr = attributor(tree, clock, max_entries=2, keep_s=60.0)
    for pid in (1, 2, 3):
        assert attr.workload_of(pid).key == "unit:a.service"
    for pid in (1, 2, 3):
        tree.process(pid, v2("/system.slice/b.service"))  # same start time: only what was not kept is re-read
    assert [attr.workload_of(pid).key for pid in (1, 2, 3)] == ["unit:a.service", "unit:a.service", "unit:b.service"]
    clock.now += 61  # pids 1 and 2 idle past keep_s: pid 3 takes the place of the one idle longest (1)
    assert attr.workload_of(3).key == "unit:b.service"
    tree.process(3, v2("/system.slice/c.service"))
    assert attr.workload_of(3).key == "unit:b.service"  # kept now
    attr.prune([2])  # 3 is gone; 2 stays cached
    assert [attr.workload_of(pid).key for pid in (2, 3)] == ["unit:a.service", "unit:c.service"]


def test_user_names_come_from_the_password_database_by_default(tree):
    tree.process(900, v2("/"), uid=0)
    assert Attributor(tree.proc_root, tree.log_root).workload_of(900).key == "user:root"


def test_no_owner_anywhere_is_unknown_with_a_reason(tree):
    tree.process(901, v2("/"))
    (Path(tree.proc_root) / "901" / "status").write_text("Name:\tkworker\nState:\tI (idle)\n")
    attr = attributor(tree)
    assert attr.workload_of(901) is UNKNOWN_WORKLOAD
    assert attr.unknown() == {"processes": "pid 901: no owner in its cgroup and no Uid in its status"}


def test_a_uid_without_a_name_is_looked_up_once(tree):
    """A slow directory (LDAP, SSSD) answering "no such user" is not asked again per process."""
    asked = []

    def lookup(uid):
        asked.append(uid)
        return None

    for pid in (600, 601, 602):
        tree.process(pid, v2("/user.slice/user-4321.slice/session-2.scope"), uid=4321, start=pid)
    attr = Attributor(tree.proc_root, tree.log_root, user_name=lookup, clock=Clock())
    assert {attr.workload_of(pid).key for pid in (600, 601, 602)} == {"user:4321"}
    assert asked == [4321]
