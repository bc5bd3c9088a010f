"""Is a ``file://`` directory on a filesystem that other machines may share? Ask the kernel.

``file://`` relies on two things only one kernel gives: ``flock`` that every holder sees, and one monotonic
clock. A network or cluster filesystem (NFS, SMB, 9p, CephFS, most FUSE filesystems, ...) may be mounted by
other machines as well, and then neither holds. Two sources are consulted, and either one is enough to
refuse:

- ``statfs(2)``'s ``f_type`` (through ``ctypes``: ``os.statvfs`` does not return it), the superblock magic of
  the directory's filesystem;
- the directory's mount in ``/proc/self/mountinfo`` and its type: it also names a FUSE filesystem's subtype
  (``fuse.sshfs``), so that the few FUSE filesystems that are local by construction can be let through.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")

FUSE_MAGIC = 0x65735546
NETWORK_MAGIC: dict[int, str] = {
    0x6969: "nfs",
    0x517B: "smb",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x01021997: "9p",
    0x00C36400: "ceph",
    0x5346414F: "afs",
    0x6B414653: "afs",
    0x73757245: "coda",
    0x01161970: "gfs2",
    0x7461636F: "ocfs2",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x564C: "ncpfs",
}
"""Superblock magics (``linux/magic.h`` and the filesystems' own headers) of filesystems several hosts mount."""

SHARED_FSTYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "afs", "coda", "gfs2", "ocfs2", "lustre",
        "gpfs", "beegfs", "glusterfs", "virtiofs", "orangefs", "pvfs2", "ncpfs", "ncp", "davfs", "fuse",
    }
)  # fmt: skip
"""``mountinfo`` types of the same (and of those without a magic of their own, such as ``virtiofs``)."""

LOCAL_FUSE = frozenset({"fuseblk", "fuse.fuse-overlayfs", "fuse-overlayfs"})
"""FUSE types that are local by construction: a local block device (ntfs-3g), rootless containers' root."""


def shared_filesystem(directory: Path) -> str | None:
    """The type of the network or cluster filesystem ``directory`` is on; ``None`` if the OS says local."""
    path = os.path.realpath(directory)
    fstype = None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        fstype = mount_fstype(path, MOUNTINFO.read_text())
    return classify(statfs_magic(path), fstype)


def classify(magic: int | None, fstype: str | None) -> str | None:
    """Decide from the superblock magic and the mount's type (either may be unknown)."""
    if (
        fstype is not None
        and fstype not in LOCAL_FUSE
        and (fstype.split(".", 1)[0] in SHARED_FSTYPES or fstype.startswith("fuse"))
    ):
        return fstype
    if magic in NETWORK_MAGIC:
        return fstype or NETWORK_MAGIC[magic]
    if magic == FUSE_MAGIC and fstype not in LOCAL_FUSE:
        # FUSE says nothing about where the data lives; without a subtype we know to be local, assume shared.
        return fstype or "fuse"
    return None


def mount_fstype(path: str, mountinfo: str) -> str | None:
    """The filesystem type of the mount ``path`` (absolute, resolved) is on, from ``mountinfo`` text.

    Each line is ``id parent major:minor root mount-point options [optional fields…] - type source
    super-options`` (proc(5)); the mount point is octal-escaped. The deepest mount point containing ``path``
    wins, and among equal ones the last, which is the one mounted on top.
    """
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount = _unescape(fields[4])
        if _contains(mount, path) and (best is None or len(mount) >= best[0]):
            best = (len(mount), tail[0])
    return None if best is None else best[1]


def _contains(mount: str, path: str) -> bool:
    return mount == "/" or path == mount or path.startswith(mount.rstrip("/") + "/")


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \040, \011, \012, \134.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def statfs_magic(path: str) -> int | None:
    """``statfs(2)``'s ``f_type`` for ``path``, or ``None`` where it cannot be called."""
    if not sys.platform.startswith("linux"):
        return None  # the struct layout below is Linux's
    try:
        statfs = ctypes.CDLL(None, use_errno=True).statfs
    except (OSError, AttributeError):
        return None
    statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    statfs.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(512)  # larger than struct statfs on every Linux architecture
    if statfs(os.fsencode(path), buf) != 0:
        return None
    # f_type comes first: a long (__fsword_t) everywhere but s390x, where it is an unsigned int. Magics are
    # 32-bit values, and a signed long may carry CIFS's 0xFF534D42 sign-extended, hence the mask.
    field = ctypes.c_uint if platform.machine() == "s390x" else ctypes.c_long
    return int(field.from_buffer(buf).value) & 0xFFFFFFFF
