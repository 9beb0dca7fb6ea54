"""Volume ownership for ``securityContext.fsGroup`` (the kubelet's SetVolumeOwnership,
pkg/volume/volume_linux.go): every file of the volume goes to the fsGroup gid, gets group read
(and write, unless the volume is read-only content) and directories get group search and the
setgid bit, so that files containers create later belong to the fsGroup too.

The kubelet does this for the volume types that manage ownership: emptyDir (read-write mask),
and configMap, secret, projected and downwardAPI (read-only mask, applied by the atomic writer
to each new payload before it becomes visible). It passes no fsGroupChangePolicy for any of
them: ``OnRootMismatch`` only shortens the walk for persistent volumes (plugins/csi, through
:func:`root_mismatch`), so these volumes are always walked whatever the policy says.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nodeagent.model import Pod

RW_MASK = 0o660
RO_MASK = 0o440
EXEC_MASK = 0o110
"""Group (and owner) search on directories, so that the group can reach the files."""


def fs_group_of(pod: Pod) -> int | None:
    context = pod.spec.security_context
    return context.fs_group if context is not None else None


def owned_mode(mode: int, *, read_only: bool, is_dir: bool = False) -> int:
    """The permission bits a file ends with after :func:`set_volume_ownership`."""
    mask = RO_MASK if read_only else RW_MASK
    if is_dir:
        mask |= EXEC_MASK | stat.S_ISGID
    return stat.S_IMODE(mode) | mask


def root_mismatch(root: Path, fs_group: int, *, read_only: bool) -> bool:
    """``fsGroupChangePolicy: OnRootMismatch`` (the kubelet's requiresPermissionChange): walk
    the volume only when its root does not show the ownership a walk gives — the fsGroup gid,
    the group bits of the mask and search, and setgid (a root that is not a directory, or
    cannot be read, is always walked)."""
    try:
        info = root.stat()
    except OSError:
        return True
    if info.st_gid != fs_group or not stat.S_ISDIR(info.st_mode):
        return True
    wanted = (RO_MASK if read_only else RW_MASK) | EXEC_MASK
    return (stat.S_IMODE(info.st_mode) & wanted) != wanted or not info.st_mode & stat.S_ISGID


def set_volume_ownership(root: Path, fs_group: int, *, read_only: bool) -> None:
    """chgrp every entry under ``root`` (``root`` included) to ``fs_group`` and widen its mode.

    Symlinks are re-grouped themselves (lchown) but never chmodded: chmod follows the link and
    would overwrite the mode the volume gave the file it points at (the kubelet's reason too).
    Entries removed while we walk (a container deleting files) are skipped.
    """
    _own(root, fs_group, read_only)
    for directory, dirs, files in os.walk(root, followlinks=False):
        for name in (*dirs, *files):
            _own(Path(directory) / name, fs_group, read_only)


def _own(path: Path, fs_group: int, read_only: bool) -> None:
    try:
        info = path.lstat()
        if info.st_gid != fs_group:
            os.lchown(path, -1, fs_group)
        if stat.S_ISLNK(info.st_mode):
            return
        wanted = owned_mode(info.st_mode, read_only=read_only, is_dir=stat.S_ISDIR(info.st_mode))
        if wanted != stat.S_IMODE(info.st_mode):
            os.chmod(path, wanted)
    except FileNotFoundError:
        return
