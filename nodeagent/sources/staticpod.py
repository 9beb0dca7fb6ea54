"""One manifest file → static pods and objects: the kubelet's defaults for file pods, the
fields it ignores, and the API server's validation (as tryDecodeSinglePod applies it).

Standalone, the documents beside the pods may also be objects of the kinds the stages read from
the object store (a ResourceClaim with its allocation, a RuntimeClass, a PodGroup: see
nodeagent.objects.filestore); each gets the API server's metadata checks and its reader's own
check, so that a document nobody can read is refused with its file, line and field.

What a static pod ignores (so that a copy of ``kubectl get pod -o yaml`` runs):

* ``status``: the kubelet overwrites the phase and reports its own status; nothing in a
  manifest's status is read.
* what the API server sets on create and a copy carries along: ``metadata.resourceVersion``,
  ``creationTimestamp``, ``deletionTimestamp``, ``deletionGracePeriodSeconds``, ``generation``,
  ``managedFields``, ``selfLink``. These are dropped (the API server's BeforeCreate clears or
  overwrites them too); a copied deletionTimestamp must not make a new pod look deleted.
* ``metadata.uid`` of a copy (a manifest that also carries a ``resourceVersion``): the UID of
  the API object it was copied from, which may well still run on this node in cluster mode,
  so the UID is derived from the content instead (deliberate difference: the kubelet would use
  it). A UID written by hand is kept, if it is a plain token (``[A-Za-z0-9-]``, at most 64):
  it names directories on the host.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nodeagent import labels as L
from nodeagent.model import Pod
from nodeagent.objects.filestore import FileObjects
from nodeagent.objects.kinds import Kind
from nodeagent.sources import manifest
from nodeagent.sources.manifest import Document, ManifestError
from nodeagent.validation import ErrorList, validate_pod_create
from nodeagent.validation import field as vf
from nodeagent.validation.decode import Obj
from nodeagent.validation.meta import validate_object_meta

SERVER_SET_METADATA = ("resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                       "generation", "managedFields", "selfLink")
MAX_REPORTED_ERRORS = 20
"""A message lists at most this many field errors (and says how many more there were)."""


def static_pod_uid(document: dict[str, Any], node_name: str, path: Path) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(document, sort_keys=True, separators=(",", ":")).encode())
    digest.update(f"host:{node_name}".encode())
    digest.update(f"file:{path}".encode())
    return digest.hexdigest()[:32]


FileObject = tuple[Kind, dict[str, Any]]


def parse_documents(path: Path, text: str | bytes, node_name: str, seen_at: float,
                    objects: FileObjects | None = None) -> tuple[list[dict[str, Any]], list[FileObject]]:
    """One file's static pods (as dicts ready for PodSpecObserved) and the objects of the kinds
    ``objects`` accepts (none without it: cluster mode reads objects from the API server);
    raises ManifestError. Blocking (parsing a large file takes a while): call it from a thread."""
    documents = manifest.load(text, str(path))
    pods: list[dict[str, Any]] = []
    found: list[FileObject] = []
    for doc in documents:
        value = doc.value
        where = manifest.describe(str(path), doc.index, doc.position(()))
        if not isinstance(value, dict):
            raise ManifestError("ManifestMalformed", f"{where}: a document must be a mapping, not "
                                f"{manifest.describe_kind(value)}")
        kind, api = value.get("kind"), value.get("apiVersion")
        object_kind = objects.kind_of(api, kind) if objects is not None else None
        if object_kind is not None:
            found.append((object_kind, _object(doc, object_kind, objects, str(path), node_name, path)))  # type: ignore[arg-type]
            continue
        if kind != "Pod" or api not in ("v1", None):
            others = ", ".join(objects.accepted()) if objects is not None else ""
            accepted = f"v1 Pod, {others}" if others else "v1 Pod; other objects come from the API server"
            raise ManifestError(
                "UnsupportedKind",
                f"{where}: kind {vf.render(kind)} apiVersion {vf.render(api)} is not supported in a static pod "
                f"directory (accepted: {accepted})",
            )
        pods.append(static_pod(doc, path, node_name, seen_at))
    return pods, found


def parse_manifest(path: Path, text: str | bytes, node_name: str, seen_at: float) -> list[dict[str, Any]]:
    """Turn one file into static pods (as dicts ready for PodSpecObserved); raises ManifestError."""
    return parse_documents(path, text, node_name, seen_at)[0]


def static_pod(doc: Document, path: Path, node_name: str, seen_at: float) -> dict[str, Any]:
    """The kubelet's applyDefaults, then ValidatePodCreate, then our model."""
    original: dict[str, Any] = doc.value
    pod: dict[str, Any] = prune_nulls(original)
    pod.pop("status", None)
    metadata = pod.get("metadata")
    if isinstance(metadata, dict):
        copied = metadata.get("resourceVersion") is not None
        for key in SERVER_SET_METADATA:
            metadata.pop(key, None)
        if copied:
            metadata.pop("uid", None)
        uid = metadata.get("uid")
        if uid in (None, ""):  # (a UID of the wrong type stays, for validation to name)
            uid = static_pod_uid(original, node_name, path)
        name = metadata.get("name")
        if isinstance(name, str) and name:
            metadata["name"] = f"{name}-{node_name.lower()}"
        if metadata.get("namespace") in (None, ""):
            metadata["namespace"] = "default"
        metadata["uid"] = uid
        annotations = metadata.setdefault("annotations", {})
        if isinstance(annotations, dict):
            annotations.update({
                L.CONFIG_SOURCE: "file",
                L.CONFIG_HASH: uid if isinstance(uid, str) else "",
                L.CONFIG_SEEN: time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(seen_at)),
            })
    spec = pod.get("spec")
    if isinstance(spec, dict):
        spec["nodeName"] = node_name
    errors = validate_pod_create(pod)
    if errors:
        raise ManifestError("ManifestInvalid", report(str(path), doc, errors))
    try:
        Pod.model_validate(pod)
    except ValidationError as exc:
        # A gap between the validation above and the model: still a clean rejection.
        raise ManifestError("ManifestInvalid", report(str(path), doc, model_errors(exc))) from None
    return pod


