"""The memory runtime's objects: sandboxes and containers, their files and their logs.

They hold the CRI configs they were made from (protobuf messages, copied), because what the
runtime echoes back — metadata, labels, annotations, mounts, the log path — is exactly what the
caller sent, as with containerd.
"""

from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from conformance.memruntime.images import Image
from conformance.memruntime.process import Process, SigtermMode
from cri._generated import api_pb2 as api

POD_UID_LABEL = "io.kubernetes.pod.uid"


def now_ns() -> int:
    return time.time_ns()


@dataclass
class Sandbox:
    id: str
    config: api.PodSandboxConfig
    runtime_handler: str
    name: str
    """containerd's reserved name: ``<name>_<namespace>_<uid>_<attempt>``."""
    ip: str
    created_at: int = field(default_factory=now_ns)
    state: int = api.SANDBOX_READY

    @property
    def uid(self) -> str:
        return self.config.metadata.uid

    @property
    def ready(self) -> bool:
        return self.state == api.SANDBOX_READY

    @property
    def host_network(self) -> bool:
        return self.config.linux.security_context.namespace_options.network == api.NODE


@dataclass
class Container:
    id: str
    sandbox_id: str
    pod_uid: str
    config: api.ContainerConfig
    image: Image
    name: str
    """containerd's reserved name: ``<container>_<pod>_<namespace>_<uid>_<attempt>``."""
    log_path: str
    hostname: str = ""
    created_at: int = field(default_factory=now_ns)
    state: int = api.CONTAINER_CREATED
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    starting: bool = False
    removing: bool = False
    process: Process | None = None
    resources: api.LinuxContainerResources = field(default_factory=api.LinuxContainerResources)
    files: dict[str, bytes] = field(default_factory=dict)
    """The container's own files (its writable layer); mounts are read from the host."""
    memory_bytes: int = 0
    """What its stats report as memory in use (set by a test)."""
    sigterm: SigtermMode | None = None
    """None: the runtime's default."""
    pid: int = 0

    @property
    def running(self) -> bool:
        return self.state == api.CONTAINER_RUNNING


class ContainerFiles:
    """A container's filesystem as its programs see it: mounts are the host's files (so volume
    contents are what the container reads), everything else its own layer (a dict)."""

    def __init__(self, container: Container) -> None:
        self._c = container
        cwd = container.config.working_dir or "/"
        self._cwd = cwd if cwd.startswith("/") else "/" + cwd

    def _full(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self._cwd, path))

    def _host(self, path: str) -> tuple[Path | None, bool]:
        """The host path behind ``path`` (None: the container's own layer) and whether the
        mount is read-only."""
        best: api.Mount | None = None
        for mount in self._c.config.mounts:
            cpath = posixpath.normpath(mount.container_path)
            if path == cpath or path.startswith(cpath.rstrip("/") + "/"):
                if best is None or len(cpath) > len(posixpath.normpath(best.container_path)):
                    best = mount
        if best is None:
            return None, False
        rest = posixpath.relpath(path, posixpath.normpath(best.container_path))
        host = Path(best.host_path) if rest == "." else Path(best.host_path) / rest
        return host, best.readonly

    def read(self, path: str) -> bytes | None:
        full = self._full(path)
        if full == "/etc/hostname" and full not in self._c.files:
            return (self._c.hostname + "\n").encode()
        host, _ = self._host(full)
        if host is None:
            return self._c.files.get(full)
        try:
            return host.read_bytes()
        except OSError:
            return None

    def write(self, path: str, data: bytes, append: bool = False) -> bool:
        full = self._full(path)
        host, readonly = self._host(full)
        if host is None:
            self._c.files[full] = (self._c.files.get(full, b"") if append else b"") + data
            return True
        if readonly:
            return False
        try:
            with host.open("ab" if append else "wb") as f:
                f.write(data)
        except OSError:
            return False
        return True

    def remove(self, path: str) -> bool:
        full = self._full(path)
        host, readonly = self._host(full)
        if host is None:
            return self._c.files.pop(full, None) is not None
        if readonly:
            return False
        try:
            host.unlink()
        except OSError:
            return False
        return True

    def kind(self, path: str) -> Literal["file", "dir", None]:
        full = self._full(path)
        host, _ = self._host(full)
        if host is not None:
            return "dir" if host.is_dir() else "file" if host.exists() else None
        if full in self._c.files or full == "/etc/hostname":
            return "file"
        if full == "/" or any(p.startswith(full.rstrip("/") + "/") for p in self._c.files):
            return "dir"
        return None

    def listing(self, path: str) -> list[str] | None:
        full = self._full(path)
        host, _ = self._host(full)
        if host is not None:
            try:
                return sorted(os.listdir(host))
            except OSError:
                return None
        prefix = full.rstrip("/") + "/"
        names = sorted({p[len(prefix):].split("/", 1)[0] for p in self._c.files if p.startswith(prefix)})
        return names if names or self.kind(full) == "dir" else None


class CriLog:
    """The container's output, written where the kubelet reads it, in the CRI log format
    (``<RFC3339Nano> <stdout|stderr> <F|P> <text>``: F ends a line, P is part of one).

    Each record opens the file anew, so a log the kubelet rotated (renamed) is continued in a
    new file at once — containerd does that only on ReopenContainerLog."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None

    def touch(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()

    def write(self, stream: Literal["stdout", "stderr"], text: str) -> None:
        if self.path is None or not text:
            return
        lines = text.split("\n")
        records = [(line, "F") for line in lines[:-1]]
        if lines[-1]:
            records.append((lines[-1], "P"))
        stamp = rfc3339_nano(time.time_ns())
        try:
            with self.path.open("a") as f:
                for line, tag in records:
                    f.write(f"{stamp} {stream} {tag} {line}\n")
        except OSError:
            pass  # the directory went away (the pod's logs were removed): output is lost, as in containerd


def rfc3339_nano(ns: int) -> str:
    """Go's time.RFC3339Nano in UTC: trailing zeros of the fraction dropped."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    frac = f"{fraction:09d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"


__all__ = ["Container", "ContainerFiles", "CriLog", "POD_UID_LABEL", "Sandbox", "now_ns", "rfc3339_nano"]
