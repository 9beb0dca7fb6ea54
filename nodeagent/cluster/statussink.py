"""The API status sink: the single status writer's line to the API server.

``write`` and ``forget`` only record what is wanted and return at once, so neither the status
writer nor a pod worker ever waits on the network; one task sends, at the kubelet's client-side
rate (kubeAPIQPS / kubeAPIBurst), retrying with back-off while the API server is away:

* pod status goes as a strategic merge patch to the ``status`` subresource, only when it differs
  from what we last wrote (or, after a restart, from the API's copy), with the pod's UID in the
  patch as a precondition (a re-created pod with the same name is never written); conditions
  are patched by type, so other writers' conditions (readiness gates) are never overwritten;
* a static pod's status goes to its mirror pod;
* ``forget`` (a worker is done: every container has stopped and the pod is torn down) of a pod
  whose deletion was requested through the API deletes the object with grace 0 and a UID
  precondition, the kubelet's final step of graceful deletion. A pod the API showed finished
  before this agent ran it is deleted the same way once the runtime shows nothing of it running.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import structlog
from lightkube.resources.core_v1 import Pod as ApiPodResource
from lightkube.types import PatchType

from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster.apicalls import delete_pod, describe, is_refused
from nodeagent.cluster.mergepatch import api_status, status_patch
from nodeagent.cluster.ratelimit import TokenBucket
from nodeagent.cluster.source import ApiPodSource
from nodeagent.events import PodRef

log = structlog.get_logger("nodeagent.cluster.status")

RESYNC_SECONDS = 5.0
"""Pending work (a mirror that appeared, a pod whose containers have stopped) is looked at
again this often even without news."""
BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0


@dataclass(frozen=True)
class Target:
    """The API object a pod's status goes to."""

    namespace: str
    name: str
    uid: str
    status: Mapping[str, Any]
    """Its status as the API last showed it."""


class MirrorLookup(Protocol):
    def is_static(self, uid: str) -> bool: ...

    def mirror_of(self, uid: str) -> Target | None:
        """The mirror pod of static pod ``uid``, once it exists."""


class ApiStatusSink:
    def __init__(self, api: Any, source: ApiPodSource, mirrors: MirrorLookup | None, limiter: TokenBucket,
                 is_stopped: Callable[[str], bool], clock: Clock | None = None) -> None:
        self._api = api
        self._source = source
        self._mirrors = mirrors
        self._limiter = limiter
        self._is_stopped = is_stopped
        self._clock = clock or SystemClock()
        self._pending: dict[str, tuple[PodRef, dict[str, Any]]] = {}
        self._forgotten: dict[str, tuple[PodRef, bool]] = {}
        """UID → (pod, whether to check the runtime before deleting it)."""
        self._written: dict[str, dict[str, Any]] = {}
        """Target UID → the status we last wrote there."""
        self._wake = anyio.Event()
        self.patches = 0
        self.deletions = 0

    # --- the StatusSink protocol (never blocks) -------------------------------------------

    async def write(self, ref: PodRef, status: Mapping[str, Any]) -> None:
        self._pending[ref.uid] = (ref, dict(status))
        self._wake.set()

    async def forget(self, ref: PodRef) -> None:
        """The worker is done: it tore the pod down, so no container of it runs."""
        self._forgotten[ref.uid] = (ref, False)
        self._wake.set()

    def delete_when_stopped(self, ref: PodRef) -> None:
        """(The source) a finished pod no worker runs is being deleted: delete it once the
        runtime shows nothing of it running (an orphan teardown may still be stopping it)."""
        self._forgotten[ref.uid] = (ref, True)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def idle(self) -> bool:
        return not self._pending and not self._forgotten

    # --- the sender -------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        delay = BACKOFF_INITIAL_SECONDS
        while True:
            with anyio.move_on_after(RESYNC_SECONDS):
                await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self.sync()
                delay = BACKOFF_INITIAL_SECONDS
            except Exception as exc:  # noqa: BLE001 - the API server is away or failing: keep everything, retry
                log.warning("writing to the API failed; retrying", error=describe(exc), retry_in=delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)
                self._wake.set()

    async def sync(self) -> None:
        """Send what is pending; raises on an API error that may go away (work is kept)."""
        for uid, item in list(self._pending.items()):
            target = self._target(uid)
            if target is None:
                if not (self._mirrors is not None and self._mirrors.is_static(uid)):
                    self._drop_pending(uid, item)  # not a pod the API knows (an orphan)
                continue  # a static pod whose mirror is not there yet: wait for it
            await self._patch(item[0], item[1], target)
            self._drop_pending(uid, item)
        for uid, (ref, check_runtime) in list(self._forgotten.items()):
            if uid in self._pending and self._target(uid) is not None:
                continue  # its last status goes first
            if await self._finish(ref, check_runtime):
                self._forgotten.pop(uid, None)
                self._pending.pop(uid, None)

    def _drop_pending(self, uid: str, item: tuple[PodRef, dict[str, Any]]) -> None:
        if self._pending.get(uid) is item:  # a newer write may have come in while we sent
            del self._pending[uid]

    def _target(self, uid: str) -> Target | None:
        record = self._source.pod(uid)
        if record is not None:
            if not record.published:
                return None  # a pod we do not run: its status is not ours to write
            meta = record.obj["metadata"]
            return Target(meta.get("namespace", "default"), meta["name"], uid, record.status)
        if self._mirrors is not None:
            return self._mirrors.mirror_of(uid)
        return None

    async def _patch(self, ref: PodRef, computed: dict[str, Any], target: Target) -> None:
        previous = self._written.get(target.uid)
        status = api_status(computed, previous, target.status)
        # First write in this run: compare with the API's copy, and leave alone the keys we
        # do not produce (they may be another writer's, e.g. nominatedNodeName).
        patch = status_patch(previous if previous is not None else target.status, status,
                             first=previous is None)
        if not patch:
            self._written[target.uid] = status
            return
        await self._limiter.acquire()
        try:
            await self._api.patch(ApiPodResource.Status, target.name,
                                  {"metadata": {"uid": target.uid}, "status": patch},
                                  namespace=target.namespace, patch_type=PatchType.STRATEGIC)
        except Exception as exc:
            if is_refused(exc):
                # Gone (404), re-created under the same name (409: the UID precondition failed),
                # or this status refused (422, e.g. leaving a terminal phase; 403): asking again
                # would not help, and must not hold up the other pods' writes.
                log.info("pod status not written", pod=str(ref), error=describe(exc))
                self._written.pop(target.uid, None)
                return
            raise
        self.patches += 1
        self._written[target.uid] = status

    async def _finish(self, ref: PodRef, check_runtime: bool) -> bool:
        """Delete the object of a torn-down pod whose deletion was requested; True when done."""
        record = self._source.pod(ref.uid)
        if record is None or not record.deletion_requested:
            # Gone already, not an API pod (static, orphan), or not being deleted.
            self._written.pop(ref.uid, None)
            return True
        if check_runtime and not self._is_stopped(ref.uid):
            return False  # a container still runs: never delete before it stopped
        meta = record.obj["metadata"]
        await self._limiter.acquire()
        try:
            await delete_pod(self._api, meta.get("namespace", "default"), meta["name"], ref.uid, 0)
        except Exception as exc:
            if not is_refused(exc):
                raise
            # 404: gone already; 409: a new pod holds the name (UID precondition); 403: not ours.
            log.info("pod not deleted", pod=str(ref), error=describe(exc))
            self._written.pop(ref.uid, None)
            return True
        self.deletions += 1
        log.info("pod deleted from the API", pod=str(ref))
        self._written.pop(ref.uid, None)
        return True
