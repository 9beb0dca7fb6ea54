"""Where the gang stage reads group objects (PodGroup, Workload) that carry a gang's minMember.

Most schedulers keep minMember on a separate object, not on the pod (reference/gang.md §8.2).
In cluster mode those objects come from the API server (plugins/gang/apicatalog.py, behind the
same :class:`GroupCatalog` protocol). In standalone mode there is no API server, so the stage can read
them from a directory of manifests placed beside the static pods (plugin setting
``podGroupPath``); the static pod directory itself accepts only pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import structlog
import yaml

log = structlog.get_logger("nodeagent.gang")

ObjectKey = tuple[str, str, str, str]
"""(API group, kind, namespace, name): versions are not part of the key, because one object is
served in several versions and its readers tolerate each shape."""


class GroupCatalog(Protocol):
    def get(self, api_group: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The object, or None when it does not exist (or cannot be read)."""


class NoCatalog:
    """No group objects at all: gangs declared only by a PodGroup stay unknown."""

    def get(self, api_group: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None


class ManifestCatalog:
    """Group objects from YAML/JSON files in one directory, re-read when a file changes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._objects: dict[ObjectKey, Mapping[str, Any]] = {}

    def get(self, api_group: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        self._refresh()
        return self._objects.get((api_group, kind, namespace, name))

    def _refresh(self) -> None:
        try:
            files = sorted(p for p in self.directory.iterdir() if p.is_file() and not p.name.startswith("."))
            signature = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files)
        except OSError:
            files, signature = [], ()
        if signature == self._signature:
            return
        objects: dict[ObjectKey, Mapping[str, Any]] = {}
        for path in files:
            try:
                documents = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
            except (OSError, yaml.YAMLError) as exc:
                # A broken file must not hide the others; the gang it defined stays unknown.
                log.warning("cannot read group manifest", path=str(path), error=str(exc))
                continue
            for doc in documents:
                key = object_key(doc)
                if key is not None:
                    objects[key] = doc
        self._objects, self._signature = objects, signature


def object_key(doc: Mapping[str, Any]) -> ObjectKey | None:
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    metadata = doc.get("metadata") or {}
    if not isinstance(api_version, str) or not isinstance(kind, str) or not metadata.get("name"):
        return None
    group = api_version.rpartition("/")[0]
    return group, kind, str(metadata.get("namespace") or "default"), str(metadata["name"])
