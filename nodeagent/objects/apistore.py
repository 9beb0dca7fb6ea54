"""The object store of cluster mode: list and watch, cached reads and the few writes stages
make, all with the node's credentials, through the one API client the agent has.

* :meth:`ApiObjects.view` — a shared, list-and-watch-fed :class:`View` per scope (kind,
  namespace, selectors), the kubelet's informers. A watch resumes from its last
  resourceVersion (bookmarks keep it fresh); a 410 (too old) or an unreadable listing starts
  over with a list whose difference becomes changes; failures back off (0.5 s doubling to 8 s,
  jittered) and are shown in ``view.error``, a 403 logged once with the kind (the node's RBAC
  decides, not us). Views live while someone holds them (``release``).
* :meth:`ApiObjects.get` — a read by name through a cache (the kubelet's ``Cache`` change
  detection strategy for secrets and configMaps: a node may read only the objects its pods
  use, one by one); a missing object is remembered for a shorter time than a found one.
* :meth:`ApiObjects.create` / :meth:`update` / :meth:`patch` / :meth:`delete` — the writes
  stages need (a TokenRequest, the deletion of the node's own ResourceSlices, the node's
  CSINode, a PVC's status after a node expansion).

Which version of a kind to use is found once per group from the API server's discovery
(``/apis/<group>``), trying the kind's versions newest first.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2 as httpx  # the HTTP library under lightkube's client (lightkube 1.x requires it)
import msgspec
import structlog

from nodeagent.backoff import Backoff
from nodeagent.clock import Clock, SystemClock
from nodeagent.objects.kinds import Kind
from nodeagent.objects.view import DELETED, Scope, Snapshot, View

log = structlog.get_logger("nodeagent.objects")

_decode = msgspec.json.Decoder().decode
"""JSON to Python objects, several times faster than json.loads: every agent watching a gang's
namespace decodes each member's every status write, and a pod is kilobytes of JSON."""

WATCH_TIMEOUT_SECONDS = 300
"""The server ends each watch after 5–10 minutes (jittered), as client-go asks it to."""
FOUND_TTL_SECONDS = 60.0
MISSING_TTL_SECONDS = 5.0


