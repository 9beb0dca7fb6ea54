"""volumeMounts the runtime must not get by path: subPaths and hostPaths with a type, opened
without following a symlink out of their volume and bind-mounted through the opened
descriptor (the kubelet's pkg/volume/util/subpath, and its hostPath type checks made race-free).

**subPath.** A subPath names a path inside a volume that containers write. Between two starts
of a container, a container of the pod may turn a component of that path into a symlink to
anywhere on the host (CVE-2017-1002101, CVE-2021-25741): resolving it once at prepare and
handing the runtime the path would mount that anywhere into the next start. So at *every*
creation of a container (restarts too) :func:`bind_volume_mounts`

1. opens the volume's directory, then each component of the subPath with
   ``openat(parent, name, O_PATH|O_NOFOLLOW)``. A symlink met on the way is resolved by the
   walk itself, inside the volume: a relative target continues from where it is (``..`` never
   climbs above the volume), an absolute one only if it names a place in the volume — the
   kubelet's "symlinks that stay inside are fine";
2. makes a missing directory with ``mkdirat`` and the volume's mode (kept with ``fchmod``: the
   umask must not narrow it) and goes on through it without following a symlink;
3. checks that the opened object is still inside the volume (its ``/proc/self/fd`` link);
4. bind-mounts ``/proc/self/fd/N`` onto ``<pod dir>/volume-subpaths/<volume>/<container>/<index>``
   (a directory, or a file for anything else) and gives the runtime that target. The kernel
   follows the descriptor to the opened object: what the path shows meanwhile does not matter,
   and the target lives in the pod directory, which no container sees.

A subPath that cannot be opened so fails the container's creation with the kubelet's
``failed to prepare subPath for volumeMount "<volume>" of container "<container>"``
(CreateContainerConfigError; the detail, which may name host paths, goes to the log only).

**hostPath with a type.** The path is opened once (following symlinks, as the kubelet's stat
does: ``/etc/localtime`` is a link), its type checked on the descriptor (fstat), and that very
descriptor is bound the same way, so a swap between the check and the mount is harmless.
``DirectoryOrCreate`` makes the directory first (mkdir, 0755), ``FileOrCreate`` the file with
``O_CREAT|O_EXCL|O_NOFOLLOW`` (0644): never through a symlink, where the kubelet's create
would follow a dangling one. A hostPath without a type is checked by nothing and stays a
plain mount by path (the runtime makes it when missing, as with the kubelet).

**Undo.** Binds are found in the mount table, never remembered: a start first detaches the
binds of the container's previous instance (which has exited), and unprepare — once no
container of the pod runs — those of the whole pod. Targets are removed with rmdir/unlink
only: nothing here deletes into a mount.

Every function here blocks (syscalls): call them from a worker thread.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from cri import types as t
from nodeagent import hostpaths
from nodeagent.additions import VolumeBind
from nodeagent.mounttable import bind_fd, detach, mounts_under

MAX_SYMLINKS = 40  # the kernel's MAXSYMLINKS: a loop of links ends here
_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC

_KINDS: dict[str, tuple[Callable[[int], bool], str]] = {
    "DirectoryOrCreate": (stat.S_ISDIR, "a directory"),
    "Directory": (stat.S_ISDIR, "a directory"),
    "FileOrCreate": (stat.S_ISREG, "a file"),
    "File": (stat.S_ISREG, "a file"),
    "Socket": (stat.S_ISSOCK, "a socket file"),
    "CharDevice": (stat.S_ISCHR, "a character device"),
    "BlockDevice": (stat.S_ISBLK, "a block device"),
}


class HostPathTypeError(ValueError):
    """The hostPath is not of its type (the kubelet's checkType messages)."""


class EscapeError(OSError):
    """A subPath that leads out of its volume."""


class VolumeBindError(Exception):
    """A volumeMount that cannot be bound: ``str()`` is for the container's status, ``detail``
    for the log."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


# --- hostPath ------------------------------------------------------------------------------


def open_host_path(path: str, kind: str) -> int:
    """An O_PATH descriptor of the hostPath, made first for the *OrCreate types, its type
    checked on the descriptor. Raises HostPathTypeError (or OSError for a path without type
    that cannot be opened)."""
    if kind == "DirectoryOrCreate":
        try:
            os.makedirs(path, mode=0o755, exist_ok=True)
        except FileExistsError:
            pass  # something else is there: the check below names it
    elif kind == "FileOrCreate":
        try:
            # The parent is not made, as in the kubelet; an existing name (a dangling symlink
            # too) is never followed by the create.
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
        except FileExistsError:
            pass
        except OSError as exc:
            raise HostPathTypeError(f"hostPath type check failed: {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        if not kind:
            raise
        raise HostPathTypeError(f"hostPath type check failed: {path} is not {_KINDS[kind][1]}") from None
    if kind:
        test, what = _KINDS[kind]
        if not test(os.fstat(fd).st_mode):
            os.close(fd)
            raise HostPathTypeError(f"hostPath type check failed: {path} is not {what}")
    return fd


def check_host_path(path: str, kind: str) -> None:
    """The type check alone (volume setup, before the sandbox): what the kubelet's checkType
    reports as FailedMount. The mount itself checks again, on what it mounts."""
    if not kind:
        return
    os.close(open_host_path(path, kind))


# --- subPath -------------------------------------------------------------------------------


def fd_path(fd: int) -> str:
    """Where the kernel says ``fd`` is (its /proc/self/fd link)."""
    return os.readlink(f"/proc/self/fd/{fd}")


def _within(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _make_dir(parent: int, name: str, mode: int) -> int:
    """mkdirat with the volume's mode, then the new directory opened without following a
    symlink; a name that appeared meanwhile is opened like any other."""
    try:
        os.mkdir(name, mode & 0o777, dir_fd=parent)
    except FileExistsError:
        return os.open(name, _WALK, dir_fd=parent)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        os.fchmod(fd, mode)  # setgid and sticky too; the umask took some bits away
    except OSError:
        os.close(fd)
        raise
    return fd


def open_beneath(base: int, sub_path: str, mode: int | None = None) -> int:
    """A descriptor of ``sub_path`` under the directory ``base``, reached without ever leaving
    it (see the module's docstring). Missing directories are made with ``mode`` (None: not
    made). Raises EscapeError for a path that leads out, OSError for the rest."""
    root = fd_path(base)
    parts = deque(_parts(sub_path))
    stack = [os.dup(base)]  # the directories walked, the volume first; ".." pops
    links = 0
    try:
        while parts:
            name = parts.popleft()
            if name == "..":
                if len(stack) == 1:
                    raise EscapeError(errno.EXDEV, f"subpath {sub_path!r} leads out of the volume {root}")
                os.close(stack.pop())
                continue
            try:
                fd = os.open(name, _WALK, dir_fd=stack[-1])
            except FileNotFoundError:
                if mode is None:
                    raise
                fd = _make_dir(stack[-1], name, mode)
            try:
                info = os.fstat(fd)
            except OSError:
                os.close(fd)
                raise
            if stat.S_ISLNK(info.st_mode):
                os.close(fd)
                links += 1
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, f"too many symlinks in subpath {sub_path!r}")
                target = os.readlink(name, dir_fd=stack[-1])
                if target.startswith("/"):
                    target = posixpath.normpath(target)
                    if not _within(root, target):
                        raise EscapeError(errno.EXDEV, f"subpath {sub_path!r}: {name} -> {target} is outside "
                                                       f"the volume {root}")
                    while len(stack) > 1:
                        os.close(stack.pop())
                    target = target[len(root):]
                parts.extendleft(reversed(_parts(target)))
                continue
            if parts and not stat.S_ISDIR(info.st_mode):
                os.close(fd)
                raise NotADirectoryError(errno.ENOTDIR, f"subpath {sub_path!r}: {name} is not a directory")
            stack.append(fd)
        found = stack.pop()
    finally:
        for fd in stack:
            os.close(fd)
    where = fd_path(found)
    if not _within(root, where):  # by construction it cannot be; a check costs nothing
        os.close(found)
        raise EscapeError(errno.EXDEV, f"subpath {sub_path!r} opened {where}, outside the volume {root}")
    return found


# --- bind and unbind -------------------------------------------------------------------------


def _open(b: VolumeBind, container: str) -> int:
    failed = f'failed to prepare subPath for volumeMount "{b.volume}" of container "{container}"'
    try:
        if b.host_path_type is not None:
            base = open_host_path(b.volume_path, b.host_path_type)
        else:
            base = os.open(b.volume_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except HostPathTypeError as exc:
        raise VolumeBindError(str(exc)) from None
    except OSError as exc:
        raise VolumeBindError(failed if b.sub_path else f"cannot open volume {b.volume!r}: {exc.strerror}",
                              f"{b.volume_path}: {exc}") from None
    if not b.sub_path:
        return base
    try:
        # A missing subPath is made with the volume's mode (makeMounts' SafeMakeDir), so that
        # the runtime does not make it later with its own.
        return open_beneath(base, b.sub_path, stat.S_IMODE(os.fstat(base).st_mode))
    except OSError as exc:
        raise VolumeBindError(failed, f"volume {b.volume_path}, subPath {b.sub_path!r}: {exc}") from None
    finally:
        os.close(base)


def _make_target(target: Path, directory: bool) -> None:
    """prepareSubpathTarget: the parents 0750, the target a directory (0750) for a directory
    and an empty file (0640) for anything else — a bind onto a file takes any kind of file."""
    target.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    if directory:
        target.mkdir(mode=0o750, exist_ok=True)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640))


def bind_volume_mounts(pod_dir: Path, container: str, binds: Sequence[VolumeBind]) -> list[t.Mount]:
    """The CRI mounts of ``binds`` for a new instance of ``container``: the previous
    instance's binds detached, each volumeMount opened safely and bound afresh."""
    try:
        left = unbind_container(pod_dir, container)
    except OSError as exc:
        raise VolumeBindError(f'cannot prepare the volume mounts of container "{container}"', str(exc)) from None
    if left:
        raise VolumeBindError(f'cannot prepare the volume mounts of container "{container}"',
                              f"still mounted after detaching: {[str(p) for p in left]}")
    mounts: list[t.Mount] = []
    for b in binds:
        target = hostpaths.subpath_target(pod_dir, b.volume, container, b.index)
        fd = _open(b, container)
        try:
            _make_target(target, stat.S_ISDIR(os.fstat(fd).st_mode))
            bind_fd(fd, target)
        except OSError as exc:
            raise VolumeBindError(f'failed to prepare subPath for volumeMount "{b.volume}" of container '
                                  f'"{container}"' if b.sub_path else f"cannot mount volume {b.volume!r}",
                                  f"{target}: {exc}") from None
        finally:
            os.close(fd)
        mounts.append(t.Mount(container_path=b.container_path, host_path=str(target), readonly=b.readonly,
                              propagation=b.propagation))
    return mounts


def _clear(container_dir: Path) -> list[Path]:
    """Detach every mount at or below ``<volume>/<container>`` (from the mount table), then
    remove its targets — rmdir and unlink of the entries themselves, never a walk into them:
    a target still mounted (a hostPath directory) refuses both. Returns the mounts that stay."""
    if not container_dir.is_dir():
        return []
    mounted = mounts_under(container_dir)
    for mount_point in mounted:
        detach(mount_point)
    left = mounts_under(container_dir) if mounted else []
    if left:
        return left
    for entry in os.scandir(container_dir):
        _quietly(os.rmdir if entry.is_dir(follow_symlinks=False) else os.unlink, entry.path)
    _quietly(os.rmdir, str(container_dir))
    return []


def _quietly(remove: Callable[[str], None], path: str) -> None:
    try:
        remove(path)
    except OSError:
        pass  # gone, not empty (not ours to empty) or busy: kept, and the next undo tries again


def _unbind(pod_dir: Path, container: str | None) -> list[Path]:
    root = hostpaths.volume_subpaths_dir(pod_dir)
    try:
        volumes = os.listdir(root)
    except FileNotFoundError:
        return []
    name = None if container is None else hostpaths.component(container, "container name")
    left: list[Path] = []
    for volume in volumes:
        try:
            containers = os.listdir(root / volume) if name is None else [name]
        except OSError:
            continue
        for each in containers:
            left += _clear(root / volume / each)
        _quietly(os.rmdir, str(root / volume))
    _quietly(os.rmdir, str(root))
    return left


def unbind_container(pod_dir: Path, container: str) -> list[Path]:
    """Detach the binds of ``container`` (every volume); the mounts that stay."""
    return _unbind(pod_dir, container)


def unbind_pod(pod_dir: Path) -> list[Path]:
    """Detach every bind of the pod (unprepare: no container of it runs); the mounts that stay."""
    return _unbind(pod_dir, None)


__all__ = ["EscapeError", "HostPathTypeError", "VolumeBindError", "bind_volume_mounts", "check_host_path",
           "open_beneath", "open_host_path", "unbind_container", "unbind_pod"]
