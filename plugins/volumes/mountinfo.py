"""The host's mount table and the tmpfs mounts of Memory-medium emptyDirs.

What is mounted is read from /proc/self/mountinfo, never remembered: unprepare must find the
mounts of a pod whose prepare ran in an earlier agent process.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


MOUNTINFO = Path("/proc/self/mountinfo")


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
    root = str(directory.resolve() if directory.exists() else directory)
    # Strings, not Path.parents: a node's mount table holds hundreds of entries (every
    # container's rootfs and shm), and this runs for every pod torn down.
    prefix = root if root.endswith("/") else root + "/"
    found = {name for name in _mount_point_names(table) if name == root or name.startswith(prefix)}
    return sorted((Path(name) for name in found), key=lambda p: len(p.parts), reverse=True)


def is_mount_point(path: Path, table: Path = MOUNTINFO) -> bool:
    target = str(path.resolve() if path.exists() else path)
    return target in _mount_point_names(table)


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
