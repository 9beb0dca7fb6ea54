"""Which ResourceClaims a pod needs, and whether it may use them now (the kubelet's checks in
pkg/kubelet/cm/dra/manager.go prepareResources, with its messages)."""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.claims import ClaimStore, ResourceClaim
from nodeagent.model import Pod


class ClaimNotReady(Exception):
    """The pod cannot be prepared yet: the message says which claim and why."""


@dataclass(frozen=True)
class PodClaim:
    pod_claim: str
    """The entry's name in pod.spec.resourceClaims (what containers' resources.claims name)."""
    claim: ResourceClaim

    @property
    def uid(self) -> str:
        return self.claim.metadata.uid

    @property
    def key(self) -> str:
        return f"{self.claim.metadata.namespace}/{self.claim.metadata.name}"


def claim_name(pod: Pod, entry_name: str) -> str | None:
    """The ResourceClaim an entry of spec.resourceClaims names: directly, or (made from a template)
    through status.resourceClaimStatuses, where a null name means "no claim needed". Raises
    ClaimNotReady while the claim for a template has not been made."""
    entry = next(c for c in pod.spec.resource_claims if c.name == entry_name)
    if entry.resource_claim_name is not None:
        return entry.resource_claim_name
    for status in pod.status.get("resourceClaimStatuses") or []:
        if isinstance(status, dict) and status.get("name") == entry_name:
            name = status.get("resourceClaimName")
            return name if isinstance(name, str) and name else None
    raise ClaimNotReady(f"pod {pod.metadata.namespace}/{pod.metadata.name}: the ResourceClaim for "
                        f"{entry_name!r} (template {entry.resource_claim_template_name}) is not created yet: "
                        "status.resourceClaimStatuses has no entry for it")


def pod_claims(pod: Pod, store: ClaimStore, node_name: str) -> list[PodClaim]:
    """The pod's claims, each allocated and (when its reservedFor says anything) reserved for the
    pod; raises ClaimNotReady with the kubelet's message otherwise."""
    namespace = pod.metadata.namespace
    found = []
    for entry in pod.spec.resource_claims:
        name = claim_name(pod, entry.name)
        if name is None:
            continue
        claim = store.get(namespace, name)
        if claim is None:
            raise ClaimNotReady(f"failed to fetch ResourceClaim {namespace}/{name}: not found "
                                "(standalone: put a ResourceClaim manifest with its allocation in staticPodPath)")
        if claim.status.allocation is None:
            raise ClaimNotReady(f"claim {namespace}/{name}: not allocated")
        if claim.status.reserved_for and not _reserved_for(claim, pod, node_name):
            raise ClaimNotReady(f"pod {pod.metadata.name} ({pod.uid}) is not allowed to use ResourceClaim "
                                f"{namespace}/{name} ({claim.metadata.uid})")
        found.append(PodClaim(entry.name, claim))
    return found


def _reserved_for(claim: ResourceClaim, pod: Pod, node_name: str) -> bool:
    # A static pod's UID derives from its manifest and its name gets "-<node>", which whoever
    # wrote the claim could not know: a reservation by the manifest's pod name counts too.
    names = {pod.metadata.name, pod.metadata.name.removesuffix(f"-{node_name.lower()}")}
    for ref in claim.status.reserved_for:
        if ref.resource != "pods" or ref.api_group not in ("", "core"):
            continue
        if ref.uid == pod.uid or (not ref.uid and ref.name in names):
            return True
    return False
