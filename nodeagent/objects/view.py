"""A view: the objects of one scope (a kind, maybe a namespace and selectors) as last seen,
kept current by whichever backend feeds it (a list and watch of the API server, or the
standalone manifests), with change notifications.

Snapshots are the API's JSON form (dicts, as ``kubectl get -o json`` shows them), shared and
read-only: a stage that wants to change one copies it first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from nodeagent.objects.kinds import Kind

log = structlog.get_logger("nodeagent.objects")

Snapshot = Mapping[str, Any]
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
Handler = Callable[[str, Snapshot | None, Snapshot | None], None]
"""``handler(change, old, new)``: called once per change, in order, from the task that feeds the
view; it must not block (it may set an event or note a key for its own task)."""


@dataclass(frozen=True)
class Scope:
    kind: Kind
    namespace: str | None = None
    """None: every namespace (or a cluster-scoped kind)."""
    fields: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        parts = [str(self.kind)]
        if self.namespace:
            parts.append(f"namespace={self.namespace}")
        parts += [f"{k}={v}" for k, v in self.fields] + [f"{k}={v}" for k, v in self.labels]
        return " ".join(parts)


def key_of(obj: Snapshot) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


@dataclass
class View:
    scope: Scope
    synced: bool = False
    """The first complete listing has arrived (before: an empty view means "not known yet")."""
    error: str = ""
    """What went wrong on the last attempt ("" while the feed is healthy); 403 means the node's
    credentials may not read this kind (its RBAC is the operator's to grant)."""
    generation: int = 0
    """Bumped on every change: ``await changed(after=seen)`` waits for the next one."""
    _objects: dict[tuple[str, str], Snapshot] = field(default_factory=dict)
    _handlers: list[Handler] = field(default_factory=list)
    _wake: anyio.Event = field(default_factory=anyio.Event)
    users: int = 0
    """How many holders asked for the view; the store stops feeding it when none is left."""

    # --- reading ---------------------------------------------------------------------------

    def items(self) -> list[Snapshot]:
        return list(self._objects.values())

    def get(self, name: str, namespace: str | None = None) -> Snapshot | None:
        return self._objects.get((namespace or self.scope.namespace or "", name))

    def __len__(self) -> int:
        return len(self._objects)

    async def wait_synced(self, timeout: float | None = None) -> bool:
        """Until the first listing arrived (or ``timeout``); returns ``synced``."""
        with anyio.move_on_after(timeout):
            while not self.synced:
                await self.changed(self.generation)
        return self.synced

    async def changed(self, after: int, timeout: float | None = None) -> int:
        """Wait until the view changed past generation ``after`` (at once if it already has);
        returns the generation now (unchanged on timeout)."""
        with anyio.move_on_after(timeout):
            while self.generation <= after:
                await self._wake.wait()
        return self.generation

    def on_change(self, handler: Handler) -> None:
        self._handlers.append(handler)

    # --- fed by a backend ------------------------------------------------------------------

    def replace(self, objects: Sequence[Snapshot]) -> None:
        """A complete listing: the difference to what was known becomes changes."""
        fresh = {key_of(o): o for o in objects}
        changes: list[tuple[str, Snapshot | None, Snapshot | None]] = []
        for key, gone in self._objects.items():
            if key not in fresh:
                changes.append((DELETED, gone, None))
        for key, new in fresh.items():
            old = self._objects.get(key)
            if old is None:
                changes.append((ADDED, None, new))
            elif _version(old) != _version(new) or old != new:
                changes.append((MODIFIED, old, new))
        self._objects = fresh
        self.error = ""
        first = not self.synced
        self.synced = True
        self._notify(changes, force=first)

    def apply(self, change: str, obj: Snapshot) -> None:
        """One watch event."""
        key = key_of(obj)
        old = self._objects.get(key)
        if change == DELETED:
            if old is None:
                return
            del self._objects[key]
            self._notify([(DELETED, old, None)])
            return
        self._objects[key] = obj
        self._notify([(ADDED if old is None else MODIFIED, old, obj)])

    def failed(self, error: str) -> None:
        self.error = error

    def _notify(self, changes: list[tuple[str, Snapshot | None, Snapshot | None]], force: bool = False) -> None:
        if not changes and not force:
            return
        self.generation += 1
        wake, self._wake = self._wake, anyio.Event()
        wake.set()
        for change, old, new in changes:
            for handler in list(self._handlers):
                try:
                    handler(change, old, new)
                except Exception:  # noqa: BLE001 - one holder's bug must not stop the feed
                    log.exception("object change handler failed", scope=str(self.scope))


def _version(obj: Snapshot) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


__all__ = ["ADDED", "DELETED", "Handler", "MODIFIED", "Scope", "Snapshot", "View", "key_of"]
