"""A watch-fed view of gang members across nodes (cluster mode).

The coordinator needs every member's vote and fate, and every member's agent needs the
coordinator's record, wherever those pods run. The view asks the object store for the pods of
each namespace in which this node runs a gang member (on demand, the first time a member of
that namespace is reserved: the store lists and watches them, resumes, relists on 410), keeps
the ones that declare a gang (:class:`Classifier`), and calls ``on_change`` with the gangs whose
pods changed.

Reading other nodes' pods is not allowed by the Node authorizer: a node may list and watch only
the pods bound to it (``fieldSelector=spec.nodeName=<node>``, enforced since
AuthorizeNodeWithSelectors). The ClusterRole in plugins/gang/deploy/rbac.yaml grants the group
system:nodes get/list/watch on pods (read only; writes stay under NodeRestriction). Without it the
view reports the 403 in ``error(namespace)``, never syncs, and gangs in that namespace end by
their members' vote expiry — nothing starts.

Why a namespace watch and not a selector per gang: half of the declarations are annotations or
spec fields (Volcano, KAI, Koordinator, ours, schedulingGroup, workloadRef), which no selector
can match; a gang never spans namespaces.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from pydantic import ValidationError

from nodeagent import labels as L
from nodeagent.model import Pod
from nodeagent.objects import DELETED, View, kinds
from plugins.gang.catalog import GroupCatalog
from plugins.gang.coordinator import PodInfo, pod_info
from plugins.gang.declaration import (
    COSCHEDULING_LABEL,
    COSCHEDULING_LEGACY_LABEL,
    KAI_ANNOTATION,
    KOORDINATOR_NAME,
    KUEUE_LABEL,
    NAME,
    VOLCANO_ANNOTATIONS,
    DeclarationError,
    GangKey,
    declaration_of,
)

log = structlog.get_logger("nodeagent.gang")

_LABELS = (COSCHEDULING_LABEL, COSCHEDULING_LEGACY_LABEL, KUEUE_LABEL)
_ANNOTATIONS = (*VOLCANO_ANNOTATIONS, KAI_ANNOTATION, KOORDINATOR_NAME, NAME)

OnChange = Callable[[set[GangKey]], Awaitable[None]]


class Classifier:
    """The gang an API pod declares, or None (no gang, a mirror pod, an unusable declaration).

    A declaration is read from a pod's labels, annotations, schedulingGroup and workloadRef
    (and the group objects in the catalog, read again at each call). Every status write of a
    member reaches every agent watching its namespace, so the Pod model a declaration is read
    from is kept per uid and built again only when one of those fields changed: validating the
    whole pod at each event cost more than the rest of the view's work together."""

    def __init__(self, catalog: GroupCatalog) -> None:
        self._catalog = catalog
        self._parsed: dict[str, tuple[tuple[Any, ...], Pod]] = {}

    def __call__(self, obj: Mapping[str, Any]) -> GangKey | None:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        spec = obj.get("spec") or {}
        if L.CONFIG_MIRROR in annotations:
            return None  # a static pod's copy: its gang is decided on its node alone
        if not (any(k in labels for k in _LABELS) or any(k in annotations for k in _ANNOTATIONS)
                or spec.get("schedulingGroup") or spec.get("workloadRef")):
            return None
        uid = str(meta.get("uid") or "")
        read_from = (meta.get("namespace"), labels, annotations, spec.get("schedulingGroup"), spec.get("workloadRef"))
        cached = self._parsed.get(uid)
        if cached is not None and cached[0] == read_from:
            pod = cached[1]
        else:
            try:
                pod = Pod.model_validate(obj)
            except ValidationError:
                return None  # not kept: what failed may be a field the next event no longer has
            self._parsed[uid] = (read_from, pod)
        try:
            decl = declaration_of(pod, self._catalog)
        except DeclarationError:
            return None
        return decl.key if decl is not None else None

    def forget(self, uid: str) -> None:
        self._parsed.pop(uid, None)


@dataclass
class _Namespace:
    name: str
    view: View | None = None
    """The store's view of the namespace's pods (None in unit tests fed through ``apply``)."""
    fed: bool = False
    """Unit tests: ``apply`` marks the namespace synced."""
    uids: set[str] = field(default_factory=set)
    announced: bool = False
    """Its first listing has been handed on (every gang of the namespace, once)."""

    @property
    def synced(self) -> bool:
        return self.fed or (self.view is not None and self.view.synced)


