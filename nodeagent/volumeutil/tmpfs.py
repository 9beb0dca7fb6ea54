"""tmpfs mounts for memory-backed volumes (emptyDir medium Memory; secret, configMap and projected
volumes), sized as the kubelet sizes them (setupTmpfs, calculateEmptyDirMemorySize)."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio

from nodeagent import quantity
from nodeagent.model import EmptyDirVolumeSource, Pod
from nodeagent.mounttable import is_mount_point, mounts_under


class MountError(RuntimeError):
    pass


def tmpfs_size(volume: EmptyDirVolumeSource, pod: Pod, allocatable_memory: int) -> int | None:
    """calculateEmptyDirMemorySize: the node's allocatable memory, lowered to the pod's memory
    limit (when every container has one) and to the volume's sizeLimit."""
    size = allocatable_memory or None
    limits = [c.resources.limits.get("memory") for c in pod.all_containers()]
    if limits and all(lim is not None for lim in limits):
        pod_limit = sum(quantity.bytes_(lim) for lim in limits if lim is not None)
        if pod_limit > 0 and (size is None or pod_limit <= size):
            size = pod_limit
    if volume.size_limit is not None:
        wanted = quantity.bytes_(volume.size_limit)
        if wanted > 0 and (size is None or wanted <= size):
            size = wanted
    return size


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


async def unmount_under(directory: Path) -> list[Path]:
    """Unmount everything at or below ``directory``, deepest first; the mounts that stayed. The
    mount table is read again only when something was unmounted: each read renders the node's
    whole table, and most pods' volume directories of a kind hold nothing."""
    mounted = mounts_under(directory)
    for mount_point in mounted:
        await unmount(mount_point)
    return mounts_under(directory) if mounted else []


async def remove_unmounted(directory: Path) -> list[Path]:
    """Unmount everything under a pod's volume directory, then remove it; the mounts that
    stayed, and then nothing is removed (never delete into a mount: its contents are not ours).
    A directory that was never made costs nothing: most pods have no volume of a given kind,
    and each mount-table read renders the node's whole table."""
    if not directory.exists():
        return []
    left = await unmount_under(directory)
    if not left:
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(directory, ignore_errors=True))
    return left


__all__ = ["MountError", "mount_tmpfs", "remove_unmounted", "tmpfs_size", "unmount", "unmount_under"]
