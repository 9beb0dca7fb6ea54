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

import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
import yaml
from pydantic import ValidationError

from nodeagent import events as ev
from nodeagent import labels as L
from nodeagent.claims import API_VERSIONS as CLAIM_API_VERSIONS
from nodeagent.claims import ClaimStore, ResourceClaim
from nodeagent.model import Pod

log = structlog.get_logger("nodeagent.sources.static")

MAX_MANIFEST_BYTES = 10 * 1024 * 1024  # the kubelet's limit per file
POLL_SECONDS = 0.25  # a stat of each file: cheap, and a new manifest starts within a quarter second


def static_pod_uid(document: dict[str, Any], node_name: str, path: Path) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(document, sort_keys=True, separators=(",", ":")).encode())
    digest.update(f"host:{node_name}".encode())
    digest.update(f"file:{path}".encode())
    return digest.hexdigest()[:32]


class ManifestError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_manifest(path: Path, text: str, node_name: str, seen_at: float) -> list[dict[str, Any]]:
    """Turn one file into static pods (as dicts ready for PodSpecObserved); raises ManifestError."""
    return parse_documents(path, text, node_name, seen_at)[0]


def parse_documents(path: Path, text: str, node_name: str,
                    seen_at: float) -> tuple[list[dict[str, Any]], list[ResourceClaim]]:
    """One file's static pods and ResourceClaims (standalone DRA: claims with their allocation
    sit beside the pods that use them); raises ManifestError."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError("ManifestMalformed", f"{path}: not valid YAML or JSON: {exc}") from None
    pods = []
    claims: list[ResourceClaim] = []
    for index, doc in enumerate(documents):
        where = f"{path}" + (f" (document {index + 1})" if len(documents) > 1 else "")
        if not isinstance(doc, dict):
            raise ManifestError("ManifestMalformed", f"{where}: a document must be a mapping, not {type(doc).__name__}")
        kind, api = doc.get("kind"), doc.get("apiVersion")
        if kind == "ResourceClaim" and api in CLAIM_API_VERSIONS:
            claims.append(_parse_claim(doc, where, node_name, path))
            continue
        if kind != "Pod" or api not in ("v1", None):
            raise ManifestError(
                "UnsupportedKind",
                f"{where}: kind {kind!r} apiVersion {api!r} is not supported in a static pod directory "
                f"(only v1 Pod and {', '.join(sorted(CLAIM_API_VERSIONS))} ResourceClaim)",
            )
        try:
            pod = Pod.model_validate(doc)
        except ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ManifestError("ManifestInvalid", f"{where}: {details}") from None
        if not pod.metadata.name:
            raise ManifestError("ManifestInvalid", f"{where}: metadata.name is required")
        uid = pod.metadata.uid or static_pod_uid(doc, node_name, path)
        metadata = dict(doc.get("metadata") or {})
        metadata.update(
            name=f"{pod.metadata.name}-{node_name.lower()}",
            namespace=pod.metadata.namespace or "default",
            uid=uid,
            annotations={
                **(metadata.get("annotations") or {}),
                L.CONFIG_SOURCE: "file",
                L.CONFIG_HASH: uid,
                L.CONFIG_SEEN: time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(seen_at)),
            },
        )
        spec = dict(doc["spec"])
        spec["nodeName"] = node_name
        pods.append({**doc, "metadata": metadata, "spec": spec})
    return pods, claims


def _parse_claim(doc: dict[str, Any], where: str, node_name: str, path: Path) -> ResourceClaim:
    try:
        claim = ResourceClaim.model_validate(doc)
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ManifestError("ManifestInvalid", f"{where}: {details}") from None
    if not claim.metadata.name:
        raise ManifestError("ManifestInvalid", f"{where}: metadata.name is required")
    # Like a static pod's: derived from content, so an edited claim is a new object.
    uid = claim.metadata.uid or static_pod_uid(doc, node_name, path)
    meta = claim.metadata.model_copy(update={"uid": uid, "namespace": claim.metadata.namespace or "default"})
    return claim.model_copy(update={"metadata": meta})


@dataclass
class _FileState:
    signature: tuple[int, int, int]
    pods: list[dict[str, Any]]
    error: str = ""
    claims: list[ResourceClaim] = field(default_factory=list)


@dataclass
class StaticPodSource:
    directory: Path
    node_name: str
    publish: Callable[[ev.Event], Awaitable[None]]
    full_rescan_seconds: float = 20.0
    poll_seconds: float = POLL_SECONDS
    claims: ClaimStore | None = None
    """Where the ResourceClaim manifests of the directory go (for the dra stage)."""
    _files: dict[Path, _FileState] = field(default_factory=dict)
    _wanted: dict[str, dict[str, Any]] = field(default_factory=dict)
    _list_failing: bool = False  # the directory could not be listed last time (reported once)
    listed: bool = False
    """A scan of the directory succeeded and was published (the runtime replay may trust
    wanted(); an unreadable directory at start must not make its pods orphans)."""

    def wanted(self) -> set[str]:
        return set(self._wanted)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Scan, publish the initial set, report started, then keep watching."""
        await self.scan(force=True)
        task_status.started()
        last_full = time.monotonic()
        while True:
            await anyio.sleep(self.poll_seconds)
            force = time.monotonic() - last_full >= self.full_rescan_seconds
            if force:
                last_full = time.monotonic()
            await self.scan(force=force)

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
        if changed:
            await self._reconcile()
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

    async def _load(self, path: Path, signature: tuple[int, int, int], previous: _FileState | None) -> None:
        try:
            if signature[1] > MAX_MANIFEST_BYTES:
                raise ManifestError("ManifestTooLarge", f"{path}: {signature[1]} bytes is over the 10 MiB limit")
            text = await anyio.to_thread.run_sync(path.read_text)
            pods, claims = parse_documents(path, text, self.node_name, time.time())
        except (ManifestError, OSError, UnicodeDecodeError) as exc:
            reason = exc.reason if isinstance(exc, ManifestError) else "ManifestUnreadable"
            kept = previous.pods if previous is not None else []
            message = str(exc)
            if kept:
                message += " (the last valid version keeps running)"
            log.error("static pod manifest rejected", path=str(path), reason=reason, error=message)
            await self.publish(ev.ManifestRejected(source="sources", path=str(path), reason=reason, message=message))
            self._files[path] = _FileState(signature, kept, message, previous.claims if previous is not None else [])
            return
        self._files[path] = _FileState(signature, pods, claims=claims)

    async def _reconcile(self) -> None:
        if self.claims is not None:
            # Before the pods: a new pod's claims must be there when it is prepared.
            self.claims.replace("file", [c for _, state in sorted(self._files.items()) for c in state.claims])
        wanted: dict[str, dict[str, Any]] = {}
        names: dict[str, Path] = {}
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
        for uid, pod in self._wanted.items():
            if uid not in wanted:
                meta = pod["metadata"]
                grace = pod["spec"].get("terminationGracePeriodSeconds")
                await self.publish(ev.PodDeletionRequested(
                    source="sources", pod=ev.PodRef(uid=uid, name=meta["name"], namespace=meta["namespace"]),
                    origin="file", grace_period_seconds=grace,
                ))
        for uid, pod in wanted.items():
            if uid not in self._wanted:
                meta = pod["metadata"]
                await self.publish(ev.PodSpecObserved(
                    source="sources", pod=ev.PodRef(uid=uid, name=meta["name"], namespace=meta["namespace"]),
                    origin="file", pod_spec=pod,
                ))
        self._wanted = wanted