class ClusterView:
    def __init__(self, objects: Any, catalog: GroupCatalog, on_change: OnChange | None = None) -> None:
        self._objects = objects
        self._classify = Classifier(catalog)
        self.on_change = on_change
        self._namespaces: dict[str, _Namespace] = {}
        self._pods: dict[GangKey, dict[str, PodInfo]] = {}
        self._key_of: dict[str, GangKey] = {}
        self._changed_keys: set[GangKey] = set()
        self._wake = anyio.Event()
        self.events = 0

    # --- reading ---------------------------------------------------------------------------

    def pods(self, key: GangKey) -> list[PodInfo]:
        return list(self._pods.get(key, {}).values())

    def synced(self, namespace: str) -> bool:
        ns = self._namespaces.get(namespace)
        return ns is not None and ns.synced

    def error(self, namespace: str) -> str:
        ns = self._namespaces.get(namespace)
        return ns.view.error if ns is not None and ns.view is not None else ""

    def namespaces(self) -> list[str]:
        return sorted(self._namespaces)

    # --- the watches -----------------------------------------------------------------------

    def watch(self, namespace: str) -> None:
        """Follow ``namespace``'s pods (idempotent; from any task of the agent's event loop)."""
        if namespace in self._namespaces:
            return
        ns = self._namespaces[namespace] = _Namespace(namespace)
        if self._objects is None:
            return
        ns.view = self._objects.view(kinds.POD, namespace=namespace)
        ns.view.on_change(lambda change, old, new: self._seen(ns, change, old, new))
        for obj in ns.view.items():  # what the shared view already holds
            self._note(self._upsert(ns, obj))
        if ns.view.synced:
            self._note({self._key_of[uid] for uid in ns.uids})

    def _seen(self, ns: _Namespace, change: str, old: Mapping[str, Any] | None,
              new: Mapping[str, Any] | None) -> None:
        first = ns.view is not None and ns.view.synced and not ns.announced
        if change == DELETED and old is not None:
            self._classify.forget(old["metadata"]["uid"])
            self._note(self._remove(ns, old["metadata"]["uid"]))
        elif new is not None:
            self._note(self._upsert(ns, new))
        if first:
            # Every gang of the namespace: its members may have waited for this first listing.
            ns.announced = True
            log.info("watching gang members", namespace=ns.name, pods=len(ns.uids))
            self._note({self._key_of[uid] for uid in ns.uids})

    def _note(self, keys: set[GangKey]) -> None:
        self.events += 1
        if keys:
            self._changed_keys |= keys
            self._wake.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hand the gangs whose pods changed to ``on_change``, in batches, as they come."""
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            keys, self._changed_keys = self._changed_keys, set()
            if keys and self.on_change is not None:
                await self.on_change(keys)

    # --- the cache (also fed directly by unit tests) -----------------------------------------

    async def apply(self, namespace: str, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """Feed one pod as a watch would (for tests), marking the namespace synced."""
        ns = self._namespaces.setdefault(namespace, _Namespace(namespace))
        ns.fed = True
        if deleted:
            self._classify.forget(pod["metadata"]["uid"])
        changed = self._remove(ns, pod["metadata"]["uid"]) if deleted else self._upsert(ns, pod)
        await self._changed(changed)

    def _upsert(self, ns: _Namespace, obj: Mapping[str, Any]) -> set[GangKey]:
        uid = obj["metadata"]["uid"]
        key = self._classify(obj)
        changed = self._remove(ns, uid) if self._key_of.get(uid) not in (None, key) else set()
        if key is None:
            return changed | self._remove(ns, uid)
        ns.uids.add(uid)
        self._key_of[uid] = key
        info = pod_info(obj)
        pods = self._pods.setdefault(key, {})
        if pods.get(uid) != info:
            pods[uid] = info
            changed.add(key)
        return changed

    def _remove(self, ns: _Namespace, uid: str) -> set[GangKey]:
        ns.uids.discard(uid)
        key = self._key_of.pop(uid, None)
        if key is None:
            return set()
        pods = self._pods.get(key, {})
        pods.pop(uid, None)
        if not pods:
            self._pods.pop(key, None)
        return {key}

    async def _changed(self, keys: set[GangKey]) -> None:
        self.events += 1
        if keys and self.on_change is not None:
            await self.on_change(keys)
