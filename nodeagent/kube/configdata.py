"""Reading the configMaps and secrets a pod refers to, with the kubelet's error messages
(shared by the apivolumes stage — volumes and env — and the runtime stage's pull secrets).

The node's credentials only reach objects that pods bound to the node refer to (the Node
authorizer), so a reader never lists or watches: it gets each named object through the object
store, fresh, once per pass.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

from nodeagent.objects import ObjectError, kinds

Kind = Literal["ConfigMap", "Secret"]

# The kubelet's configMap and secret managers report a missing object with these group
# resources (singular), so its message is `configmap "x" not found`, not the API server's
# `configmaps "x" not found`.
_NOT_FOUND_NAME: dict[Kind, str] = {"ConfigMap": "configmap", "Secret": "secret"}


class ObjectUnavailable(Exception):
    """The object could not be read: missing (``not_found``), forbidden, or the API is down."""

    def __init__(self, message: str, *, not_found: bool) -> None:
        super().__init__(message)
        self.not_found = not_found


@dataclass(frozen=True)
class ObjectData:
    kind: Kind
    name: str
    strings: dict[str, str] = field(default_factory=dict)
    """configMap ``data``."""
    binary: dict[str, bytes] = field(default_factory=dict)
    """configMap ``binaryData``; every key of a secret (its ``data``, base64-decoded)."""
    type: str = ""
    """A secret's ``type`` (``kubernetes.io/dockerconfigjson``, ...)."""
    uid: str = ""

    def env_values(self) -> dict[str, str]:
        """What env sees: a configMap's ``data`` only (binaryData never reaches env, as in the
        kubelet); a secret's values as text."""
        if self.kind == "ConfigMap":
            return dict(self.strings)
        return {k: as_env_text(v) for k, v in self.binary.items()}

    def file_content(self, key: str) -> bytes | None:
        if key in self.strings:
            return self.strings[key].encode()
        return self.binary.get(key)

    def file_keys(self) -> list[str]:
        return [*self.strings, *(k for k in self.binary if k not in self.strings)]


def as_env_text(value: bytes) -> str:
    # The kubelet passes the bytes through (Go's string(v)); a CRI string must be valid UTF-8
    # on our side, so undecodable bytes become U+FFFD instead of failing the container.
    return value.decode("utf-8", errors="replace")


def not_found_message(kind: Kind, name: str) -> str:
    return f'{_NOT_FOUND_NAME[kind]} "{name}" not found'


class ObjectReader:
    """One pass's view of the objects a pod refers to: each read at most once, so that env and
    volumes of one pass see the same version (the kubelet's per-sync maps)."""

    def __init__(self, objects: Any, namespace: str) -> None:
        self._objects = objects
        self._namespace = namespace
        self._seen: dict[tuple[Kind, str], ObjectData | ObjectUnavailable] = {}

    async def get(self, kind: Kind, name: str) -> ObjectData:
        """The object's data; raises :class:`ObjectUnavailable` (callers decide what optional
        means)."""
        key = (kind, name)
        if key not in self._seen:
            self._seen[key] = await self._read(kind, name)
        found = self._seen[key]
        if isinstance(found, ObjectUnavailable):
            raise found
        return found

    async def _read(self, kind: Kind, name: str) -> ObjectData | ObjectUnavailable:
        store_kind = kinds.CONFIG_MAP if kind == "ConfigMap" else kinds.SECRET
        try:
            # Fresh each pass (max_age 0): the kubelet's managers see an object's change at once.
            obj = await self._objects.get(store_kind, name, self._namespace, max_age=0)
        except ObjectError as exc:
            return ObjectUnavailable(exc.detail, not_found=False)
        except Exception as exc:  # noqa: BLE001 — anything else: retried later
            return ObjectUnavailable(f"cannot read {kind} {self._namespace}/{name}: {exc!r}", not_found=False)
        if obj is None:
            return ObjectUnavailable(not_found_message(kind, name), not_found=True)
        data = obj.get("data") or {}
        if kind == "ConfigMap":
            return ObjectData(kind, name, strings=dict(data),
                              binary={k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return ObjectData(kind, name, binary={k: base64.b64decode(v) for k, v in data.items()},
                          type=str(obj.get("type") or ""), uid=str((obj.get("metadata") or {}).get("uid") or ""))
