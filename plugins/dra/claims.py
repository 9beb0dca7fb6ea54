"""Which ResourceClaims a pod needs, and whether it may use them now (the kubelet's checks in
pkg/kubelet/cm/dra/manager.go prepareResources, with its messages).

Two sets of rules: a pod from the API server (cluster mode) gets the kubelet's, strictly — the
claim must list the pod's UID in ``reservedFor`` (the scheduler reserved it), and a claim made
from a template must be owned by the pod. A static pod's claims are manifests nobody reserved
for a UID the writer could not know, so they are checked loosely (see :func:`_reserved_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from nodeagent.model import Pod
from plugins.dra.resourceclaim import ResourceClaim


class ClaimLookup(Protocol):
    """Where claims are looked up: what was just read from the object store for this pod."""

    def get(self, namespace: str, name: str) -> ResourceClaim | None: ...


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


def claim_names(pod: Pod) -> list[tuple[str, str]]:
    """(entry name, ResourceClaim name) for each entry of spec.resourceClaims that needs a claim."""
    found = []
    for entry in pod.spec.resource_claims:
        name = claim_name(pod, entry.name)
        if name is not None:
            found.append((entry.name, name))
    return found


def pod_claims(pod: Pod, store: ClaimLookup, node_name: str, *, from_api: bool = False) -> list[PodClaim]:
    """The pod's claims, each allocated and reserved for the pod (``from_api``: strictly, by UID;
    otherwise only when its reservedFor says anything); raises ClaimNotReady with the kubelet's
    message otherwise."""
    namespace = pod.metadata.namespace
    found = []
    for entry_name, name in claim_names(pod):
        claim = store.get(namespace, name)
        if claim is None:
            where = ("" if from_api else
                     " (standalone: put a ResourceClaim manifest with its allocation in staticPodPath)")
            raise ClaimNotReady(f"failed to fetch ResourceClaim {namespace}/{name}: not found{where}")
        entry = next(c for c in pod.spec.resource_claims if c.name == entry_name)
        if from_api and entry.resource_claim_name is None and not _owned_by(claim, pod):
            # A claim of the template's name that the controller did not make for this pod
            # (a leftover, or someone else's): using it would hand this pod another's devices.
            raise ClaimNotReady(f"ResourceClaim {namespace}/{name} ({claim.metadata.uid}) was not created for "
                                f"pod {pod.metadata.name} ({pod.uid})")
        if claim.status.allocation is None:
            raise ClaimNotReady(f"claim {namespace}/{name}: not allocated")
        reserved = (_reserved_by_uid(claim, pod) if from_api
                    else not claim.status.reserved_for or _reserved_for(claim, pod, node_name))
        if not reserved:
            raise ClaimNotReady(f"pod {pod.metadata.name} ({pod.uid}) is not allowed to use ResourceClaim "
                                f"{namespace}/{name} ({claim.metadata.uid})")
        found.append(PodClaim(entry_name, claim))
    return found


def _owned_by(claim: ResourceClaim, pod: Pod) -> bool:
    return any(ref.get("uid") == pod.uid and ref.get("controller") is True and ref.get("kind") == "Pod"
               for ref in claim.metadata.owner_references)


def _reserved_by_uid(claim: ResourceClaim, pod: Pod) -> bool:
    return any(ref.resource == "pods" and ref.api_group in ("", "core") and ref.uid == pod.uid
               for ref in claim.status.reserved_for)


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