def report(source: str, doc: Document, errors: ErrorList) -> str:
    """``file: line 7, column 9: spec.containers[0].name: Invalid value: ...; ...``"""
    lines = [f"{manifest.describe(source, doc.index, doc.position(e.path.json()))}: {e}"
             for e in errors[:MAX_REPORTED_ERRORS]]
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"and {len(errors) - MAX_REPORTED_ERRORS} more")
    return "; ".join(lines)


def model_errors(exc: ValidationError) -> ErrorList:
    """Pydantic's errors as field errors (the message, never the input)."""
    out: ErrorList = []
    for e in exc.errors(include_input=False, include_url=False):
        parts: list[str | int | vf.Key] = []
        for p in e["loc"]:
            parts.append(p if isinstance(p, int) else str(p))
        out.append(vf.invalid(vf.Path(tuple(parts)), vf.OMIT, str(e["msg"]).removeprefix("Value error, ")))
    return out


def prune_nulls(value: Any) -> Any:
    """A copy without null mapping values: ``null`` means "not set", as in Go's decoding."""
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_nulls(v) for v in value]
    return value


def _object(doc: Document, kind: Kind, objects: FileObjects, source: str, node_name: str,
            path: Path) -> dict[str, Any]:
    """An object document: metadata as the API server checks it (a namespaced kind defaulted to
    "default"), a UID derived from the content when it has none (an edited object is a new one,
    like a static pod), then the check its reader declared."""
    value: dict[str, Any] = prune_nulls(doc.value)
    errs: ErrorList = []
    metadata = value.get("metadata")
    if isinstance(metadata, dict):
        for key in SERVER_SET_METADATA:
            metadata.pop(key, None)
        if kind.namespaced and metadata.get("namespace") in (None, ""):
            metadata["namespace"] = "default"
    meta = Obj.of(metadata, vf.ROOT.child("metadata"), errs) or Obj({}, vf.ROOT.child("metadata"), errs)
    validate_object_meta(meta, namespaced=kind.namespaced)
    if errs:
        raise ManifestError("ManifestInvalid", report(source, doc, vf.dedupe(errs)))
    assert isinstance(metadata, dict)  # (validation said so)
    if not metadata.get("uid"):
        metadata["uid"] = static_pod_uid(doc.value, node_name, path)
    try:
        objects.check(kind, value)
    except ValidationError as exc:
        raise ManifestError("ManifestInvalid", report(source, doc, model_errors(exc))) from None
    except ValueError as exc:
        raise ManifestError("ManifestInvalid", f"{manifest.describe(source, doc.index, doc.position(()))}: "
                                               f"{kind.kind}: {exc}") from None
    return value
