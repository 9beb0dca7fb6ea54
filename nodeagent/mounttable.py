"""The host's mount table, and bind mounts made through mount(2).

What is mounted is read from /proc/self/mountinfo, never remembered: an undo must find the
mounts of a pod whose setup ran in an earlier agent process.

mount(2) and umount2(2) are called through ctypes rather than util-linux's mount(8): a bind of
``/proc/self/fd/N`` must name a descriptor of *this* process (a child would need it passed at
the same number), mount(8) canonicalises the source unless told not to and may write
/run/mount/utab, and a fork and exec per container start costs more than the syscall. The
errno comes back as an OSError the caller can report.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 0x2

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mount_point_names(table: Path) -> list[str]:
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return []
    return [_unescape(fields[4]) for fields in (line.split() for line in lines) if len(fields) > 4]


def mount_points(table: Path = MOUNTINFO) -> list[Path]:
    return [Path(name) for name in _mount_point_names(table)]


def mounts_under(directory: Path, table: Path = MOUNTINFO) -> list[Path]:
    """Mount points at or below ``directory``, deepest first (the order to unmount them in)."""
    if not os.path.lexists(directory):
        # Nothing can be mounted at or below a path that is not there (a mount point is a path
        # in the tree; a detached mount has left it). The common case, a pod without that kind
        # of volume, is answered without reading the table: the kernel renders the whole table
        # for every read, hundreds of lines on a busy node, and a teardown asks several times
        # per pod (it was 60 % of the agent's teardown CPU at 30 pods).
        return []
    root = str(directory.resolve())
    # Strings, not Path.parents: a node's mount table holds hundreds of entries (every
    # container's rootfs and shm), and this runs for every pod torn down.
    prefix = root if root.endswith("/") else root + "/"
    found = {name for name in _mount_point_names(table) if name == root or name.startswith(prefix)}
    return sorted((Path(name) for name in found), key=lambda p: len(p.parts), reverse=True)


def is_mount_point(path: Path, table: Path = MOUNTINFO) -> bool:
    target = str(path.resolve() if path.exists() else path)
    return target in _mount_point_names(table)


def is_shared(path: Path, table: Path = MOUNTINFO) -> bool:
    """Whether the mount ``path`` is on (the nearest mount point at or above it) is in a shared
    peer group: mountinfo's optional fields hold ``shared:N`` (the kubelet's isShared)."""
    target = str(path.resolve())
    best, shared = "", False
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        point = _unescape(fields[4])
        within = target == point or target.startswith(point.rstrip("/") + "/")
        if within and len(point) >= len(best):
            best = point
            shared = any(f.startswith("shared:") for f in fields[6:fields.index("-", 6)])
    return shared


# --- mount(2) --------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def bind_fd(fd: int, target: Path) -> None:
    """Bind-mount what ``fd`` (an O_PATH descriptor will do) refers to onto ``target``,
    recursively (the mounts below it come along, as the runtime's own rbind would take them).
    The source is the descriptor's ``/proc/self/fd`` link, which the kernel follows to the
    opened object itself: nothing that changed on the path since the open matters."""
    source = f"/proc/self/fd/{fd}".encode()
    if _libc.mount(source, os.fsencode(target), None, MS_BIND | MS_REC, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"bind mount onto {target}: {os.strerror(code)}")


def make_rshared(path: Path) -> bool:
    """The kubelet's MakeRShared for its root directory: unless it is on a shared mount already,
    bind it onto itself and make that mount rshared, so that what a container mounts below it
    with Bidirectional propagation reaches the host (and the other containers). True when it
    made the mount; OSError when the kernel refuses."""
    if is_shared(path):
        return False
    target = os.fsencode(path)
    if _libc.mount(target, target, None, MS_BIND, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"bind mount of {path} onto itself: {os.strerror(code)}")
    if _libc.mount(None, target, None, MS_SHARED | MS_REC, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"make {path} rshared: {os.strerror(code)}")
    return True


def detach(target: Path) -> None:
    """umount2(MNT_DETACH): ``target`` and what is mounted below it leave the host's tree at
    once (a container that still holds a copy keeps it). Not mounted: nothing to do."""
    if _libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOENT) and not is_mount_point(target):
            return
        raise OSError(code, f"unmount {target}: {os.strerror(code)}")


__all__ = ["MOUNTINFO", "bind_fd", "detach", "is_mount_point", "is_shared", "make_rshared", "mount_points",
           "mounts_under"]
