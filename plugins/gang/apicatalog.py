"""Group objects (PodGroup, Workload) from the object store, for cluster mode.

:class:`GroupCatalog.get` is synchronous (declarations are read between two awaits), so this
catalog answers from a cache that :meth:`ApiCatalog.fetch` fills: the stage fetches what a pod's
declaration names before it reads the declaration (in ``admit`` and ``permit``). The store reads
an object by name through its cache (found: again after a minute; missing: after 5 s, so a
PodGroup created just after its pods is found soon); minMember is read once per generation
anyway, so no watch is needed. Which version a group serves is found by the store's discovery.

The node's credentials cannot read these objects (the Node authorizer grants none of them): the
ClusterRole in plugins/gang/deploy/rbac.yaml grants get/list/watch to the group system:nodes. A
refused read is logged once with that advice, and the object counts as missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import structlog

from nodeagent.objects import Kind, ObjectError, kinds
from plugins.gang.catalog import ObjectKey

log = structlog.get_logger("nodeagent.gang")

KINDS: Mapping[tuple[str, str], Kind] = {
    (k.group, k.kind): k for k in (
        kinds.POD_GROUP,
        kinds.WORKLOAD,
        Kind("scheduling.x-k8s.io", "PodGroup", "podgroups", ("v1alpha1",)),
        Kind("scheduling.volcano.sh", "PodGroup", "podgroups", ("v1beta1",)),
        Kind("scheduling.run.ai", "PodGroup", "podgroups", ("v2alpha2",)),
    )
}
"""The group objects the declarations name (reference/gang.md §8.2), by (API group, kind)."""
FETCH_TIMEOUT_SECONDS = 5.0


class ApiCatalog:
    def __init__(self, objects: Any) -> None:
        self._objects = objects
        self._cache: dict[ObjectKey, Mapping[str, Any] | None] = {}
        self._warned: set[tuple[str, str]] = set()

    def get(self, api_group: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._cache.get((api_group, kind, namespace, name))

    async def fetch(self, api_group: str, kind: str, namespace: str, name: str) -> None:
        key = (api_group, kind, namespace, name)
        declared = KINDS.get((api_group, kind))
        if declared is None:
            self._cache[key] = None
            return
        try:
            with anyio.fail_after(FETCH_TIMEOUT_SECONDS):
                self._cache[key] = await self._objects.get(declared, name, namespace)
        except ObjectError as exc:
            if exc.code == 404:  # the group or none of its versions is served here
                self._cache[key] = None
            elif exc.forbidden:
                if (api_group, kind) not in self._warned:
                    self._warned.add((api_group, kind))
                    log.error("cannot read gang group objects: the node may not read them; grant the "
                              "ClusterRole in plugins/gang/deploy/rbac.yaml", group=api_group, kind=kind,
                              error=str(exc))
                self._cache[key] = None
            else:
                # Keep what we had; ask again next time.
                log.warning("reading a gang group object failed", group=api_group, kind=kind,
                            namespace=namespace, name=name, error=str(exc))
        except TimeoutError:
            log.warning("reading a gang group object timed out", group=api_group, kind=kind,
                        namespace=namespace, name=name)
