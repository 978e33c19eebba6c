"""gpufleet_node.socket_access: the ACL entry that lets the publisher's user connect to the kubelet's socket,
read and written as the kernel's xattr on this machine's filesystem. Python >= 3.9."""

import os
import socket
import stat
import subprocess
import sys
import tempfile

import pytest

from gpufleet_node import podresources, socket_access
from gpufleet_node.socket_access import GROUP, GROUP_OBJ, MASK, OTHER, UNDEFINED_ID, USER, USER_OBJ

NO_ID = UNDEFINED_ID
UID = 64999  # a uid with no account


@pytest.fixture
def kubelet_dirs():
    """/var/lib/kubelet/pod-resources as the kubelet makes them (0750), under a 0755 scratch directory."""
    top = tempfile.mkdtemp(prefix="gfacl-", dir="/tmp")
    os.chmod(top, 0o755)
    socket_dir = os.path.join(top, "kubelet", "pod-resources")
    os.makedirs(socket_dir, mode=0o750)
    yield socket_dir
    subprocess.run(["rm", "-rf", top], check=True)


def bind(path):
    """A listening unix socket bound as the kubelet binds it: under umask 022."""
    old = os.umask(0o022)
    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
    finally:
        os.umask(old)
    return listener


def effective(entries, uid):
    """What uid's named entry grants once the mask applies (no entry: None)."""
    mask = next((p for tag, p, _ in entries if tag == MASK), 7)
    return next((p & mask for tag, p, i in entries if tag == USER and i == uid), None)


def connects_as(uid, path):
    """connect(2) from a child that is uid with no groups; True when it got in."""
    code = (
        "import os, socket, sys; os.setgroups([]); os.setgid(%d); os.setuid(%d);"
        " socket.socket(socket.AF_UNIX).connect(sys.argv[1])"
    )
    proc = subprocess.run([sys.executable, "-c", code % (uid, uid), path], capture_output=True, text=True)
    assert proc.returncode == 0 or "PermissionError" in proc.stderr, proc.stderr
    return proc.returncode == 0


@pytest.mark.parametrize(
    ("before", "uid", "perm", "after"),
    [
        # a socket the kubelet bound under umask 022 (0755): the user is added, the mask opens to rwx
        (
            socket_access.from_mode(0o755),
            UID,
            6,
            [(USER_OBJ, 7, NO_ID), (USER, 6, UID), (GROUP_OBJ, 5, NO_ID), (MASK, 7, NO_ID), (OTHER, 5, NO_ID)],
        ),
        # a 0750 directory: search only
        (
            socket_access.from_mode(0o750),
            UID,
            1,
            [(USER_OBJ, 7, NO_ID), (USER, 1, UID), (GROUP_OBJ, 5, NO_ID), (MASK, 5, NO_ID), (OTHER, 0, NO_ID)],
        ),
        # someone else's entries stay; the user's bits are only added; the mask is recomputed
        (
            [
                (USER_OBJ, 6, NO_ID),
                (USER, 4, UID),
                (USER, 7, 5),
                (GROUP_OBJ, 0, NO_ID),
                (GROUP, 2, 9),
                (MASK, 0, NO_ID),
                (OTHER, 0, NO_ID),
            ],
            UID,
            2,
            [
                (USER_OBJ, 6, NO_ID),
                (USER, 7, 5),
                (USER, 6, UID),
                (GROUP_OBJ, 0, NO_ID),
                (GROUP, 2, 9),
                (MASK, 7, NO_ID),
                (OTHER, 0, NO_ID),
            ],
        ),
    ],
)
def test_with_user_adds_like_setfacl_m(before, uid, perm, after):
    assert socket_access.with_user(before, uid, perm) == after
    assert socket_access.decode(socket_access.encode(after)) == after


def test_a_blob_that_is_no_acl_is_refused():
    with pytest.raises(ValueError, match="not a version 2 POSIX ACL"):
        socket_access.decode(b"\x01\x00\x00\x00" + bytes(8))


def test_a_default_acl_on_the_directory_is_not_enough(kubelet_dirs):
    """Why the service sets the entry on the socket itself: the directory's default ACL gives the user rw-,
    but the kernel applies the binder's umask (022) to a unix socket before the inherited ACL, so the new
    socket's mask is r-x and the user is left without the write that connect(2) needs."""
    everything = socket_access.with_user(socket_access.from_mode(0o750), UID, 6)
    os.setxattr(kubelet_dirs, socket_access.DEFAULT_ACL_XATTR, socket_access.encode(everything))
    path = os.path.join(kubelet_dirs, "kubelet.sock")
    listener = bind(path)
    try:
        inherited = socket_access.read_acl(path)
        assert (USER, 6, UID) in inherited and effective(inherited, UID) == 4  # r--: the mask took the w
    finally:
        listener.close()


def test_grant_socket_sets_it_once_and_the_user_connects(kubelet_dirs):
    path = os.path.join(kubelet_dirs, "kubelet.sock")
    listener = bind(path)
    try:
        as_root = os.geteuid() == 0
        if as_root:
            assert not connects_as(UID, path)
        changed = socket_access.grant_socket(path, UID)
        assert changed == [os.path.dirname(kubelet_dirs), kubelet_dirs, path]
        assert effective(socket_access.read_acl(path), UID) == 6
        assert effective(socket_access.read_acl(kubelet_dirs), UID) == 1  # search, not list
        assert socket_access.grant_socket(path, UID) == []  # nothing written: the .path unit is not fired again
        if as_root:
            assert connects_as(UID, path)
    finally:
        listener.close()


def test_only_a_socket_gets_the_entry(kubelet_dirs):
    path = os.path.join(kubelet_dirs, "kubelet.sock")
    with open(path, "w"):
        pass
    with pytest.raises(ValueError, match="is not a socket"):
        socket_access.grant_socket(path, UID)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644 and socket_access.read_acl(path) == socket_access.from_mode(
        0o644
    )


def test_main_says_one_line_and_changes_nothing_without_a_socket_or_user(kubelet_dirs, capsys):
    path = os.path.join(kubelet_dirs, "kubelet.sock")
    assert socket_access.main(["--socket", path, "--user", str(UID), "--wait-s", "0"]) == 0
    assert "no socket at %s yet" % path in capsys.readouterr().out
    assert socket_access.read_acl(kubelet_dirs) == socket_access.from_mode(0o750)
    listener = bind(path)
    try:
        assert socket_access.main(["--socket", path, "--user", "no-such-user-gpufleet", "--wait-s", "0"]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "no-such-user-gpufleet" in err
    finally:
        listener.close()


def test_the_default_socket_is_the_publishers():
    assert socket_access.DEFAULT_SOCKET == podresources.DEFAULT_SOCKET
