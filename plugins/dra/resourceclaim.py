"""The part of a resource.k8s.io ResourceClaim that DRA preparation reads: the allocation the
scheduler wrote (which driver, pool and device serve which request) and whom it is reserved for.

Read from the object store: the API server's claims in cluster mode, the manifests beside the
static pods standalone (where nobody else allocates, so the writer puts the allocation in
``status``). The stage declares the kind with :meth:`ResourceClaim.check`, so a claim manifest
this model cannot read is rejected when its file is read, with the field and why.
"""

from __future__ import annotations

from pydantic import Field

from nodeagent.model import ObjectMeta, _ApiModel


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

    @classmethod
    def check(cls, obj: object) -> None:
        """Raises ValueError (pydantic's ValidationError) when ``obj`` is no claim we can read."""
        cls.model_validate(obj)

    def drivers(self) -> list[str]:
        """The drivers of the allocated devices, in allocation order, once each."""
        if self.status.allocation is None:
            return []
        return list(dict.fromkeys(r.driver for r in self.status.allocation.devices.results))


__all__ = ["ResourceClaim"]
