"""ResourceClaims the node knows about: the part of resource.k8s.io/v1 that DRA preparation reads,
and the store that sources fill and the ``dra`` stage reads.

The kubelet GETs a pod's ResourceClaims from the API server when it prepares them. Standalone,
there is no API server and no scheduler: ResourceClaim manifests, with the allocation the
scheduler would have written into their status, sit beside the pod manifests, and the static
source keeps them here (in cluster mode the dra stage GETs an API pod's claims itself, as the
kubelet does: a node may get them but not list or watch them). A store rather than
events on the bus, because preparation asks "what does claim ns/name say *now*?" — a lookup of
the latest state, like the kubelet's GET — and a stage that starts later needs the whole set,
not the changes it missed.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from nodeagent.model import ObjectMeta, _ApiModel

API_GROUP = "resource.k8s.io"
API_VERSIONS = frozenset({"resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"})
"""Allocation results have the same shape in these versions (devices.results[])."""


class DeviceRequestAllocationResult(_ApiModel):
    request: str
    """The request of the claim this device was allocated for (``req`` or ``req/subrequest``)."""
    driver: str
    pool: str
    device: str


class DeviceAllocationResult(_ApiModel):
    results: list[DeviceRequestAllocationResult] = Field(default_factory=list)


class AllocationResult(_ApiModel):
    devices: DeviceAllocationResult = Field(default_factory=DeviceAllocationResult)


class ResourceClaimConsumerReference(_ApiModel):
    api_group: str = ""
    resource: str = "pods"
    name: str = ""
    uid: str = ""


class ResourceClaimStatus(_ApiModel):
    allocation: AllocationResult | None = None
    reserved_for: list[ResourceClaimConsumerReference] = Field(default_factory=list)


class ResourceClaim(_ApiModel):
    api_version: str = "resource.k8s.io/v1"
    kind: str = "ResourceClaim"
    metadata: ObjectMeta
    spec: dict[str, object] = Field(default_factory=dict)
    """Requests and selectors: the scheduler's business; the node only reads the allocation."""
    status: ResourceClaimStatus = Field(default_factory=ResourceClaimStatus)

    @property
    def key(self) -> tuple[str, str]:
        return self.metadata.namespace, self.metadata.name

    def drivers(self) -> list[str]:
        """The drivers of the allocated devices, in allocation order, once each."""
        if self.status.allocation is None:
            return []
        return list(dict.fromkeys(r.driver for r in self.status.allocation.devices.results))


class ClaimStore:
    """The latest ResourceClaims per source (``file``, ``api``), looked up by namespace/name."""

    def __init__(self) -> None:
        self._by_origin: dict[str, dict[tuple[str, str], ResourceClaim]] = {}

    def replace(self, origin: str, claims: Iterable[ResourceClaim]) -> None:
        """Everything ``origin`` knows now (a source's full listing)."""
        self._by_origin[origin] = {c.key: c for c in claims}

    def get(self, namespace: str, name: str) -> ResourceClaim | None:
        for claims in self._by_origin.values():
            found = claims.get((namespace, name))
            if found is not None:
                return found
        return None

    def all(self) -> list[ResourceClaim]:
        return [c for claims in self._by_origin.values() for c in claims.values()]
