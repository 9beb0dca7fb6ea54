"""Termination messages (kuberuntime_container.go makeMounts / getTerminationMessage).

Before each container instance starts, a fresh empty file
``<pod dir>/containers/<container>/<8 random hex digits>`` (mode 0666, so any user may write
it) is mounted at ``terminationMessagePath``. When the instance has exited, its message is the
last 4096 bytes of that file — that file only, opened without following a symlink, whatever
else the container mounted at the same path; with ``FallbackToLogsOnError``, a failed
container (exit code not 0) that left the file empty gets the tail of its log instead: the
last 80 lines, then the last 2048 bytes of those, without the CRI log framing.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from pathlib import Path

from cri import types as t
from nodeagent import hostpaths
from nodeagent import labels as L

MAX_MESSAGE_BYTES = 4096  # MaxContainerTerminationMessageLength
MAX_LOG_LINES = 80  # MaxContainerTerminationMessageLogLines
MAX_LOG_BYTES = 2048  # MaxContainerTerminationMessageLogLength
MAX_POD_MESSAGE_BYTES = 12 * 1024  # MaxPodTerminationMessageLogLength, split across containers
_FILE_NAME = re.compile(r"[0-9a-f]{8}")  # what create_message_file names them


def create_message_file(pod_dir: Path, container: str) -> Path:
    directory = hostpaths.container_dir(pod_dir, container)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / secrets.token_hex(4)
    # Exclusive and not through a symlink: the file is new, and the agent's own.
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
    os.chmod(path, 0o666)  # explicitly: the umask would take write access from other users
    return path


def message_mount(path: Path, container_path: str) -> t.Mount:
    return t.Mount(container_path=container_path, host_path=str(path))


def read_message(status: t.ContainerStatus, pod_dir: Path) -> str:
    """The termination message of an exited instance, joined to the runtime's own message the
    kubelet's way (``runtime message: termination message``)."""
    path = status.annotations.get(L.CONTAINER_TERMINATION_MESSAGE_PATH, "/dev/termination-log")
    policy = status.annotations.get(L.CONTAINER_TERMINATION_MESSAGE_POLICY, "File")
    # A container that could not even start has no logs to fall back to.
    fallback = policy == "FallbackToLogsOnError" and status.exit_code != 0 and status.reason != "ContainerCannotRun"
    message, check_logs = _from_file(status, pod_dir, path, fallback)
    if check_logs:
        message = _from_log(status.log_path)
    if message and status.message:
        return f"{status.message}: {message}"
    return message or status.message


def own_message_file(status: t.ContainerStatus, pod_dir: Path, container_path: str) -> Path | None:
    """The host side of the instance's message mount: the file :func:`create_message_file`
    made for this container. The kubelet reads whatever mount sits at the message path; a
    volume (a subPath) mounted there too would be a path the container can redirect with a
    symlink, so only a file in the container's own directory counts."""
    try:
        directory = hostpaths.container_dir(pod_dir, status.metadata.name)
    except hostpaths.UnsafeName:
        return None
    for mount in status.mounts:
        host = Path(mount.host_path)
        if mount.container_path == container_path and host.parent == directory and _FILE_NAME.fullmatch(host.name):
            return host
    return None


def _from_file(status: t.ContainerStatus, pod_dir: Path, container_path: str, fallback: bool) -> tuple[str, bool]:
    if not container_path:
        return "", fallback
    file = own_message_file(status, pod_dir, container_path)
    if file is None:
        return "", fallback
    try:
        data = _tail_own(pod_dir, file.relative_to(pod_dir), MAX_MESSAGE_BYTES)
    except FileNotFoundError:
        return "", fallback
    except OSError as exc:
        return f"Error on reading termination log {file}: {exc}", False
    return data.decode(errors="replace"), fallback and not data


def _tail_own(pod_dir: Path, relative: Path, limit: int) -> bytes:
    """The last ``limit`` bytes of a regular file under the pod directory, reached without
    following a symlink below it (and without blocking on a FIFO)."""
    fd = os.open(pod_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in relative.parts[:-1]:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
        child = os.open(relative.parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    with os.fdopen(child, "rb") as f:
        info = os.fstat(child)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        f.seek(max(0, info.st_size - limit))
        return f.read(limit)


def _from_log(log_path: str) -> str:
    try:
        lines = _tail_lines(Path(log_path), MAX_LOG_LINES)
    except OSError as exc:
        return f"Error on reading termination message from logs: {exc}"
    out = b"".join(_content(line) for line in lines)
    return out[-MAX_LOG_BYTES:].decode(errors="replace")


def _tail_lines(path: Path, count: int) -> list[bytes]:
    """The last ``count`` lines of the file, reading backwards in blocks (logs can be large)."""
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        position = end
        while position > 0 and data.count(b"\n") <= count:
            step = min(64 * 1024, position)
            position -= step
            f.seek(position)
            data = f.read(step) + data
    lines = data.splitlines(keepends=True)
    return lines[-count:]


def _content(line: bytes) -> bytes:
    """``<timestamp> <stream> <P|F>[:tags] <content>``: the content, with its newline unless the
    line is a partial one (the kubelet's parseCRILog)."""
    parts = line.split(b" ", 3)
    if len(parts) < 4:
        return b""
    tag, content = parts[2], parts[3]
    if tag.split(b":")[0] == b"P" and content.endswith(b"\n"):
        content = content[:-1]
    return content
