"""Let the publisher's user connect to the kubelet's PodResources socket without running it as root.

Run as root by gpufleet-podresources-access.service, which gpufleet-podresources-access.path starts each
time the socket appears or goes (ami/). It adds one POSIX ACL entry for the user: `rw` on the socket
(connect(2) on a unix socket needs write permission) and `--x` (search, not list) on the socket's directory
and the one above it, which the kubelet creates 0750 root:root.

Why again at every kubelet start: the kubelet removes the socket and binds a new one each time it starts
(kubernetes pkg/kubelet/util/util_unix.go, CreateListener: unlink, MkdirAll 0750, bind on a temporary name
in the same directory, rename), so whatever was set on the old socket is gone.
Why not a default ACL on the directory, which new files inherit: for a unix socket the kernel applies the
binder's umask before the inherited ACL (linux net/unix/af_unix.c, unix_bind_bsd), so under the kubelet's
umask 022 the new socket's ACL mask is r-x and the inherited user entry loses the write that connect needs
(tests/node/test_socket_access.py shows it on the test machine's kernel).
Why not a group: the socket's group and mode would have to be set again at each start all the same, and
changing its group changes it for everyone; an ACL entry adds one user and takes nothing from anyone.

The ACL is read and written as the kernel's `system.posix_acl_access` attribute (linux
include/uapi/linux/posix_acl_xattr.h: a little-endian version 2, then tag, perm, id per entry), so no acl
package is needed and the tests run it for real. Like `setfacl -m`, it keeps every other entry and
recomputes the mask; it writes nothing when the entry is already there (a write would trigger the .path
unit again). Python >= 3.9.
"""

import argparse
import errno
import os
import pwd
import stat
import struct
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"  # = podresources.DEFAULT_SOCKET
DEFAULT_USER = "gpufleet"
ACL_XATTR = "system.posix_acl_access"
DEFAULT_ACL_XATTR = "system.posix_acl_default"
ACL_VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
UNDEFINED_ID = 0xFFFFFFFF
READ, WRITE, SEARCH = 4, 2, 1

Entry = Tuple[int, int, int]  # (tag, perm, id)


def _kernel_order(entry: Entry) -> Tuple[int, int]:
    """The order the kernel accepts (posix_acl_valid): by tag, then named entries by id."""
    return entry[0], entry[2]


def encode(entries: Sequence[Entry]) -> bytes:
    return struct.pack("<I", ACL_VERSION) + b"".join(
        struct.pack("<HHI", *e) for e in sorted(entries, key=_kernel_order)
    )


def decode(blob: bytes) -> List[Entry]:
    if len(blob) < 4 or (len(blob) - 4) % 8 or struct.unpack_from("<I", blob)[0] != ACL_VERSION:
        raise ValueError("not a version %d POSIX ACL (%d bytes)" % (ACL_VERSION, len(blob)))
    return sorted((struct.unpack_from("<HHI", blob, at) for at in range(4, len(blob), 8)), key=_kernel_order)


def from_mode(mode: int) -> List[Entry]:
    """The minimal ACL a file without extended entries has: its owner, group and other bits."""
    return [
        (USER_OBJ, (mode >> 6) & 7, UNDEFINED_ID),
        (GROUP_OBJ, (mode >> 3) & 7, UNDEFINED_ID),
        (OTHER, mode & 7, UNDEFINED_ID),
    ]


def with_user(entries: Sequence[Entry], uid: int, perm: int) -> List[Entry]:
    """entries where uid holds at least perm (bits are only added) and the mask is the union of the group
    class (named users, owning group, named groups), as `setfacl -m u:UID:PERM` leaves them."""
    users = {i: p for tag, p, i in entries if tag == USER}
    users[uid] = users.get(uid, 0) | perm
    kept = [e for e in entries if e[0] not in (USER, MASK)]
    new = kept + [(USER, p, i) for i, p in users.items()]
    group_class = 0
    for tag, p, _ in new:
        if tag in (USER, GROUP_OBJ, GROUP):
            group_class |= p
    return sorted([*new, (MASK, group_class, UNDEFINED_ID)], key=_kernel_order)


def read_acl(path: str) -> List[Entry]:
    try:
        return decode(os.getxattr(path, ACL_XATTR, follow_symlinks=False))
    except OSError as err:
        if err.errno != errno.ENODATA:
            raise
    return from_mode(os.lstat(path).st_mode)


def grant(path: str, uid: int, perm: int) -> bool:
    """Add perm for uid to path's ACL; False when it already had it (nothing written)."""
    current = read_acl(path)
    wanted = with_user(current, uid, perm)
    if wanted == sorted(current, key=_kernel_order):
        return False
    os.setxattr(path, ACL_XATTR, encode(wanted), follow_symlinks=False)
    return True


def grant_socket(socket_path: str, uid: int) -> List[str]:
    """`--x` on the socket's directory and its parent, `rw-` on the socket; the paths changed. Refuses a
    path that is not a socket, or a directory that is a symlink, so a wrong setting grants nothing else."""
    socket_dir = os.path.dirname(socket_path)
    changed = []
    for directory in (os.path.dirname(socket_dir), socket_dir):
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            raise ValueError("%s is not a directory" % directory)
        if grant(directory, uid, SEARCH):
            changed.append(directory)
    if not stat.S_ISSOCK(os.lstat(socket_path).st_mode):
        raise ValueError("%s is not a socket" % socket_path)
    if grant(socket_path, uid, READ | WRITE):
        changed.append(socket_path)
    return changed


def uid_of(user: str) -> int:
    return int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid


def wait_for(path: str, wait_s: float, clock: Callable[[], float] = time.monotonic, pause_s: float = 0.5) -> bool:
    """The .path unit may start this when the old socket goes, a moment before the kubelet binds the new one."""
    deadline = clock() + wait_s
    while not os.path.exists(path):
        if clock() >= deadline:
            return False
        time.sleep(pause_s)
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m gpufleet_node.socket_access", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help="the kubelet's PodResources socket")
    parser.add_argument("--user", default=DEFAULT_USER, help="who may connect (name or uid)")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the socket to appear")
    args = parser.parse_args(argv)
    try:
        uid = uid_of(args.user)
        if not wait_for(args.socket, args.wait_s):
            print("no socket at %s yet: nothing to do (the .path unit runs this when it appears)" % args.socket)
            return 0
        changed = grant_socket(args.socket, uid)
    except (KeyError, OSError, ValueError) as err:
        print("gpufleet socket access: %s" % err, file=sys.stderr)
        return 1
    print("%s may connect to %s%s" % (args.user, args.socket, " (set on %s)" % ", ".join(changed) if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