class ObjectError(Exception):
    """A read or write the API server refused or did not answer; ``code`` is its HTTP status
    (None: no answer at all), ``detail`` the API's own message (its Status) when it gave one."""

    def __init__(self, message: str, code: int | None, detail: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.detail = detail or message

    @property
    def forbidden(self) -> bool:
        return self.code == 403


@dataclass
class _Feed:
    view: View
    scope_cancel: anyio.CancelScope | None = None


class ApiObjects:
    cluster = True
    """Backed by an API server (the agent is a node of a cluster)."""

    def __init__(self, api: Any, clock: Clock | None = None) -> None:
        self._api = api
        self._clock = clock or SystemClock()
        self._feeds: dict[Scope, _Feed] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._versions: dict[str, list[str]] = {}
        """API group → the versions its discovery lists (the core group: ["v1"])."""
        self._cache: dict[tuple[Kind, str, str], tuple[float, Snapshot | None]] = {}
        self._warned: set[Kind] = set()
        self.requests = 0
        """Reads and writes sent (lists, watches and gets), for tests and metrics."""

    # --- views ---------------------------------------------------------------------------

    def view(self, kind: Kind, *, namespace: str | None = None, fields: Mapping[str, str] | None = None,
             labels: Mapping[str, str] | None = None) -> View:
        scope = Scope(kind, namespace if kind.namespaced else None, tuple(sorted((fields or {}).items())),
                      tuple(sorted((labels or {}).items())))
        feed = self._feeds.get(scope)
        if feed is None:
            feed = self._feeds[scope] = _Feed(View(scope))
            if self._tg is not None:
                self._tg.start_soon(self._feed, feed, name=f"objects:{scope}")
        feed.view.users += 1
        return feed.view

    def declare(self, kind: Kind, check: Callable[[Snapshot], object] | None = None) -> None:
        """Objects come from the API server, which validated them: nothing to declare."""

    def release(self, view: View) -> None:
        """The holder no longer needs ``view``; the last one's release stops its watch."""
        view.users -= 1
        if view.users > 0:
            return
        feed = self._feeds.pop(view.scope, None)
        if feed is not None and feed.scope_cancel is not None:
            feed.scope_cancel.cancel()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for feed in list(self._feeds.values()):
                tg.start_soon(self._feed, feed, name=f"objects:{feed.view.scope}")
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                self._tg = None

    async def _feed(self, feed: _Feed) -> None:
        view = feed.view
        backoff = Backoff(initial=0.5, maximum=8.0, jitter=0.2)
        version: str | None = None
        with anyio.CancelScope() as scope:
            feed.scope_cancel = scope
            while True:
                try:
                    if version is None:
                        version = await self._list(view)
                    version = await self._watch(view, version)
                    backoff.reset()  # the server closed a healthy watch: resume from where it was
                except Exception as exc:  # noqa: BLE001 - transport errors, 5xx, 403, 410: never fatal
                    if isinstance(exc, ObjectError) and exc.code == 410:
                        version = None  # too old: list again
                        continue
                    self._failed(view, exc)
                    await self._clock.sleep(backoff.next())

    def _failed(self, view: View, exc: BaseException) -> None:
        error = str(exc) if isinstance(exc, ObjectError) else f"{type(exc).__name__}: {exc}"
        view.failed(error)
        if isinstance(exc, ObjectError) and exc.forbidden:
            if view.scope.kind not in self._warned:
                self._warned.add(view.scope.kind)
                log.error("the node's credentials may not read this kind; stages that need it wait",
                          scope=str(view.scope), error=error)
        else:
            log.warning("watching objects failed; retrying", scope=str(view.scope), error=error)

    async def _list(self, view: View) -> str:
        """Every object of the scope (in pages of 500), as the view's new content."""
        path = await self._collection(view.scope.kind, view.scope.namespace)
        params = self._selectors(view.scope)
        objects: list[dict[str, Any]] = []
        while True:
            page = await self._send("GET", path, params={**params, "limit": "500"})
            objects += page.get("items") or []
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                break
            params["continue"] = meta["continue"]
        kind = view.scope.kind
        version = await self._version(kind)
        for obj in objects:  # a list's items carry neither (the API leaves them out)
            obj.setdefault("kind", kind.kind)
            obj.setdefault("apiVersion", f"{kind.group}/{version}" if kind.group else version)
        view.replace(objects)
        return str(meta.get("resourceVersion") or "")

    async def _watch(self, view: View, version: str) -> str:
        path = await self._collection(view.scope.kind, view.scope.namespace)
        params = {**self._selectors(view.scope), "watch": "1", "resourceVersion": version,
                  "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(WATCH_TIMEOUT_SECONDS + random.randint(0, WATCH_TIMEOUT_SECONDS))}
        http = self._api._client._client  # lightkube's httpx session: base URL, TLS and credentials
        self.requests += 1
        async with http.stream("GET", path, params=params, timeout=httpx.Timeout(None, connect=10.0)) as response:
            if response.status_code >= 400:
                await response.aread()
                raise _error("GET", path, response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = _decode(line)
                change, obj = event.get("type"), event.get("object") or {}
                if change == "ERROR":
                    raise ObjectError(f"watch of {view.scope}: {obj.get('message', '')}", obj.get("code"))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if change == "BOOKMARK":
                    continue
                view.error = ""
                view.apply(DELETED if change == "DELETED" else str(change), obj)
        return version

    @staticmethod
    def _selectors(scope: Scope) -> dict[str, str]:
        params: dict[str, str] = {}
        if scope.fields:
            params["fieldSelector"] = ",".join(f"{k}={v}" for k, v in scope.fields)
        if scope.labels:
            params["labelSelector"] = ",".join(f"{k}={v}" for k, v in scope.labels)
        return params

    # --- reads by name ------------------------------------------------------------------------

    async def get(self, kind: Kind, name: str, namespace: str | None = None, *,
                  max_age: float | None = None) -> Snapshot | None:
        """The object, or None if the API server says it does not exist; read again when the
        cached copy is older than ``max_age`` (default 60 s; 5 s for a missing one). Raises
        :class:`ObjectError` when the server refuses (403) or does not answer."""
        key = (kind, namespace or "", name)
        cached = self._cache.get(key)
        now = self._clock.monotonic()
        if cached is not None:
            ttl = max_age if max_age is not None else (FOUND_TTL_SECONDS if cached[1] is not None
                                                        else MISSING_TTL_SECONDS)
            if now - cached[0] < ttl:
                return cached[1]
        path = await self._member(kind, namespace, name)
        try:
            obj = await self._send("GET", path)
        except ObjectError as exc:
            if exc.code == 404:
                self._cache[key] = (now, None)
                return None
            raise
        self._cache[key] = (now, obj)
        return obj

    def forget(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        """Drop a cached read (the next get asks the server)."""
        self._cache.pop((kind, namespace or "", name), None)

    # --- writes ----------------------------------------------------------------------------

    async def create(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None, *,
                     name: str | None = None, subresource: str | None = None) -> Snapshot:
        """POST ``body``; with ``subresource`` (e.g. ``token`` of a ServiceAccount ``name``)
        to that subresource of the named object."""
        path = await self._member(kind, namespace, name) if name else await self._collection(kind, namespace)
        return await self._send("POST", f"{path}/{subresource}" if subresource else path, body=dict(body))

    async def update(self, kind: Kind, body: Mapping[str, Any], namespace: str | None = None, *,
                     subresource: str | None = None) -> Snapshot:
        """PUT ``body`` (named by its metadata; its resourceVersion, if any, makes the write
        conditional: a 409 says someone else wrote first — read again and retry)."""
        name = str((body.get("metadata") or {}).get("name") or "")
        path = await self._member(kind, namespace, name)
        written = await self._send("PUT", f"{path}/{subresource}" if subresource else path, body=dict(body))
        self._cache[(kind, namespace or "", name)] = (self._clock.monotonic(), written)
        return written

    async def patch(self, kind: Kind, name: str, patch: Mapping[str, Any], namespace: str | None = None, *,
                    subresource: str | None = None, merge: str = "merge") -> Snapshot:
        """PATCH with a JSON merge patch (``merge="merge"``) or a strategic merge patch
        (``"strategic"``, core kinds only)."""
        path = await self._member(kind, namespace, name)
        content_type = {"merge": "application/merge-patch+json",
                        "strategic": "application/strategic-merge-patch+json"}[merge]
        written = await self._send("PATCH", f"{path}/{subresource}" if subresource else path, body=dict(patch),
                                   content_type=content_type)
        self._cache[(kind, namespace or "", name)] = (self._clock.monotonic(), written)
        return written

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        try:
            await self._send("DELETE", await self._member(kind, namespace, name))
        except ObjectError as exc:
            if exc.code != 404:
                raise

    async def _collection(self, kind: Kind, namespace: str | None) -> str:
        path = f"{kind.api_prefix}/{await self._version(kind)}"
        if kind.namespaced and namespace:
            path += f"/namespaces/{namespace}"
        return f"{path}/{kind.plural}"

    async def _member(self, kind: Kind, namespace: str | None, name: str) -> str:
        return f"{await self._collection(kind, namespace or ('default' if kind.namespaced else None))}/{name}"

    async def _send(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                    body: dict[str, Any] | None = None, content_type: str | None = None) -> dict[str, Any]:
        http = self._api._client._client  # lightkube's httpx session: base URL, TLS and credentials
        self.requests += 1
        try:
            if content_type is None:
                response = await http.request(method, path, params=params, json=body)
            else:
                response = await http.request(method, path, params=params, content=json.dumps(body).encode(),
                                              headers={"Content-Type": content_type})
        except httpx.HTTPError as exc:
            raise ObjectError(f"{method} {path}: {type(exc).__name__}: {exc}", None) from exc
        if response.status_code >= 400:
            raise _error(method, path, response)
        data = _decode(response.content) if response.content else {}
        return data if isinstance(data, dict) else {}

    # --- versions ----------------------------------------------------------------------------

    async def _version(self, kind: Kind) -> str:
        if not kind.group:
            return kind.versions[0]
        served = self._versions.get(kind.group)
        if served is None:
            try:
                discovery = await self._send("GET", kind.api_prefix)
            except ObjectError as exc:
                if exc.code != 404:
                    raise
                discovery = {}
            served = [v.get("version", "") for v in discovery.get("versions") or []]
            self._versions[kind.group] = served
        for version in kind.versions:
            if version in served:
                return version
        raise ObjectError(f"the API server serves none of {kind}'s versions {list(kind.versions)} "
                          f"(it serves {served or 'no version of the group'})", 404)



def _error(method: str, path: str, response: httpx.Response) -> ObjectError:
    try:
        status = response.json()
        message = status.get("message") or response.text
    except ValueError:
        message = response.text.strip()
    return ObjectError(f"{response.status_code}: {message}", response.status_code, message)


__all__ = ["ApiObjects", "ObjectError"]
