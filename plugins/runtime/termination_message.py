"""Termination messages (kuberuntime_container.go makeMounts / getTerminationMessage).

Before each container instance starts, a fresh empty file
``<pod dir>/containers/<container>/<8 random hex digits>`` (mode 0666, so any user may write
it) is mounted at ``terminationMessagePath``. When the instance has exited, its message is the
last 4096 bytes of that file; with ``FallbackToLogsOnError``, a failed container (exit code not
0) that left the file empty gets the tail of its log instead: the last 80 lines, then the last
2048 bytes of those, without the CRI log framing.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cri import types as t
from nodeagent import hostpaths
from nodeagent import labels as L

MAX_MESSAGE_BYTES = 4096  # MaxContainerTerminationMessageLength
MAX_LOG_LINES = 80  # MaxContainerTerminationMessageLogLines
MAX_LOG_BYTES = 2048  # MaxContainerTerminationMessageLogLength
MAX_POD_MESSAGE_BYTES = 12 * 1024  # MaxPodTerminationMessageLogLength, split across containers


def create_message_file(pod_dir: Path, container: str) -> Path:
    directory = hostpaths.container_dir(pod_dir, container)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / secrets.token_hex(4)
    path.touch()
    os.chmod(path, 0o666)  # explicitly: the umask would take write access from other users
    return path


def message_mount(path: Path, container_path: str) -> t.Mount:
    return t.Mount(container_path=container_path, host_path=str(path))


def read_message(status: t.ContainerStatus) -> str:
    """The termination message of an exited instance, joined to the runtime's own message the
    kubelet's way (``runtime message: termination message``)."""
    path = status.annotations.get(L.CONTAINER_TERMINATION_MESSAGE_PATH, "/dev/termination-log")
    policy = status.annotations.get(L.CONTAINER_TERMINATION_MESSAGE_POLICY, "File")
    # A container that could not even start has no logs to fall back to.
    fallback = policy == "FallbackToLogsOnError" and status.exit_code != 0 and status.reason != "ContainerCannotRun"
    message, check_logs = _from_file(status, path, fallback)
    if check_logs:
        message = _from_log(status.log_path)
    if message and status.message:
        return f"{status.message}: {message}"
    return message or status.message


def _from_file(status: t.ContainerStatus, container_path: str, fallback: bool) -> tuple[str, bool]:
    if not container_path:
        return "", fallback
    for mount in status.mounts:
        if mount.container_path != container_path:
            continue
        try:
            data = _tail_bytes(Path(mount.host_path), MAX_MESSAGE_BYTES)
        except FileNotFoundError:
            return "", fallback
        except OSError as exc:
            return f"Error on reading termination log {mount.host_path}: {exc}", False
        return data.decode(errors="replace"), fallback and not data
    return "", fallback


def _tail_bytes(path: Path, limit: int) -> bytes:
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read()


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
