"""The object store: the one door through which stages read (and, for the few writes they
need, change) API objects — Nodes, ConfigMaps, Secrets, ResourceClaims, PodGroups, RuntimeClasses,
CSIDrivers, PVCs, ... — with the node's credentials.

Stages never open a client or import lightkube: they get an :class:`ObjectStore` through
their handle and ask it for

* ``view(kind, namespace=..., fields=..., labels=...)`` — the objects of a scope, kept current
  (cluster mode: a list and watch shared by everyone asking for the same scope; standalone:
  the manifests beside the static pods), with ``synced``, ``error``, ``changed()`` and change
  handlers;
* ``get(kind, name, namespace)`` — one object by name through a cache (how a node reads the
  secrets and configMaps of its pods);
* ``create`` / ``update`` / ``patch`` / ``delete`` — the writes stages make (a TokenRequest,
  the node's own ResourceSlices, its CSINode, a PVC's status after a node expansion).

The core runs the store (``run``) under its supervisor; the backends are
:class:`~nodeagent.objects.apistore.ApiObjects` and
:class:`~nodeagent.objects.filestore.FileObjects`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio

from nodeagent.objects.apistore import ApiObjects, ObjectError
from nodeagent.objects.filestore import FileObjects
from nodeagent.objects.kinds import Kind
from nodeagent.objects.view import ADDED, DELETED, MODIFIED, Handler, Scope, Snapshot, View


class ObjectStore(Protocol):
    cluster: bool
    """True: backed by an API server (cluster mode); False: standalone manifests."""

    def view(self, kind: Kind, *, namespace: str | None = None, fields: Mapping[str, str] | None = None,
             labels: Mapping[str, str] | None = None) -> View:
        """A shared, kept-current view of a scope; ``release`` it when done (node-lifetime
        views are simply kept)."""

    def release(self, view: View) -> None: ...

    def declare(self, kind: Kind, check: Callable[[Snapshot], object] | None = None) -> None:
        """A stage reads ``kind``: standalone, manifests beside the static pods may hold it
        (each passed through ``check`` when read); with an API server, nothing to do."""

    async def get(self, kind: Kind, name: str, namespace: str | None = None, *,
                  max_age: float | None = None) -> Snapshot | None:
        """The object (None: it does not exist); raises ObjectError when it cannot be read."""

    def forget(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        """Drop a cached read: the next ``get`` asks again."""

    async def create(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None, *,
                     name: str | None = None, subresource: str | None = None) -> Snapshot: ...

    async def update(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None, *,
                     subresource: str | None = None) -> Snapshot:
        """PUT the whole object (conditional on its resourceVersion: 409 when stale)."""

    async def patch(self, kind: Kind, name: str, patch: Mapping[str, Any], namespace: str | None = None, *,
                    subresource: str | None = None, merge: str = "merge") -> Snapshot:
        """A JSON merge patch (``merge="merge"``) or strategic merge patch (``"strategic"``)."""

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None: ...

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...


__all__ = ["ADDED", "ApiObjects", "DELETED", "FileObjects", "Handler", "Kind", "MODIFIED", "ObjectError",
           "ObjectStore", "Scope", "Snapshot", "View"]
