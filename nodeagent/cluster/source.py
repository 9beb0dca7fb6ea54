"""The API pod source: the pods the scheduler bound to this node, as wanted-pod facts.

It lists and then watches pods with ``fieldSelector=spec.nodeName=<node>`` in every namespace,
and publishes the same facts as the static source: ``PodSpecObserved`` (origin ``api``) when a
pod appears or its metadata or spec change (status-only changes, most of them our own writes,
are not news; the conditions its readiness gates name are), and ``PodDeletionRequested`` when a
deletion is requested (deletionTimestamp, with metadata.deletionGracePeriodSeconds; again if a
later request shortens the grace) or when the object disappears. The watch resumes from the last
resourceVersion seen; when that is too old (410 Gone) the source lists again and turns the
difference into facts. When the API server goes away the source backs off and keeps trying; the
pods it already knows keep running.

Mirror pods (the API's copies of our static pods) come through the same watch; they are handed
to the mirror manager, never run. A pod the API already shows as finished (Succeeded/Failed)
when this source first sees it is not run again (a pod that terminated never restarts); if it is
being deleted, the status sink deletes it once the runtime shows nothing of it running.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import structlog
from lightkube import ALL_NS
from lightkube.resources.core_v1 import Pod as ApiPodResource
from pydantic import ValidationError

from nodeagent import events as ev
from nodeagent import labels as L
from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster.apicalls import describe, is_gone
from nodeagent.model import Pod

log = structlog.get_logger("nodeagent.cluster.source")

BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0
"""Short: one request per attempt is cheap, and the node must catch up soon after the API
server returns (its pods' deletions, new pods)."""
WATCH_TIMEOUT_SECONDS = 300
"""The server ends each watch after 5–10 minutes (jittered, as client-go's reflector), so a
connection that died silently is noticed."""
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_NOT_SPEC = ("resourceVersion", "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")


class MirrorObserver(Protocol):
    """Where mirror pods seen in the API go (nodeagent.cluster.mirror.MirrorPods)."""

    def mirrors_listed(self, pods: list[dict[str, Any]]) -> None:
        """The complete set of mirror pods bound to the node (after a list)."""

    def mirror_seen(self, pod: dict[str, Any]) -> None: ...

    def mirror_gone(self, pod: dict[str, Any]) -> None: ...


@dataclass
class ApiPod:
    """What the source knows of one (non-mirror) pod bound to the node."""

    ref: ev.PodRef
    obj: dict[str, Any]
    """The latest object from the API, camelCase."""
    fingerprint: str
    published: bool = False
    """A PodSpecObserved went out in this run: a worker runs (or ran) it."""
    deletion_grace: int | None = None
    deletion_requested: bool = False

    @property
    def status(self) -> Mapping[str, Any]:
        return self.obj.get("status") or {}


def is_mirror(pod: Mapping[str, Any]) -> bool:
    return L.CONFIG_MIRROR in ((pod.get("metadata") or {}).get("annotations") or {})


def _fingerprint(pod: Mapping[str, Any]) -> str:
    """What makes a change news: metadata and spec, and the conditions the pod's readiness gates
    name (another writer sets them; Ready follows them, as the kubelet's reconcile does)."""
    meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k not in _NOT_SPEC}
    spec = pod.get("spec") or {}
    gated = {g.get("conditionType") for g in spec.get("readinessGates") or []}
    gates = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []
             if c.get("type") in gated}
    return json.dumps({"metadata": meta, "spec": spec, "gates": gates}, sort_keys=True, default=str)


def _ref(pod: Mapping[str, Any]) -> ev.PodRef:
    meta = pod["metadata"]
    return ev.PodRef(uid=meta["uid"], name=meta.get("name", ""), namespace=meta.get("namespace", "default"))


