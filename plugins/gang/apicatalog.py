"""Group objects (PodGroup, Workload) from the API server, for cluster mode.

:class:`GroupCatalog.get` is synchronous (declarations are read between two awaits), so this
catalog answers from a cache that :meth:`ApiCatalog.fetch` fills: the stage fetches what a pod's
declaration names before it reads the declaration (in ``admit`` and ``permit``). An object is
read again when its copy is older than ``ttl`` seconds; a missing one is asked for again after
``missing_ttl`` (a PodGroup created just after its pods is found soon). minMember is read once per
generation anyway, so no watch is needed.

The node's credentials cannot read these objects (the Node authorizer grants none of them): the
ClusterRole in plugins/gang/deploy/rbac.yaml grants get/list/watch to the group system:nodes. A
refused read is logged once with that advice, and the object counts as missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import structlog
from lightkube.generic_resource import create_namespaced_resource

from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster.apicalls import describe, status_code
from plugins.gang.catalog import ObjectKey

log = structlog.get_logger("nodeagent.gang")

VERSIONS: Mapping[tuple[str, str], tuple[tuple[str, str], ...]] = {
    # (API group, kind): (version, plural) tried in order; the readers tolerate every shape
    ("scheduling.k8s.io", "PodGroup"): (("v1beta1", "podgroups"), ("v1alpha3", "podgroups"), ("v1alpha2", "podgroups")),
    ("scheduling.k8s.io", "Workload"): (("v1alpha1", "workloads"), ("v1alpha2", "workloads")),
    ("scheduling.x-k8s.io", "PodGroup"): (("v1alpha1", "podgroups"),),
    ("scheduling.volcano.sh", "PodGroup"): (("v1beta1", "podgroups"),),
    ("scheduling.run.ai", "PodGroup"): (("v2alpha2", "podgroups"),),
}
FETCH_TIMEOUT_SECONDS = 5.0


class ApiCatalog:
    def __init__(self, api: Any, clock: Clock | None = None, *, ttl: float = 60.0, missing_ttl: float = 5.0) -> None:
        self._api = api
        self._clock = clock or SystemClock()
        self.ttl = ttl
        self.missing_ttl = missing_ttl
        self._cache: dict[ObjectKey, tuple[float, Mapping[str, Any] | None]] = {}
        self._warned: set[tuple[str, str]] = set()
        self.reads = 0

    def get(self, api_group: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        entry = self._cache.get((api_group, kind, namespace, name))
        return entry[1] if entry is not None else None

    async def fetch(self, api_group: str, kind: str, namespace: str, name: str) -> None:
        key = (api_group, kind, namespace, name)
        entry = self._cache.get(key)
        now = self._clock.monotonic()
        if entry is not None and now - entry[0] < (self.ttl if entry[1] is not None else self.missing_ttl):
            return
        versions = VERSIONS.get((api_group, kind), ())
        found: Mapping[str, Any] | None = None
        for version, plural in versions:
            resource = create_namespaced_resource(api_group, version, kind, plural)
            self.reads += 1
            try:
                with anyio.fail_after(FETCH_TIMEOUT_SECONDS):
                    obj = await self._api.get(resource, name, namespace=namespace)
            except Exception as exc:  # noqa: BLE001 - the API's answer decides; never fatal
                code = _code(exc)
                if code == 404:
                    continue  # not this version (or not this object): try the next
                if code == 403 and (api_group, kind) not in self._warned:
                    self._warned.add((api_group, kind))
                    log.error("cannot read gang group objects: the node may not read them; grant the "
                              "ClusterRole in plugins/gang/deploy/rbac.yaml", group=api_group, kind=kind,
                              error=describe(exc))
                elif code != 403:
                    log.warning("reading a gang group object failed", group=api_group, kind=kind,
                                namespace=namespace, name=name, error=describe(exc))
                    if entry is not None:
                        return  # keep what we had; ask again next time
                break
            found = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
            break
        self._cache[key] = (now, found)


def _code(exc: BaseException) -> int | None:
    """The HTTP status of a failed read. A group or version the server does not serve answers
    404 with a plain-text body, which lightkube raises as its HTTP client's error (with the
    response), not as an ApiError."""
    code = status_code(exc)
    if code is None:
        code = getattr(getattr(exc, "response", None), "status_code", None)
    return code if isinstance(code, int) else None
