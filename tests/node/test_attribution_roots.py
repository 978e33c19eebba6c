"""Owner patterns count only under their real roots (issue 29): a user who owns a delegated cgroup subtree
(user@.service, Delegate=yes) can name cgroups in it as they like, and must not be able to charge their GPU
time to a pod, a Slurm job or another uid by doing so. Python >= 3.9."""

import pytest
from proc_trees import CID, OTHER_CID, OTHER_POD_UID, POD_UID, ProcTree, cgroupfs_pod, systemd_pod, v1, v2

from gpufleet_node.attribution import Attributor, classify_path, parse_cgroup

VICTIM = POD_UID
MINE = OTHER_POD_UID
DELEGATED = "/user.slice/user-1000.slice/user@1000.service"  # what systemd hands user 1000 (Delegate=yes)


def _sd(uid: str) -> str:
    return uid.replace("-", "_")


# Real paths, by the kubelet (cgroupfs and systemd drivers), Slurm cgroup/v2 and cgroup/v1, also as seen from
# inside a cgroup namespace (a DaemonSet's view: `..` up to the common ancestor, then down).
REAL = [
    (systemd_pod(POD_UID, CID, "burstable"), ("pod", POD_UID, CID)),
    (systemd_pod(POD_UID, CID, "besteffort", runtime="crio"), ("pod", POD_UID, CID)),
    (systemd_pod(POD_UID, CID, "guaranteed"), ("pod", POD_UID, CID)),
    (cgroupfs_pod(POD_UID, CID), ("pod", POD_UID, CID)),
    (cgroupfs_pod(POD_UID, CID, "guaranteed"), ("pod", POD_UID, CID)),
    ("/kubepods/besteffort/pod%s" % POD_UID, ("pod", POD_UID, None)),
    # kubelet --cgroup-root=/kubelet: the cgroupfs form, and the systemd driver's level-prefixed form
    ("/kubelet/kubepods/burstable/pod%s/%s" % (POD_UID, CID), ("pod", POD_UID, CID)),
    (
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        "kubelet-kubepods-burstable-pod%s.slice/cri-containerd-%s.scope" % (_sd(POD_UID), CID),
        ("pod", POD_UID, CID),
    ),
    ("/../../kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope" % (_sd(POD_UID), CID), ("pod", POD_UID, CID)),
    (
        "/../../../kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope"
        % (_sd(POD_UID), CID),
        ("pod", POD_UID, CID),
    ),
    ("/../../kubepods-besteffort-pod%s.slice/crio-%s.scope" % (_sd(POD_UID), CID), ("pod", POD_UID, CID)),
    ("/../../pod%s/%s" % (POD_UID, CID), ("pod", POD_UID, CID)),
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", ("slurm", "4242", None)),
    ("/system.slice/node7_slurmstepd.scope/job_17/step_extern/user/task_0", ("slurm", "17", None)),
    ("/../slurmstepd.scope/job_9/step_batch/user/task_0", ("slurm", "9", None)),
    ("/slurm/uid_1000/job_4242/step_0/task_0", ("slurm", "4242", "1000")),
    ("/slurm_node7/uid_1001/job_9/step_batch/task_0", ("slurm", "9", "1001")),
    ("/user.slice/user-1000.slice/session-3.scope", ("user", None, "1000")),
]


@pytest.mark.parametrize(("path", "expected"), REAL)
def test_real_paths_name_their_owner(path, expected):
    found = classify_path(path)
    ids = {"pod": (found.pod_uid, found.container_id), "slurm": (found.job_id, found.user)}
    assert (found.kind, *ids.get(found.kind, (None, found.user))) == expected


