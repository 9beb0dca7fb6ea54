"""One fake of what a stage is given — a pod context and the object store — for unit tests of
stages, ours and third-party ones, so that no test file hand-rolls its own.

``FakePodContext`` implements the whole PodContext contract (nodeagent/stages.py) over a
``ManualClock``: a test drives time, changes the pod (``set_pod`` wakes ``pod_changed`` as the
worker does), changes what the runtime shows (``set_observed`` wakes ``runtime_changed``), and
reads back what the stage reported (``status``), published (``events``), asked for
(``relists``, ``woken``) and decided (``completed``, ``failed``).

``FakeObjects`` is the standalone object store (nodeagent/objects/filestore.py, a real backend)
standing in for an API server: objects are ``put`` by kind, reads are counted and can be made
to fail, TokenRequests are answered, and objects of a kind that was ``put`` can be created,
updated (conditionally on resourceVersion), merge-patched and deleted in memory. Against a real API server, use the real store: the
integration tests do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import anyio
import structlog

from nodeagent.additions import AdditionsAccess, PodAdditions
from nodeagent.clock import ManualClock
from nodeagent.config import AgentConfig
from nodeagent.events import Event, PodRef
from nodeagent.facts import Fact, FactAccess, PodFacts
from nodeagent.kubeletconfig.node import NodeConfig
from nodeagent.model import Pod
from nodeagent.objects import FileObjects, Kind, ObjectError, Snapshot, kinds
from nodeagent.podstatus import PodStatus
from nodeagent.runtimeview import Expectation, PodRuntime
from nodeagent.stages import NodeInfo
from nodeagent.stash import Stash
from nodeagent.waits import first_of

NODE = NodeInfo(name="n1", ip="10.0.0.9", allocatable={"cpu": 4000, "memory": 8 * 2**30, "pods": 110}, labels={})


class FakeObjects(FileObjects):
    """The standalone store as a stand-in API server (``cluster`` True)."""

    cluster = True

    def __init__(self, clock: ManualClock | None = None) -> None:
        super().__init__(())
        self.clock = clock or ManualClock()
        self.reads: list[str] = []
        self.failure: Exception | None = None
        """Raised by every read while set (an API server that does not answer, or refuses)."""
        self.token_requests = 0
        self.writes: list[tuple[str, str]] = []
        """(verb, "Kind/name") of every create, update, patch and delete, in order."""
        self._version = 0

    def put(self, kind: Kind, *objects: Mapping[str, Any]) -> None:
        """Replace every object of ``kind`` with these (namespace defaulted to "default")."""
        self.declare(kind)
        self.replace(kind, [dict(o) for o in objects])

    async def get(self, kind: Kind, name: str, namespace: str | None = None, *,
                  max_age: float | None = None) -> Snapshot | None:
        self.reads.append(f"{kind.kind}/{namespace or ''}/{name}")
        if self.failure is not None:
            raise self.failure
        return await super().get(kind, name, namespace, max_age=max_age)

    async def create(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None, *,
                     name: str | None = None, subresource: str | None = None) -> Snapshot:
        if self.failure is not None:
            raise self.failure
        if kind == kinds.SERVICE_ACCOUNT and subresource == "token":
            self.token_requests += 1
            seconds = int(body["spec"].get("expirationSeconds") or 3600)
            expires = datetime.fromtimestamp(self.clock.now() + seconds, tz=UTC)
            return {"spec": {"expirationSeconds": seconds},
                    "status": {"token": f"token-{self.token_requests}",
                               "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}
        if (kind.group, kind.kind) not in self._kinds:
            raise ObjectError(f"FakeObjects does not create {kind}", 405)
        meta = dict(body.get("metadata") or {})
        if await super().get(kind, str(meta.get("name")), namespace or meta.get("namespace")) is not None:
            raise ObjectError(f"409: {kind} {meta.get('name')} already exists", 409)
        self.writes.append(("create", f"{kind.kind}/{meta.get('name')}"))
        return self._store(kind, {**body, "metadata": {"uid": f"uid-{meta.get('name')}", **meta}})

    async def update(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None, *,
                     subresource: str | None = None) -> Snapshot:
        if self.failure is not None:
            raise self.failure
        meta = body.get("metadata") or {}
        current = await super().get(kind, str(meta.get("name")), namespace or meta.get("namespace"))
        if current is None:
            raise ObjectError(f"404: {kind} {meta.get('name')} not found", 404)
        wanted = meta.get("resourceVersion")
        if wanted and wanted != (current.get("metadata") or {}).get("resourceVersion"):
            raise ObjectError(f"409: {kind} {meta.get('name')} was modified", 409)
        self.writes.append(("update", f"{kind.kind}/{meta.get('name')}"))
        return self._store(kind, body)

    async def patch(self, kind: Kind, name: str, patch: Mapping[str, Any], namespace: str | None = None, *,
                    subresource: str | None = None, merge: str = "merge") -> Snapshot:
        if self.failure is not None:
            raise self.failure
        current = await super().get(kind, name, namespace)
        if current is None:
            raise ObjectError(f"404: {kind} {name} not found", 404)
        self.writes.append(("patch", f"{kind.kind}/{name}"))
        return self._store(kind, _merge_patch(current, patch))

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        self.writes.append(("delete", f"{kind.kind}/{name}"))
        keep = [o for o in self._objects.get(kind, [])
                if not ((o.get("metadata") or {}).get("name") == name
                        and (not kind.namespaced or (o.get("metadata") or {}).get("namespace") == (namespace or "default")))]
        self.replace(kind, keep)

    def _store(self, kind: Kind, body: Mapping[str, Any]) -> Snapshot:
        """Write ``body`` in place of the object of the same name, with a new resourceVersion."""
        self._version += 1
        meta = {**(body.get("metadata") or {}), "resourceVersion": str(self._version)}
        obj = {**body, "metadata": meta}
        same = (meta.get("name"), meta.get("namespace") or "default")
        keep = [o for o in self._objects.get(kind, [])
                if ((o.get("metadata") or {}).get("name"), (o.get("metadata") or {}).get("namespace") or "default")
                != same]
        self.replace(kind, [*keep, obj])
        return obj


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


@dataclass
class FakeStatus:
    """What a stage reported through ``ctx.status``."""

    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    reason: tuple[str, str] = ("", "")
    observed: PodStatus | None = None
    probes: list[tuple[str, bool | None, bool | None]] = field(default_factory=list)
    conditions: dict[str, tuple[bool, str, str]] = field(default_factory=dict)

    def container_waiting(self, container: str, reason: str, message: str = "") -> None:
        self.waiting[container] = (reason, message)

    def clear_container_waiting(self, container: str) -> None:
        self.waiting.pop(container, None)

    def set_pod_reason(self, reason: str, message: str = "") -> None:
        self.reason = (reason, message)

    def set_observed(self, status: PodStatus) -> None:
        self.observed = status

    def container_probe_result(self, container: str, *, ready: bool | None = None,
                               started: bool | None = None) -> None:
        self.probes.append((container, ready, started))

    def set_condition(self, type: str, status: bool, reason: str = "", message: str = "") -> None:
        self.conditions[type] = (status, reason, message)


class _AnyFacts(FactAccess):
    """A fake context's facts: every fact may be read and written (the declarations are the
    registry's business, tested there)."""

    def _check_provides(self, fact: Fact[Any]) -> None:
        return None

    def get(self, fact: Fact[Any], default: Any = None) -> Any:
        return self._facts._values.get(fact, default)


