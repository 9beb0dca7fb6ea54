"""Mirror pods: the API's read-only copies of this node's static pods (kubelet.md §6).

For every static pod the node runs, a pod with the same name, namespace, labels and spec exists
in the API, annotated ``kubernetes.io/config.mirror`` = the static pod's config hash and owned
(controller) by the Node, so that `kubectl get pods` shows it and its status. A mirror with a
stale hash or one being deleted is deleted (grace 0, UID precondition) and created again; a
mirror whose static pod is gone is deleted. Mirrors are matched to static pods by full name, as
the kubelet does.

Inputs: the static source's facts (bus subscriber ``mirrors``) say which static pods are
wanted; the API pod source hands over the mirror pods it lists and watches. Stale mirrors are
only deleted once the agent has replayed (every static pod of the directory has been seen), so
a restart never deletes and re-creates mirrors that are still wanted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from lightkube.resources.core_v1 import Pod as ApiPodResource

from nodeagent import events as ev
from nodeagent import labels as L
from nodeagent.bus import Inbox
from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster.apicalls import (
    delete_pod,
    describe,
    is_conflict,
    is_not_found,
    is_refused,
)
from nodeagent.cluster.ratelimit import TokenBucket
from nodeagent.cluster.statussink import Target

log = structlog.get_logger("nodeagent.cluster.mirror")

RESYNC_SECONDS = 10.0
BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0


def full_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('name', '')}_{meta.get('namespace') or 'default'}"


def mirror_manifest(static: Mapping[str, Any], node_name: str, node_uid: str) -> dict[str, Any]:
    """The mirror of a static pod (as the static source built it)."""
    meta = static["metadata"]
    annotations = dict(meta.get("annotations") or {})
    annotations[L.CONFIG_MIRROR] = annotations.get(L.CONFIG_HASH) or meta["uid"]
    metadata: dict[str, Any] = {
        "name": meta["name"],
        "namespace": meta.get("namespace") or "default",
        "annotations": annotations,
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
                             "controller": True}],
    }
    if meta.get("labels"):
        metadata["labels"] = dict(meta["labels"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": dict(static["spec"])}


@dataclass
class _Static:
    uid: str
    pod: dict[str, Any]


class MirrorPods:
    def __init__(self, api: Any, node_name: str, limiter: TokenBucket, node_uid: Callable[[], str | None],
                 clock: Clock | None = None, on_mirror_changed: Callable[[], None] | None = None) -> None:
        self._api = api
        self._node = node_name
        self._limiter = limiter
        self._node_uid = node_uid
        self._clock = clock or SystemClock()
        self._on_mirror_changed = on_mirror_changed
        self._wanted: dict[str, _Static] = {}  # full name → static pod
        self._static_uids: dict[str, str] = {}  # static uid → full name
        self._mirrors: dict[str, dict[str, Any]] = {}  # full name → mirror pod in the API
        self._refused: set[str] = set()
        """Static pods whose mirror the API refused (e.g. NodeRestriction: a static pod that
        names a Secret): not tried again until their manifest changes."""
        self._listed = False
        self._ready = False
        self._inbox: Inbox | None = None
        self._wake = anyio.Event()

    # --- for the status sink (MirrorLookup) ------------------------------------------------

    def is_static(self, uid: str) -> bool:
        return uid in self._static_uids

    def mirror_of(self, uid: str) -> Target | None:
        name = self._static_uids.get(uid)
        mirror = self._mirrors.get(name) if name else None
        if mirror is None or not self._matches(mirror, uid):
            return None
        meta = mirror["metadata"]
        return Target(meta.get("namespace") or "default", meta["name"], meta["uid"], mirror.get("status") or {})

    # --- from the API pod source (MirrorObserver) ------------------------------------------

    def mirrors_listed(self, pods: list[dict[str, Any]]) -> None:
        self._mirrors = {full_name(p): p for p in pods}
        self._listed = True
        self._changed()

    def mirror_seen(self, pod: dict[str, Any]) -> None:
        self._mirrors[full_name(pod)] = pod
        self._changed()

    def mirror_gone(self, pod: dict[str, Any]) -> None:
        name = full_name(pod)
        current = self._mirrors.get(name)
        if current is not None and current["metadata"].get("uid") == pod["metadata"].get("uid"):
            del self._mirrors[name]
        self._changed()

    def set_ready(self) -> None:
        """The agent has replayed: a mirror whose static pod is not wanted now is stale."""
        self._ready = True
        self._wake.set()

    def _changed(self) -> None:
        self._wake.set()
        if self._on_mirror_changed is not None:
            self._on_mirror_changed()

    # --- from the bus ---------------------------------------------------------------------

    def apply(self, event: ev.Event) -> None:
        """Record a static pod appearing or going away (never blocks)."""
        if isinstance(event, ev.PodSpecObserved) and event.origin == "file":
            name = full_name(event.pod_spec)
            previous = self._wanted.get(name)
            if previous is not None:
                self._static_uids.pop(previous.uid, None)
            self._wanted[name] = _Static(event.pod.uid, event.pod_spec)
            self._static_uids[event.pod.uid] = name
        elif isinstance(event, ev.PodDeletionRequested) and event.origin == "file":
            gone = self._static_uids.pop(event.pod.uid, None)
            if gone is not None and self._wanted.get(gone, _Static("", {})).uid == event.pod.uid:
                del self._wanted[gone]
        else:
            return
        self._wake.set()

    async def run(self, inbox: Inbox, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._inbox = inbox
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._consume, inbox)
            task_status.started()
            await self._reconcile_forever()

    async def _consume(self, inbox: Inbox) -> None:
        # Receive and apply with no await in between: an empty buffer means every fact
        # published so far has been applied (the orphan check relies on it).
        async with inbox:
            async for event in inbox:
                self.apply(event)

    async def _reconcile_forever(self) -> None:
        delay = BACKOFF_INITIAL_SECONDS
        while True:
            with anyio.move_on_after(RESYNC_SECONDS):
                await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self.reconcile()
                delay = BACKOFF_INITIAL_SECONDS
            except Exception as exc:  # noqa: BLE001 - never fatal: logged and retried
                log.warning("mirror pods not reconciled; retrying", error=describe(exc), retry_in=delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)
                self._wake.set()

    # --- reconciling ------------------------------------------------------------------

    @staticmethod
    def _matches(mirror: Mapping[str, Any], uid: str) -> bool:
        meta = mirror.get("metadata") or {}
        return (meta.get("annotations") or {}).get(L.CONFIG_MIRROR) == uid and not meta.get("deletionTimestamp")

    def _settled(self) -> bool:
        """Every fact published so far has been applied and the agent has replayed."""
        inbox = self._inbox
        return self._ready and (inbox is None or inbox.statistics().current_buffer_used == 0)

    async def reconcile(self) -> None:
        node_uid = self._node_uid()
        if node_uid is None or not self._listed:
            return  # the Node is not registered yet, or we do not know which mirrors exist
        for name, static in list(self._wanted.items()):
            mirror = self._mirrors.get(name)
            if mirror is not None and self._matches(mirror, static.uid):
                continue
            if mirror is not None:
                await self._delete(mirror, "stale" if not mirror["metadata"].get("deletionTimestamp") else "deleted")
            if self._wanted.get(name) is static and static.uid not in self._refused:
                await self._create(static, node_uid)
        if self._settled():
            for name, mirror in list(self._mirrors.items()):
                if name not in self._wanted:
                    await self._delete(mirror, "orphaned")

    async def _delete(self, mirror: dict[str, Any], why: str) -> None:
        meta = mirror["metadata"]
        await self._limiter.acquire()
        try:
            await delete_pod(self._api, meta.get("namespace") or "default", meta["name"], meta["uid"], 0)
        except Exception as exc:
            if not (is_not_found(exc) or is_conflict(exc)):
                raise
        log.info("mirror pod deleted", pod=f"{meta.get('namespace')}/{meta['name']}", why=why)
        name = full_name(mirror)
        if self._mirrors.get(name) is mirror:
            del self._mirrors[name]

    async def _create(self, static: _Static, node_uid: str) -> None:
        manifest = mirror_manifest(static.pod, self._node, node_uid)
        meta = manifest["metadata"]
        await self._limiter.acquire()
        try:
            created = await self._api.create(ApiPodResource.from_dict(manifest))
        except Exception as exc:
            if is_refused(exc) and not is_conflict(exc):
                log.error("the API refused the mirror pod", pod=f"{meta['namespace']}/{meta['name']}",
                          error=describe(exc))
                self._refused.add(static.uid)
                return
            if not is_conflict(exc):
                raise
            # One exists that we had not seen yet (the watch lags): look at it next round.
            existing = (await self._api.get(ApiPodResource, meta["name"], namespace=meta["namespace"])).to_dict()
            if L.CONFIG_MIRROR not in (existing["metadata"].get("annotations") or {}):
                # An ordinary pod holds the name: never touch it (the kubelet neither).
                log.error("a pod that is not a mirror has the static pod's name; no mirror created",
                          pod=f"{meta['namespace']}/{meta['name']}")
                return
            self._mirrors[full_name(manifest)] = existing
            self._wake.set()
            return
        log.info("mirror pod created", pod=f"{meta['namespace']}/{meta['name']}", static_uid=static.uid)
        self._mirrors[full_name(manifest)] = created.to_dict()
        if self._on_mirror_changed is not None:
            self._on_mirror_changed()
