"""Setting up the volumes of the volumes stage: emptyDir and hostPath (pkg/volume/emptydir,
pkg/volume/hostpath); downwardAPI files come from nodeagent/kube/downward.py and are written by
the atomic writer (nodeagent/volumeutil).

Every function here is idempotent: prepare runs again after a retry and after an agent
restart, and must find what it made the first time in place.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nodeagent import volumebind
from nodeagent.model import EmptyDirVolumeSource, HostPathVolumeSource, Pod
from nodeagent.mounttable import is_mount_point
from nodeagent.volumeutil import SetupError
from nodeagent.volumeutil.tmpfs import mount_tmpfs, tmpfs_size

EMPTY_DIR = "kubernetes.io~empty-dir"
DOWNWARD_API = "kubernetes.io~downward-api"

__all__ = ["DOWNWARD_API", "EMPTY_DIR", "SetupError", "check_host_path", "setup_empty_dir"]


# --- emptyDir ------------------------------------------------------------------------------


async def setup_empty_dir(path: Path, volume: EmptyDirVolumeSource, pod: Pod, allocatable_memory: int) -> bool:
    """A directory every user can write (0777); with medium Memory, a tmpfs mounted on it.
    Returns whether the volume was made now (False: an earlier prepare made it, and what
    containers wrote into it since is theirs)."""
    fresh = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    if volume.medium == "Memory":
        if not is_mount_point(path):
            await mount_tmpfs(path, tmpfs_size(volume, pod, allocatable_memory))
            return True
        return False
    if stat.S_IMODE(path.stat().st_mode) != 0o777:
        os.chmod(path, 0o777)  # the umask must not narrow it
    return fresh


# --- hostPath ------------------------------------------------------------------------------


def check_host_path(volume: HostPathVolumeSource) -> None:
    """checkType: create for the *OrCreate types, then require the kind of file the type names,
    with the kubelet's messages. Checked on an opened descriptor (nodeagent/volumebind.py),
    which every container start opens, checks and mounts again."""
    try:
        volumebind.check_host_path(volume.path, volume.type)
    except volumebind.HostPathTypeError as exc:
        raise SetupError(str(exc)) from None


# --- downwardAPI ---------------------------------------------------------------------------


