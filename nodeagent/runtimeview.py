"""What the runtime runs, per pod, as the relister last saw it (the kubelet's pod cache).

Records are built from CRI objects and the kubelet's labels/annotations, so that everything a
restarted agent needs (restart counts, grace periods) can be recovered from the runtime alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from cri import types as t
from nodeagent import labels as L

Expectation: TypeAlias = tuple[str, Literal["created", "running", "ready"]]
"""What a stage's change to the runtime was: (container id, "created" or "running") or
(sandbox id, "ready"). On a runtime that streams events, the change's own event shows it to the
relister instead of a listing (nodeagent/pleg.py)."""


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    attempt: int
    ready: bool
    created_at: int
    pod_ip: str = ""
    pod_ips: tuple[str, ...] = ()
    """Every IP CNI gave the sandbox, the primary (``pod_ip``) first; () while not known."""


@dataclass(frozen=True)
class ContainerRecord:
    id: str
    name: str
    pod_uid: str
    sandbox_id: str
    attempt: int
    state: str  # "created" | "running" | "exited" | "unknown"
    created_at: int
    restart_count: int = 0
    container_type: str = "container"  # "init" | "container" (annotation io.kubernetes.container.type)
    image: str = ""
    image_ref: str = ""
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    log_path: str = ""
    hash: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def exited(self) -> bool:
        return self.state == "exited"


@dataclass(frozen=True)
class PodRuntime:
    uid: str
    name: str = ""
    namespace: str = ""
    sandboxes: tuple[SandboxRecord, ...] = ()
    containers: tuple[ContainerRecord, ...] = ()
    seen_at: float = 0.0
    changed_at: float = 0.0
    """``seen_at`` of the listing that last changed the pod's sandboxes or containers: a listing
    since then showed the same (what the pod's status must reflect is no newer than this)."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def ready_sandbox(self) -> SandboxRecord | None:
        ready = [s for s in self.sandboxes if s.ready]
        return max(ready, key=lambda s: s.created_at) if ready else None

    def latest(self, container: str) -> ContainerRecord | None:
        """The newest instance of ``container`` (the kubelet's ``state``)."""
        found = [c for c in self.containers if c.name == container]
        return max(found, key=lambda c: (c.attempt, c.created_at)) if found else None

    def previous(self, container: str) -> ContainerRecord | None:
        """The second newest instance (the kubelet's ``lastState``)."""
        found = sorted(
            (c for c in self.containers if c.name == container),
            key=lambda c: (c.attempt, c.created_at),
            reverse=True,
        )
        return found[1] if len(found) > 1 else None

    def running(self) -> list[ContainerRecord]:
        return [c for c in self.containers if c.running]

    def newest_sandbox(self) -> SandboxRecord | None:
        return max(self.sandboxes, key=lambda s: s.created_at) if self.sandboxes else None

    def latest_in(self, sandbox_id: str, since: int = 0) -> dict[str, ContainerRecord]:
        """The newest instance of each container in ``sandbox_id`` (made after ``since``, ns)."""
        found: dict[str, ContainerRecord] = {}
        for c in sorted(self.containers, key=lambda c: (c.attempt, c.created_at)):
            if c.sandbox_id == sandbox_id and c.created_at > since:
                found[c.name] = c
        return found


EMPTY = PodRuntime(uid="")


def pod_identity(labels: dict[str, str]) -> tuple[str, str, str]:
    return labels.get(L.POD_UID, ""), labels.get(L.POD_NAME, ""), labels.get(L.POD_NAMESPACE, "")


def sandbox_ips(status: t.PodSandboxStatus) -> tuple[str, ...]:
    """A sandbox's IPs as PodSandboxStatus (or a container event) gives them, the primary first."""
    network = status.network
    if network is None:
        return ()
    return tuple(ip for ip in (network.ip, *(a.ip for a in network.additional_ips)) if ip)
