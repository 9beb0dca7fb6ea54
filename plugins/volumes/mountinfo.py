"""The tmpfs mounts of Memory-medium emptyDirs, and the host's mount table (nodeagent.mounttable).

What is mounted is read from /proc/self/mountinfo, never remembered: unprepare must find the
mounts of a pod whose prepare ran in an earlier agent process.
"""

from __future__ import annotations

from pathlib import Path

import anyio

# The table itself is the core's (the runtime stage reads it too, for subPath binds).
from nodeagent.mounttable import MOUNTINFO, is_mount_point, mount_points, mounts_under

__all__ = ["MOUNTINFO", "MountError", "is_mount_point", "mount_points", "mount_tmpfs", "mounts_under", "unmount"]


class MountError(RuntimeError):
    pass


async def mount_tmpfs(path: Path, size: int | None, mode: int | None = None) -> None:
    """``mount -t tmpfs [-o size=N,mode=M] tmpfs PATH`` (setupTmpfs): without a size the
    kernel's default of half the memory applies; without a mode the root is 1777."""
    command = ["mount", "-t", "tmpfs"]
    options = ([f"size={size}"] if size else []) + ([f"mode={mode:o}"] if mode is not None else [])
    if options:
        command += ["-o", ",".join(options)]
    command += ["tmpfs", str(path)]
    result = await anyio.run_process(command, check=False)
    if result.returncode != 0:
        raise MountError(f"mount failed: {' '.join(command)}: {result.stderr.decode(errors='replace').strip()}")


async def unmount(path: Path) -> None:
    result = await anyio.run_process(["umount", str(path)], check=False)
    if result.returncode != 0 and is_mount_point(path):
        raise MountError(f"unmount of {path} failed: {result.stderr.decode(errors='replace').strip()}")
