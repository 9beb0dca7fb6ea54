"""User namespaces (``spec.hostUsers: false``): the kubelet's user namespace manager
(pkg/kubelet/userns).

Each such pod gets 65536 host IDs of its own: slot ``n`` of the node's range maps container
IDs 0..65535 to host IDs ``first + n*65536`` on, identical for UIDs and GIDs. The range is the
kubelet's default without a ``kubelet`` OS user (first = 65536, length = 2^32 - 65536: the host
IDs below 65536, where the node's own users live, are never handed out). The allocation is
persisted as ``<rootDir>/pods/<uid>/userns`` in the kubelet's JSON
(``{"uidMappings":[{"hostId":N,"containerId":0,"length":65536}],"gidMappings":[...]}``), written
atomically, so that a restarted agent gives a pod the same IDs (its files on disk keep their
owners) and never gives them to another pod; the slot is released when the pod is cleaned up.

CRI: the sandbox's and every container's ``namespace_options.userns_options`` —
``mode: POD`` with the mappings, or ``mode: NODE`` for a pod that keeps the host's (as the
kubelet sends it for every pod). The runtime does the idmapped mounts; the kubelet only checks
that the pod's runtime handler says it can (StatusResponse.runtime_handlers[].features
.user_namespaces, CRI 1.30+: containerd 2.x with runc >= 1.2). A runtime that cannot — containerd
1.6 reports no handlers at all, where the pod would silently share the host's user namespace —
fails the sandbox with the kubelet's message, reason FailedCreatePodSandBox.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import threading
from pathlib import Path

import anyio

from cri import types as t
from nodeagent import hostpaths
from nodeagent.stages import PodContext
from plugins.runtime.sandbox import SandboxConfigError

IDS_PER_POD = 1 << 16
"""DefaultKubeletUserNamespacesIDsPerPod; also the unit idsPerPod must be a multiple of."""
FIRST_ID = IDS_PER_POD
RANGE_LENGTH = (1 << 32) - IDS_PER_POD
KUBELET_USER = "kubelet"
"""The OS user whose subordinate IDs (``getsubids kubelet``) are the node's range, if it exists."""
MAPPINGS_FILE = "userns"
NODE_MODE = t.UserNamespace(mode=t.NamespaceMode.NODE)


class UserNamespacesUnsupported(SandboxConfigError):
    """The pod's runtime handler cannot run it in a user namespace of its own."""


def unsupported_message(handler: str, caps: t.RuntimeCapabilities) -> str | None:
    """Why ``handler`` cannot do user namespaces (the kubelet's text, userns_manager.go with
    HandlerSupportsUserNamespaces), or None if it can. A runtime that reports no handlers (too
    old for the field) supports none; a handler missing from a non-empty list is "not known"."""
    found = caps.handler(handler)
    if found is not None and found.features is not None and found.features.user_namespaces:
        return None
    why = "can't set `spec.hostUsers: false`, " + (
        f'RuntimeClass handler "{handler}" does not support user namespaces' if handler else
        "runtime does not support user namespaces")
    if found is None and caps.runtime_handlers:
        why += f': the handler "{handler}" is not known'
    return why


class RangeError(ValueError):
    """The node's user namespace range cannot be used (the kubelet would not start)."""


def parse_getsubids(output: str) -> tuple[int, int]:
    """``getsubids``'s one line, ``0: kubelet <first> <count>``: (first, count)."""
    lines = output.strip("\n").split("\n")
    if len(lines) != 1:
        raise RangeError(f"error parsing line {output!r}: it must contain only one line")
    parts = lines[0].split()
    if len(parts) != 4:
        raise RangeError(f"invalid line {output!r}")
    try:
        first, count = int(parts[2]), int(parts[3])
    except ValueError as exc:
        raise RangeError(f"error parsing line {output!r}: {exc}") from None
    if not (0 <= first < 1 << 32 and 0 <= count < 1 << 32):
        raise RangeError(f"error parsing line {output!r}: value out of range")
    return first, count


def kubelet_range(ids_per_pod: int, max_pods: int, *, user: str = KUBELET_USER,
                  getsubids: str | None = "getsubids") -> tuple[int, int]:
    """The node's host ID range, as the kubelet finds it (getKubeletMappings, then the user
    namespace manager's checks): the ``kubelet`` OS user's subordinate IDs when the user exists
    and ``getsubids`` is installed (the same single range for UIDs and GIDs), else every ID from
    idsPerPod up. Blocking (a worker thread or startup)."""
    first, length = _subordinate_ids(user, getsubids) or (ids_per_pod, (1 << 32) - ids_per_pod)
    # The manager's checks, on either range (a default range that idsPerPod does not divide
    # stops the kubelet too).
    if length % ids_per_pod:
        raise RangeError(f"kubelet user assigned IDs length {length} is not a multiple of {ids_per_pod}")
    if first % ids_per_pod:
        raise RangeError(f"kubelet user assigned ID {first} is not a multiple of {ids_per_pod}")
    if first < ids_per_pod:
        raise RangeError(f"kubelet user assigned ID {first} must be greater or equal to {ids_per_pod}")
    if length // ids_per_pod < max_pods:
        raise RangeError(f"kubelet user assigned IDs are not enough to support {max_pods} pods")
    return first, length