def default_node_config() -> NodeConfig:
    """The node configuration of an agent built with no configuration (nodeagent's defaults)."""
    return AgentConfig(node_name=NODE.name, root_dir=Path("/nonexistent")).node_config()


@dataclass
class FakePodContext:
    pod: Pod
    stage: str = "test"
    clock: ManualClock = field(default_factory=ManualClock)
    runtime: Any = None
    node: NodeInfo = NODE
    objects: Any = field(default_factory=FileObjects)
    pod_dir: Path = field(default_factory=lambda: Path("/nonexistent"))
    settings: NodeConfig = field(default_factory=lambda: default_node_config())
    stash: Stash = field(default_factory=Stash)
    status: FakeStatus = field(default_factory=FakeStatus)
    observed: PodRuntime = field(default_factory=lambda: PodRuntime(uid=""))
    terminating: bool = False
    log: Any = field(default_factory=lambda: structlog.get_logger("test"))
    events: list[Event] = field(default_factory=list)
    relists: int = 0
    woken: int = 0
    completed: str | None = None
    failed: tuple[str, str] | None = None
    pod_additions: PodAdditions = field(default_factory=PodAdditions)
    """What the stage gave the containers (``merged(container)`` to read them back)."""
    _pod_facts: PodFacts = field(default_factory=PodFacts)
    _spec_changed: anyio.Event = field(default_factory=anyio.Event)
    _runtime_changed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def ref(self) -> PodRef:
        return PodRef(uid=self.pod.uid, namespace=self.pod.metadata.namespace, name=self.pod.metadata.name)

    @property
    def facts(self) -> FactAccess:
        return _AnyFacts(self._pod_facts, self.stage, frozenset(), frozenset())

    @property
    def additions(self) -> AdditionsAccess:
        """Every container addition may be set and read (declarations are the registry's)."""
        return AdditionsAccess(self.pod_additions, self.stage, provides=True, uses=True)

    # --- what a test does to the pod --------------------------------------------------

    def set_pod(self, pod: Pod) -> None:
        """A new spec, as the worker takes one up."""
        self.pod = pod
        changed, self._spec_changed = self._spec_changed, anyio.Event()
        changed.set()

    def set_observed(self, runtime: PodRuntime) -> None:
        """What the relister would see now."""
        self.observed = runtime
        changed, self._runtime_changed = self._runtime_changed, anyio.Event()
        changed.set()

    # --- the PodContext contract --------------------------------------------------------

    async def pod_changed(self, since: Pod, timeout: float) -> bool:
        if self.pod is not since:
            return True
        return await first_of(self._spec_changed.wait(), self.clock.sleep(timeout)) == 0

    async def runtime_changed(self, timeout: float | None = None) -> None:
        if timeout is None:
            await self._runtime_changed.wait()
        else:
            await first_of(self._runtime_changed.wait(), self.clock.sleep(timeout))

    def request_relist(self, expect: Expectation | None = None) -> None:
        self.relists += 1

    async def publish(self, event: Event) -> None:
        self.events.append(event.model_copy(update={"pod": self.ref, "source": self.stage}))

    def complete(self, phase: Literal["Succeeded", "Failed"]) -> None:
        self.completed = phase

    def fail(self, reason: str, message: str) -> None:
        self.failed = (reason, message)
        self.completed = "Failed"

    def wake(self) -> None:
        self.woken += 1


__all__ = ["FakeObjects", "FakePodContext", "FakeStatus", "NODE"]
