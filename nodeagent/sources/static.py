"""Static pods: manifests in a directory (the kubelet's staticPodPath), watched for changes.

Each regular file whose name does not start with a dot holds one or more YAML or JSON
documents. A pod's UID is derived from its content, the node name and the file path, as the
kubelet does, so an edited manifest is a new pod: the old one is torn down and the new one
started (never both at once; the dispatcher serialises pods with the same full name).

Deliberate difference from the kubelet: when a file that held a valid pod becomes invalid, the
kubelet drops the pod (and kills it); we keep the last valid version running and report the
error, because bad input must not lose a running pod.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from nodeagent import events as ev
from nodeagent.kube import runtimeclass
from nodeagent.objects.filestore import FileObjects
from nodeagent.objects.kinds import RUNTIME_CLASS
from nodeagent.sources.dirwatch import DirectoryWatch
from nodeagent.sources.manifest import MAX_MANIFEST_BYTES, ManifestError
from nodeagent.sources.staticpod import FileObject, parse_documents, parse_manifest, static_pod_uid

log = structlog.get_logger("nodeagent.sources.static")

__all__ = ["MAX_MANIFEST_BYTES", "ManifestError", "StaticPodSource", "parse_documents", "parse_manifest",
           "static_pod_uid"]

POLL_SECONDS = 0.25
"""A stat of each file, while the directory is not watched (no inotify, no directory yet)."""
WATCHED_POLL_SECONDS = 2.0
"""The same while inotify watches the directory: only the safety net for a change it cannot see
(a file on another mount inside the directory)."""
BURST_SETTLE_SECONDS = 0.005
"""After a change is reported, how long the rest of its burst (many manifests written at once)
is let in before the scan, so that one scan takes them all."""


@dataclass
class _FileState:
    signature: tuple[int, int, int]
    pods: list[dict[str, Any]]
    error: str = ""
    objects: list[FileObject] = field(default_factory=list)


@dataclass
class StaticPodSource:
    directory: Path
    node_name: str
    publish: Callable[[ev.Event], Awaitable[None]]
    full_rescan_seconds: float = 20.0
    poll_seconds: float = POLL_SECONDS
    watched_poll_seconds: float = WATCHED_POLL_SECONDS
    objects: FileObjects | None = None
    """Standalone: where the object documents of the directory go (ResourceClaims, RuntimeClasses,
    ... for the stages that read them); None in cluster mode, where objects come from the API."""
    _files: dict[Path, _FileState] = field(default_factory=dict)
    _wanted: dict[str, dict[str, Any]] = field(default_factory=dict)
    _refused: set[str] = field(default_factory=set)  # UIDs the RuntimeClass admission refused
    _list_failing: bool = False  # the directory could not be listed last time (reported once)
    listed: bool = False
    """A scan of the directory succeeded and was published (the runtime replay may trust
    wanted(); an unreadable directory at start must not make its pods orphans)."""
    _reconcile_pending: bool = False

    def wanted(self) -> set[str]:
        return set(self._wanted)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Scan, publish the initial set, report started, then keep watching: a scan when inotify
        reports a change in the directory, and every poll period (longer while watched)."""
        watch = DirectoryWatch(self.directory)
        try:
            watch.arm()  # before the first scan: a manifest written during it is not missed
            await self._scan_guarded(force=True)
            task_status.started()
            last_full = time.monotonic()
            while True:
                # A scan that failed is tried again at the poll period, watched or not.
                watched = watch.active and not self._reconcile_pending
                if await watch.wait(self.watched_poll_seconds if watched else self.poll_seconds):
                    await anyio.sleep(BURST_SETTLE_SECONDS)
                force = time.monotonic() - last_full >= self.full_rescan_seconds
                if force:
                    last_full = time.monotonic()
                await self._scan_guarded(force=force)
        finally:
            watch.close()

    async def _scan_guarded(self, force: bool) -> None:
        # A bug of ours in one scan must not end the source (and with it the agent): the pods
        # already wanted stay wanted, and the next poll tries again.
        try:
            await self.scan(force=force)
        except Exception:
            log.exception("static pod scan failed; keeping the pods and retrying", path=str(self.directory))

    async def scan(self, force: bool = False) -> None:
        try:
            files = await anyio.to_thread.run_sync(self._list)
        except OSError as exc:
            # An unreadable directory (permissions, a stale mount) is not "no manifests": the
            # pods already running stay, and the next poll tries again.
            if not self._list_failing:
                log.error("static pod directory unreadable; keeping its pods and retrying",
                          path=str(self.directory), error=str(exc))
            self._list_failing = True
            return
        if self._list_failing:
            log.info("static pod directory readable again", path=str(self.directory))
            self._list_failing = False
        changed = False
        for path in list(self._files):
            if path not in files:
                del self._files[path]
                changed = True
        for path, signature in files.items():
            state = self._files.get(path)
            if state is not None and state.signature == signature and not force:
                continue
            if state is not None and state.signature == signature:
                continue  # a forced rescan only matters for files whose stat we could not trust
            changed = True
            await self._load(path, signature, state)
        if changed or self._reconcile_pending:
            self._reconcile_pending = True  # until it completes (a failed one is tried again)
            await self._reconcile()
            self._reconcile_pending = False
        self.listed = True

    def _list(self) -> dict[Path, tuple[int, int, int]]:
        out: dict[Path, tuple[int, int, int]] = {}
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except FileNotFoundError:
            return out
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file():
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue  # removed between the listing and its stat: it is gone
            out[Path(entry.path)] = (st.st_mtime_ns, st.st_size, st.st_ino)
        return out

    def _read_and_parse(self, path: Path, size: int) -> tuple[list[dict[str, Any]], list[FileObject]]:
        """In a worker thread: reading and parsing a large file must not stall the event loop."""
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError("ManifestTooLarge", f"{path}: {size} bytes is over the 10 MiB limit")
        with path.open("rb") as file:
            data = file.read(MAX_MANIFEST_BYTES + 1)  # the file may have grown since its stat
        return parse_documents(path, data, self.node_name, time.time(), self.objects)

    async def _load(self, path: Path, signature: tuple[int, int, int], previous: _FileState | None) -> None:
        try:
            pods, objects = await anyio.to_thread.run_sync(self._read_and_parse, path, signature[1])
        except Exception as exc:
            if isinstance(exc, ManifestError):
                reason, message = exc.reason, str(exc)
            elif isinstance(exc, OSError):
                reason, message = "ManifestUnreadable", f"{path}: {exc.strerror or type(exc).__name__}"
            else:
                # A bug of ours, not the manifest's fault: reported (with the traceback, which
                # shows our code, not the file), and the agent goes on.
                log.exception("static pod manifest could not be loaded", path=str(path))
                reason, message = "InternalError", f"{path}: internal error while loading ({type(exc).__name__})"
            kept = previous.pods if previous is not None else []
            if kept:
                message += " (the last valid version keeps running)"
            log.error("static pod manifest rejected", path=str(path), reason=reason, error=message)
            await self.publish(ev.ManifestRejected(source="sources", path=str(path), reason=reason, message=message))
            self._files[path] = _FileState(signature, kept, message, previous.objects if previous is not None else [])
            return
        self._files[path] = _FileState(signature, pods, objects=objects)

    async def _reconcile(self) -> None:
        if self.objects is not None:
            # Before the pods: a new pod's claims must be there when it is prepared.
            for kind in self.objects.kinds():
                self.objects.replace(kind, [obj for _, state in sorted(self._files.items())
                                            for of_kind, obj in state.objects if of_kind == kind])
        wanted: dict[str, dict[str, Any]] = {}
        names: dict[str, Path] = {}
        paths: dict[str, Path] = {}
        for path, state in sorted(self._files.items()):
            for pod in state.pods:
                meta = pod["metadata"]
                full = f"{meta['name']}_{meta['namespace']}"
                if full in names and meta["uid"] not in wanted:
                    message = f"{path}: pod {full} is already defined in {names[full]}; ignoring this one"
                    log.error("duplicate static pod", path=str(path), pod=full)
                    await self.publish(ev.ManifestRejected(source="sources", path=str(path), reason="DuplicatePod",
                                                           message=message))
                    continue
                names[full] = path
                wanted[meta["uid"]] = pod
                paths[meta["uid"]] = path
        for uid, pod in self._wanted.items():
            if uid not in wanted:
                meta = pod["metadata"]
                grace = pod["spec"].get("terminationGracePeriodSeconds")
                await self.publish(ev.PodDeletionRequested(
                    source="sources", pod=ev.PodRef(uid=uid, name=meta["name"], namespace=meta["namespace"]),
                    origin="file", grace_period_seconds=grace,
                ))
        for uid, pod in list(wanted.items()):
            if uid not in self._wanted:
                admitted = None if uid in self._refused else await self._runtime_class_admission(pod, paths[uid])
                if admitted is None:
                    self._refused.add(uid)  # reported once; an edit of the manifest is a new pod
                    del wanted[uid]
                    continue
                pod = wanted[uid] = admitted
                meta = pod["metadata"]
                await self.publish(ev.PodSpecObserved(
                    source="sources", pod=ev.PodRef(uid=uid, name=meta["name"], namespace=meta["namespace"]),
                    origin="file", pod_spec=pod,
                ))
        self._wanted = wanted

    async def _runtime_class_admission(self, pod: dict[str, Any], path: Path) -> dict[str, Any] | None:
        """A new static pod as the API server's RuntimeClass admission would create its mirror
        (nodeagent/kube/runtimeclass.py): its class's overhead and scheduling applied; None, and
        the manifest rejected, when that admission refuses it. A class not there (yet) leaves the
        pod as written: its sandbox then fails as the kubelet's does (RuntimeClass not found)."""
        name = (pod.get("spec") or {}).get("runtimeClassName")
        if not name or self.objects is None:
            return pod
        found = await self.objects.get(RUNTIME_CLASS, name)
        if found is None:
            return pod
        try:
            return runtimeclass.admit(pod, found)
        except runtimeclass.RuntimeClassRejected as exc:
            full = f"{pod['metadata']['name']}_{pod['metadata']['namespace']}"
            log.error("static pod refused by its RuntimeClass", path=str(path), pod=full, error=str(exc))
            await self.publish(ev.ManifestRejected(source="sources", path=str(path), reason="Forbidden",
                                                   message=f"{path}: pod {full}: {exc}"))
            return None