# The three spoofs (a victim pod, uid 2000 via a v1 Slurm path, job 4242 via slurmstepd.scope), each
# also in the systemd-driver form, in the user manager's own slices, and on a cgroup v1 hybrid's
# name=systemd line: every one is user 1000's.
SPOOFS = [
    DELEGATED + "/kubepods/burstable/pod%s/%s" % (VICTIM, CID),
    DELEGATED + "/kubelet/kubepods/burstable/pod%s/%s" % (VICTIM, CID),
    DELEGATED + "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod%s.slice" % _sd(VICTIM),
    DELEGATED + "/kubepods/pod%s" % VICTIM,
    DELEGATED + systemd_pod(VICTIM, CID, "burstable"),
    DELEGATED + systemd_pod(VICTIM, CID, "guaranteed"),
    DELEGATED + "/app.slice" + systemd_pod(VICTIM, CID),
    DELEGATED + "/slurm/uid_2000/job_777/step_0/task_0",
    DELEGATED + "/app.slice/slurm_node7/uid_2000/job_777/step_0/task_0",
    DELEGATED + "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
    DELEGATED + "/app.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
    DELEGATED + "/app.slice/node7_slurmstepd.scope/job_4242/step_0/user/task_0",
    "/user.slice/user-1000.slice/session-4.scope/kubepods/pod%s" % VICTIM,
    "/../../user.slice/user-1000.slice/user@1000.service/kubepods-pod%s.slice" % _sd(VICTIM),
    DELEGATED + "/user-2000.slice/session-1.scope",  # the outer uid wins over a uid named deeper
]


@pytest.mark.parametrize("path", SPOOFS)
def test_a_delegated_user_subtree_is_its_users_whatever_it_names(path):
    found = parse_cgroup(v2(path))
    assert (found.kind, found.user, found.pod_uid, found.job_id) == ("user", "1000", None, None)


@pytest.mark.parametrize("path", SPOOFS)
def test_the_same_spoofs_on_a_cgroup_v1_hybrid(path):
    found = parse_cgroup(v1("/user.slice", systemd_path=path, unified=path))
    assert (found.kind, found.user) == ("user", "1000")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/system.slice/evil.service/kubepods/pod%s/%s" % (VICTIM, CID), ("unit", "evil.service")),
        ("/system.slice/evil.service" + systemd_pod(VICTIM, CID), ("unit", "evil.service")),
        ("/system.slice/evil.service/slurmstepd.scope/job_4242/step_0/user/task_0", ("unit", "evil.service")),
        ("/system.slice/evil.service/slurm/uid_2000/job_777", ("unit", "evil.service")),
        (systemd_pod(MINE, OTHER_CID) + "/kubepods/pod%s/%s" % (VICTIM, CID), ("pod", MINE)),
        (systemd_pod(MINE, OTHER_CID) + "/user-2000.slice/session-1.scope", ("pod", MINE)),
        ("/docker/%s/kubepods/burstable/pod%s/%s" % (OTHER_CID, VICTIM, CID), ("unknown", None)),
        ("/kubelet.slice/kubepods.slice/kubepods-pod%s.slice" % _sd(VICTIM), ("unknown", None)),
        ("/mykubepods.slice/kubepods-pod%s.slice" % _sd(VICTIM), ("unknown", None)),
        ("/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod%s.slice" % _sd(VICTIM), ("unknown", None)),
        ("/kubepods/burstable/besteffort/pod%s" % VICTIM, ("unknown", None)),
        ("/srv/slurmstepd.scope/job_4242/step_0", ("unknown", None)),
        ("/slurm/job_4242/step_0", ("unknown", None)),
        ("/slurm/uid_2000/x/job_4242", ("unknown", None)),
        ("/kubepods/../user.slice/pod%s" % VICTIM, ("unknown", None)),
    ],
)
def test_owner_names_below_another_owner_or_off_their_root_name_nobody_new(path, expected):
    found = classify_path(path)
    who = {"unit": found.unit, "pod": found.pod_uid}.get(found.kind)
    assert (found.kind, who) == expected


def test_a_user_faking_a_pod_and_a_job_is_charged_for_it_not_the_victims(tmp_path):
    tree = ProcTree(tmp_path)
    tree.pod_logs("finance", "ledger-0", VICTIM, {"main": CID})
    tree.process(100, v2(DELEGATED + systemd_pod(VICTIM, CID)), uid=1000)
    tree.process(101, v2(DELEGATED + "/slurm/uid_2000/job_777/step_0/task_0"), uid=1000)
    tree.process(102, v2(DELEGATED + "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"), uid=1000)
    tree.process(103, v2(systemd_pod(VICTIM, CID)), uid=0)  # the victim's own process
    users = {1000: "alice", 2000: "carol"}
    attr = Attributor(tree.proc_root, tree.log_root, user_name=users.get, clock=lambda: 0.0)
    spoofs = [attr.workload_of(pid) for pid in (100, 101, 102)]
    assert [(w.key, w.team) for w in spoofs] == [("user:alice", "alice")] * 3
    assert (attr.workload_of(103).key, attr.workload_of(103).team) == ("pod:finance/ledger-0/main", "finance")
