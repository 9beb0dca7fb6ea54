"""A watch-fed view of gang members across nodes (cluster mode).

The coordinator needs every member's vote and fate, and every member's agent needs the
coordinator's record, wherever those pods run. The view lists and then watches the pods of each
namespace in which this node runs a gang member (started on demand, the first time a member of
that namespace is reserved), keeps the ones that declare a gang (:func:`classify`), and calls
``on_change`` with the gangs whose pods changed. The watch resumes from the last resourceVersion;
when that is too old (410) the namespace is listed again and the difference becomes changes.

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

import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from lightkube.resources.core_v1 import Pod as ApiPod
from pydantic import ValidationError

from nodeagent import labels as L
from nodeagent.cluster.apicalls import describe, is_gone
from nodeagent.model import Pod
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

BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0
WATCH_TIMEOUT_SECONDS = 300

_LABELS = (COSCHEDULING_LABEL, COSCHEDULING_LEGACY_LABEL, KUEUE_LABEL)
_ANNOTATIONS = (*VOLCANO_ANNOTATIONS, KAI_ANNOTATION, KOORDINATOR_NAME, NAME)

OnChange = Callable[[set[GangKey]], Awaitable[None]]


def classify(obj: Mapping[str, Any], catalog: GroupCatalog) -> GangKey | None:
    """The gang an API pod declares, or None (no gang, a mirror pod, an unusable declaration)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    if L.CONFIG_MIRROR in annotations:
        return None  # a static pod's copy: its gang is decided on its node alone
    if not (any(k in labels for k in _LABELS) or any(k in annotations for k in _ANNOTATIONS)
            or spec.get("schedulingGroup") or spec.get("workloadRef")):
        return None
    try:
        decl = declaration_of(Pod.model_validate(obj), catalog)
    except (ValidationError, DeclarationError):
        return None
    return decl.key if decl is not None else None


@dataclass
class _Namespace:
    name: str
    synced: bool = False
    resource_version: str | None = None
    error: str = ""
    uids: set[str] = field(default_factory=set)


class ClusterView:
    def __init__(self, api: Any, catalog: GroupCatalog, on_change: OnChange | None = None) -> None:
        self._api = api
        self._catalog = catalog
        self.on_change = on_change
        self._namespaces: dict[str, _Namespace] = {}
        self._pods: dict[GangKey, dict[str, PodInfo]] = {}
        self._key_of: dict[str, GangKey] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.events = 0

    # --- reading ---------------------------------------------------------------------------

    def pods(self, key: GangKey) -> list[PodInfo]:
        return list(self._pods.get(key, {}).values())

    def synced(self, namespace: str) -> bool:
        ns = self._namespaces.get(namespace)
        return ns is not None and ns.synced

    def error(self, namespace: str) -> str:
        ns = self._namespaces.get(namespace)
        return ns.error if ns is not None else ""

    def namespaces(self) -> list[str]:
        return sorted(self._namespaces)

    # --- the watches -----------------------------------------------------------------------

    def watch(self, namespace: str) -> None:
        """Start watching ``namespace`` (idempotent; from any task of the agent's event loop)."""
        if namespace in self._namespaces:
            return
        self._namespaces[namespace] = _Namespace(namespace)
        if self._tg is not None:
            self._tg.start_soon(self._run_namespace, namespace, name=f"gang-view:{namespace}")

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for namespace in list(self._namespaces):
                tg.start_soon(self._run_namespace, namespace, name=f"gang-view:{namespace}")
            task_status.started()
            await anyio.sleep_forever()

    async def _run_namespace(self, namespace: str) -> None:
        ns = self._namespaces[namespace]
        delay = BACKOFF_INITIAL_SECONDS
        while True:
            try:
                if ns.resource_version is None:
                    await self._list(ns)
                await self._watch(ns)
                delay = BACKOFF_INITIAL_SECONDS
            except Exception as exc:  # noqa: BLE001 - never fatal: logged, retried
                if is_gone(exc):
                    ns.resource_version = None  # too old: list again
                    continue
                ns.error = describe(exc)
                log.warning("watching gang members failed; retrying", namespace=namespace, error=ns.error,
                            retry_in=delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)

    async def _list(self, ns: _Namespace) -> None:
        listing = self._api.list(ApiPod, namespace=ns.name)
        objects = [obj.to_dict() async for obj in listing]
        ns.resource_version = listing.resourceVersion
        changed: set[GangKey] = set()
        present = {o["metadata"]["uid"] for o in objects}
        for uid in list(ns.uids - present):
            changed |= self._remove(ns, uid)
        for obj in objects:
            changed |= self._upsert(ns, obj)
        ns.synced, ns.error = True, ""
        log.info("watching gang members", namespace=ns.name, pods=len(ns.uids))
        # Every gang of the namespace: its members may have waited for this first listing.
        await self._changed(changed | {self._key_of[uid] for uid in ns.uids})

    async def _watch(self, ns: _Namespace) -> None:
        watch = self._api.watch(ApiPod, namespace=ns.name, resource_version=ns.resource_version,
                                server_timeout=WATCH_TIMEOUT_SECONDS + random.randint(0, WATCH_TIMEOUT_SECONDS))
        async for kind, obj in watch:
            ns.error = ""
            if kind == "BOOKMARK":
                ns.resource_version = obj.metadata.resourceVersion
                continue
            pod = obj.to_dict()
            changed = self._remove(ns, pod["metadata"]["uid"]) if kind == "DELETED" else self._upsert(ns, pod)
            ns.resource_version = obj.metadata.resourceVersion
            await self._changed(changed)

    # --- the cache (also fed directly by unit tests) -----------------------------------------

    async def apply(self, namespace: str, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """Feed one pod as a watch would (for tests), marking the namespace synced."""
        ns = self._namespaces.setdefault(namespace, _Namespace(namespace))
        ns.synced = True
        changed = self._remove(ns, pod["metadata"]["uid"]) if deleted else self._upsert(ns, pod)
        await self._changed(changed)

    def _upsert(self, ns: _Namespace, obj: Mapping[str, Any]) -> set[GangKey]:
        uid = obj["metadata"]["uid"]
        key = classify(obj, self._catalog)
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