class ApiPodSource:
    def __init__(self, api: Any, node_name: str, publish: Callable[[ev.Event], Awaitable[None]], *,
                 mirrors: MirrorObserver | None = None,
                 on_finished_deletion: Callable[[ev.PodRef], None] | None = None,
                 clock: Clock | None = None) -> None:
        self._api = api
        self._node = node_name
        self._publish = publish
        self._mirrors = mirrors
        self._on_finished_deletion = on_finished_deletion
        self._clock = clock or SystemClock()
        self._pods: dict[str, ApiPod] = {}
        self.resource_version: str | None = None
        self.connected = False
        """False from a failed list or watch until the next listing or watch event (for tests)."""
        self.listed = False
        """The first listing has been published (the runtime replay may trust wanted())."""

    # --- reading ------------------------------------------------------------------------

    def wanted(self) -> set[str]:
        """UIDs this source asked the agent to run (the runtime replay keeps them)."""
        return {uid for uid, p in self._pods.items() if p.published}

    def pod(self, uid: str) -> ApiPod | None:
        return self._pods.get(uid)

    # --- the loop ----------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """List (retrying until the API answers), publish, report started, then watch."""
        await self._list_until_done()
        self.listed = True
        task_status.started()
        delay = BACKOFF_INITIAL_SECONDS
        while True:
            try:
                await self._watch()
                delay = BACKOFF_INITIAL_SECONDS  # the server closed a healthy watch: resume
            except Exception as exc:  # noqa: BLE001 - transport errors, 5xx, 410: never fatal for the node
                self.connected = False
                if is_gone(exc):
                    log.info("watch expired; listing pods again", resource_version=self.resource_version)
                    await self._list_until_done()
                    delay = BACKOFF_INITIAL_SECONDS
                    continue
                log.warning("pod watch failed; retrying", error=describe(exc), retry_in=delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)

    async def _list_until_done(self) -> None:
        delay = BACKOFF_INITIAL_SECONDS
        while True:
            try:
                await self._list()
                self.connected = True
                return
            except Exception as exc:  # noqa: BLE001 - never fatal: logged and retried
                self.connected = False
                log.warning("listing the node's pods failed; retrying", error=describe(exc), retry_in=delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)

    async def _list(self) -> None:
        listing = self._api.list(ApiPodResource, namespace=ALL_NS, fields={"spec.nodeName": self._node})
        objects = [obj.to_dict() async for obj in listing]
        # Known once the first chunk arrived, even an empty one: the watch starts there.
        self.resource_version = listing.resourceVersion
        mirrors = [p for p in objects if is_mirror(p)]
        pods = [p for p in objects if not is_mirror(p)]
        if self._mirrors is not None:
            self._mirrors.mirrors_listed(mirrors)
        present = {p["metadata"]["uid"] for p in pods}
        for uid in [u for u in self._pods if u not in present]:
            await self._deleted(self._pods[uid].obj)  # deleted while we were not watching
        for pod in pods:
            await self._changed(pod)

    async def _watch(self) -> None:
        watch = self._api.watch(ApiPodResource, namespace=ALL_NS, fields={"spec.nodeName": self._node},
                                resource_version=self.resource_version,
                                server_timeout=WATCH_TIMEOUT_SECONDS + random.randint(0, WATCH_TIMEOUT_SECONDS))
        async for kind, obj in watch:
            self.connected = True
            if kind == "BOOKMARK":
                self.resource_version = obj.metadata.resourceVersion
                continue
            pod = obj.to_dict()
            if kind == "DELETED":
                await self._deleted(pod)
            else:
                await self._changed(pod)
            self.resource_version = obj.metadata.resourceVersion

    # --- turning objects into facts -----------------------------------------------------

    async def _changed(self, pod: dict[str, Any]) -> None:
        if is_mirror(pod):
            if self._mirrors is not None:
                self._mirrors.mirror_seen(pod)
            return
        ref = _ref(pod)
        fingerprint = _fingerprint(pod)
        record = self._pods.get(ref.uid)
        if record is None:
            record = self._pods[ref.uid] = ApiPod(ref=ref, obj=pod, fingerprint=fingerprint)
            phase = (pod.get("status") or {}).get("phase")
            if phase in TERMINAL_PHASES:
                log.info("pod already finished; not running it again", pod=str(ref), phase=phase)
            elif self._valid(ref, pod):
                await self._observed(record)
        else:
            record.obj = pod
            if record.published and fingerprint != record.fingerprint:
                record.fingerprint = fingerprint
                await self._observed(record)
        await self._deletion(record)

    async def _observed(self, record: ApiPod) -> None:
        record.published = True
        await self._publish(ev.PodSpecObserved(source="sources", pod=record.ref, origin="api", pod_spec=record.obj))

    async def _deletion(self, record: ApiPod) -> None:
        meta = record.obj["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        grace = meta.get("deletionGracePeriodSeconds")
        if record.deletion_requested and (grace is None or (record.deletion_grace is not None
                                                            and grace >= record.deletion_grace)):
            return  # nothing new: a later request may only shorten the grace
        record.deletion_requested = True
        record.deletion_grace = grace
        if record.published:
            await self._publish(ev.PodDeletionRequested(source="sources", pod=record.ref, origin="api",
                                                        grace_period_seconds=grace))
        elif self._on_finished_deletion is not None:
            self._on_finished_deletion(record.ref)

    async def _deleted(self, pod: dict[str, Any]) -> None:
        if is_mirror(pod):
            if self._mirrors is not None:
                self._mirrors.mirror_gone(pod)
            return
        record = self._pods.pop(pod["metadata"]["uid"], None)
        if record is None or not record.published or record.deletion_requested:
            return
        # Gone without a graceful request we saw (a forced delete, or while we were away).
        await self._publish(ev.PodDeletionRequested(source="sources", pod=record.ref, origin="api",
                                                    grace_period_seconds=pod["metadata"].get(
                                                        "deletionGracePeriodSeconds")))

    def _valid(self, ref: ev.PodRef, pod: dict[str, Any]) -> bool:
        try:
            Pod.model_validate(pod)
        except ValidationError as exc:
            details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            log.error("pod from the API cannot be run", pod=str(ref), error=details)
            return False
        return True