def _subordinate_ids(user: str, getsubids: str | None) -> tuple[int, int] | None:
    """The user's one subordinate range (UIDs and GIDs alike), None without the user or the tool."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        return None
    tool = shutil.which(getsubids) if getsubids else None
    if tool is None:
        return None
    outputs = []
    for args, what in (([user], "uids"), (["-g", user], "gids")):
        try:
            run = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise RangeError(f"kubelet mappings: error retrieving additional {what} for user {user!r}: "
                             f"{exc}") from None
        outputs.append(run.stdout)
    if outputs[0] != outputs[1]:
        raise RangeError(f"kubelet mappings: mismatched subuids and subgids for user {user!r}")
    return parse_getsubids(outputs[0])


class UserNamespaces:
    """The node's ID slots (one allocator per agent: the runtime stage owns it)."""

    def __init__(self, root_dir: Path, first_id: int = FIRST_ID, length: int = RANGE_LENGTH,
                 ids_per_pod: int = IDS_PER_POD, *, broken: str | None = None) -> None:
        if first_id % ids_per_pod or first_id < ids_per_pod or length % ids_per_pod:
            raise ValueError("the user namespace range must be aligned to, and start at or above, idsPerPod")
        self._broken = broken
        """Why the node's range cannot be used: pods with hostUsers: false are refused with it
        (the kubelet would not start; every other pod runs here)."""
        self._root = root_dir
        self._per_pod = ids_per_pod
        self._offset = first_id // ids_per_pod
        self._slots = length // ids_per_pod
        self._used: dict[str, int] = {}  # pod UID -> slot
        self._loaded = False
        self._lock = threading.Lock()  # the file work runs in worker threads

    # --- the pod's options ---------------------------------------------------------------

    async def options(self, ctx: PodContext, handler: str) -> t.UserNamespace:
        """GetOrCreateUserNamespaceMappings: NODE unless ``hostUsers: false``; then the pod's
        mappings (allocated now, or read back), once the runtime handler is known to support
        user namespaces."""
        if ctx.pod.spec.host_users is not False:
            return NODE_MODE
        if self._broken is not None:
            raise SandboxConfigError(f"Failed to create pod sandbox: {self._broken}")
        caps = await ctx.runtime.capabilities()
        why = unsupported_message(handler, caps)
        if why is not None:
            raise UserNamespacesUnsupported(f"Failed to create pod sandbox: {why}")
        try:
            host_id = await anyio.to_thread.run_sync(self.allocate, ctx.ref.uid)
        except (OSError, ValueError) as exc:
            raise SandboxConfigError(f"Failed to create pod sandbox: {exc}") from None
        mapping = [t.IDMapping(host_id=host_id, container_id=0, length=self._per_pod)]
        return t.UserNamespace(mode=t.NamespaceMode.POD, uids=mapping, gids=list(mapping))

    # --- allocation (blocking: worker threads) ---------------------------------------------

    def _file(self, uid: str) -> Path:
        return hostpaths.pod_dir(self._root, uid) / MAPPINGS_FILE

    def _load(self) -> None:
        """Record the allocations persisted by earlier runs (the kubelet's init)."""
        if self._loaded:
            return
        self._loaded = True
        pods = self._root / hostpaths.PODS
        try:
            entries = list(pods.iterdir())
        except FileNotFoundError:
            return
        for entry in entries:
            try:
                self._record(entry.name, self._parse((entry / MAPPINGS_FILE).read_bytes()))
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                # Its IDs stay unknown: never reuse what an unreadable file may hold.
                continue

    def _parse(self, content: bytes) -> int:
        data = json.loads(content)
        uids, gids = data.get("uidMappings") or [], data.get("gidMappings") or []
        if len(uids) != 1 or uids != gids:
            raise ValueError("invalid user namespace configuration: GID and UID mappings should be identical")
        if uids[0].get("containerId") != 0:
            raise ValueError("invalid user namespace configuration: UID 0 must be mapped")
        if uids[0].get("length") != self._per_pod:
            raise ValueError(f"wrong user namespace length {uids[0].get('length')}")
        host_id = uids[0].get("hostId")
        if not isinstance(host_id, int) or host_id % self._per_pod:
            raise ValueError(f"wrong user namespace offset specified {host_id}")
        return host_id

    def _record(self, uid: str, host_id: int) -> None:
        slot = host_id // self._per_pod - self._offset
        if not 0 <= slot < self._slots:
            raise ValueError(f"id {host_id} is out of range")
        self._used[uid] = slot

    def allocate(self, uid: str) -> int:
        """The first host ID of ``uid``'s slot: the one it has (memory, then its file), else
        the first free one, persisted before it is returned."""
        with self._lock:
            self._load()
            if uid in self._used:
                return (self._used[uid] + self._offset) * self._per_pod
            path = self._file(uid)
            try:
                host_id = self._parse(path.read_bytes())
                self._record(uid, host_id)
                return host_id
            except FileNotFoundError:
                pass
            taken = set(self._used.values())
            slot = next((s for s in range(self._slots) if s not in taken), None)
            if slot is None:
                raise ValueError("could not find an empty slot to allocate a user namespace")
            host_id = (slot + self._offset) * self._per_pod
            mapping = [{"hostId": host_id, "containerId": 0, "length": self._per_pod}]
            _write_atomically(path, json.dumps({"uidMappings": mapping, "gidMappings": mapping}).encode())
            self._used[uid] = slot
            return host_id

    def release(self, uid: str) -> None:
        """The pod is gone: its slot is free again, its file removed."""
        with self._lock:
            self._used.pop(uid, None)
            try:
                self._file(uid).unlink()
            except OSError:
                pass

    def allocated(self) -> dict[str, int]:
        """Pod UID -> first host ID (for tests and describe)."""
        with self._lock:
            return {uid: (slot + self._offset) * self._per_pod for uid, slot in self._used.items()}


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["FIRST_ID", "IDS_PER_POD", "MAPPINGS_FILE", "NODE_MODE", "UserNamespaces", "UserNamespacesUnsupported",
           "unsupported_message"]
