"""The object store of standalone mode: objects from manifests beside the static pods.

There is no API server to allocate a ResourceClaim or hold a PodGroup, so a node developer
writes them as documents in ``staticPodPath`` next to the pods that use them; the static
source hands every such document here (:meth:`FileObjects.replace`), and stages read them
through the same :class:`View` and ``get`` as in cluster mode. Writes have no server to go
to: they fail with :class:`ObjectError` (code None), which stages treat as "no API".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anyio

from nodeagent.objects.apistore import ObjectError
from nodeagent.objects.kinds import POD_GROUP, RESOURCE_CLAIM, RUNTIME_CLASS, WORKLOAD, Kind
from nodeagent.objects.view import Scope, Snapshot, View

MANIFEST_KINDS: tuple[Kind, ...] = (RESOURCE_CLAIM, POD_GROUP, WORKLOAD, RUNTIME_CLASS)
"""Kinds a static pod directory may hold besides pods (plugins may declare more)."""

Check = Callable[[Snapshot], object]
"""A reader's check of one document of its kind: raises ValueError (a pydantic ValidationError
is one) saying what is wrong, so that the manifest is rejected with the reason, not read later."""


def matches(scope: Scope, obj: Snapshot) -> bool:
    meta = obj.get("metadata") or {}
    if scope.namespace and (meta.get("namespace") or "default") != scope.namespace:
        return False
    for path, wanted in scope.fields:
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if str(value or "") != wanted:
            return False
    labels = meta.get("labels") or {}
    return all(labels.get(k) == v for k, v in scope.labels)


class FileObjects:
    cluster = False
    """No API server: the objects are the manifests beside the static pods."""

    def __init__(self, kinds: Iterable[Kind] = MANIFEST_KINDS) -> None:
        self._kinds: dict[tuple[str, str], Kind] = {(k.group, k.kind): k for k in kinds}
        self._checks: dict[Kind, Check] = {}
        self._objects: dict[Kind, list[Snapshot]] = {}
        self._views: dict[Scope, View] = {}

    # --- what manifests may hold -------------------------------------------------------------

    def declare(self, kind: Kind, check: Check | None = None) -> None:
        """A plugin reads this kind: documents of it in the manifest directory are objects,
        each one passed through ``check`` (if given) when its file is read."""
        self._kinds.setdefault((kind.group, kind.kind), kind)
        if check is not None:
            self._checks[kind] = check

    def kinds(self) -> list[Kind]:
        return list(self._kinds.values())

    def check(self, kind: Kind, obj: Snapshot) -> None:
        """Raises ValueError when the reader of ``kind`` cannot use ``obj``."""
        check = self._checks.get(kind)
        if check is not None:
            check(obj)

    def kind_of(self, api_version: object, kind: object) -> Kind | None:
        """The declared kind a document's apiVersion and kind name, if any (and its version is
        one the kind's readers understand)."""
        if not isinstance(api_version, str) or not isinstance(kind, str):
            return None
        group, _, version = api_version.rpartition("/")
        found = self._kinds.get((group, kind))
        return found if found is not None and version in found.versions else None

    def accepted(self) -> list[str]:
        """``group/version Kind`` of every accepted document kind, for error messages."""
        return sorted(f"{k.group + '/' if k.group else ''}{v} {k.kind}" for k in self._kinds.values()
                      for v in k.versions)

    def replace(self, kind: Kind, objects: list[Snapshot]) -> None:
        """Every object of ``kind`` the manifests hold now (a scan's result)."""
        self._objects[kind] = [_defaulted(o) for o in objects] if kind.namespaced else list(objects)
        for scope, view in self._views.items():
            if scope.kind == kind:
                view.replace([o for o in self._objects[kind] if matches(scope, o)])

    # --- the store's interface ---------------------------------------------------------------

    def view(self, kind: Kind, *, namespace: str | None = None, fields: Mapping[str, str] | None = None,
             labels: Mapping[str, str] | None = None) -> View:
        self.declare(kind)
        scope = Scope(kind, namespace if kind.namespaced else None, tuple(sorted((fields or {}).items())),
                      tuple(sorted((labels or {}).items())))
        view = self._views.get(scope)
        if view is None:
            view = self._views[scope] = View(scope)
            view.replace([o for o in self._objects.get(kind, []) if matches(scope, o)])
        view.users += 1
        return view

    def release(self, view: View) -> None:
        view.users -= 1
        if view.users <= 0:
            self._views.pop(view.scope, None)

    async def get(self, kind: Kind, name: str, namespace: str | None = None, *,
                  max_age: float | None = None) -> Snapshot | None:
        await anyio.lowlevel.checkpoint()
        for obj in self._objects.get(kind, []):
            meta = obj.get("metadata") or {}
            if meta.get("name") == name and (not kind.namespaced or meta.get("namespace") == (namespace or "default")):
                return obj
        return None

    def forget(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        return None

    async def create(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None, *,
                     name: str | None = None, subresource: str | None = None) -> Snapshot:
        raise ObjectError(f"standalone: no API server to create {kind} in", None)

    async def update(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None, *,
                     subresource: str | None = None) -> Snapshot:
        raise ObjectError(f"standalone: no API server to update {kind} in", None)

    async def patch(self, kind: Kind, name: str, patch: Mapping[str, Any], namespace: str | None = None, *,
                    subresource: str | None = None, merge: str = "merge") -> Snapshot:
        raise ObjectError(f"standalone: no API server to patch {kind} {name} in", None)

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        raise ObjectError(f"standalone: no API server to delete {kind} {name} from", None)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await anyio.sleep_forever()


def _defaulted(obj: Snapshot) -> Snapshot:
    meta = obj.get("metadata") or {}
    if meta.get("namespace"):
        return obj
    return {**obj, "metadata": {**meta, "namespace": "default"}}


__all__ = ["FileObjects", "MANIFEST_KINDS", "matches"]
