"""The ResourceClaims of a pod, read from the object store when the pod is prepared: from the
API server in cluster mode, from the manifests beside the static pods standalone.

The kubelet GETs each claim from the API server in prepareResources, every time, rather than
watching: the node's credentials may not list or watch ResourceClaims at all. The Node authorizer
allows a node to ``get`` exactly the claims referenced by pods bound to it (by
``spec.resourceClaims[].resourceClaimName``, or through ``status.resourceClaimStatuses`` for
claims made from templates); everything else is forbidden. So: one GET per claim per attempt, and
nothing is cached — a retry must see the allocation and reservation the scheduler wrote since.

Claims made from a ResourceClaimTemplate are named in the pod's status by the controller-manager.
The pod object a worker holds is the one the API source last published, and the source publishes
spec changes only; when that copy does not name the claim yet, the pod's status is read again
here.
"""

from __future__ import annotations

from typing import Any

from nodeagent.model import Pod
from nodeagent.objects import ObjectError, kinds
from plugins.dra.claims import ClaimNotReady, claim_name, claim_names
from plugins.dra.resourceclaim import ResourceClaim


class FetchedClaims:
    """What one read found: claims by (namespace, name); a name not here was not found."""

    def __init__(self, claims: dict[tuple[str, str], ResourceClaim]) -> None:
        self._claims = claims

    def get(self, namespace: str, name: str) -> ResourceClaim | None:
        return self._claims.get((namespace, name))


async def with_claim_statuses(objects: Any, pod: Pod) -> Pod:
    """``pod``, with the status the API server has now if ours does not yet name every claim
    made from a template (the status changed after the spec we were given)."""
    try:
        for entry in pod.spec.resource_claims:
            claim_name(pod, entry.name)
        return pod
    except ClaimNotReady:
        pass
    try:
        fresh = await objects.get(kinds.POD, pod.metadata.name, pod.metadata.namespace, max_age=0)
    except ObjectError as exc:
        raise ClaimNotReady(f"cannot read pod {pod.metadata.namespace}/{pod.metadata.name}: {exc}") from None
    if fresh is None or (fresh.get("metadata") or {}).get("uid") != pod.uid:
        return pod  # gone, or re-created under the same name: the old pod's worker must not take its claims
    status = fresh.get("status") or {}
    return pod.model_copy(update={"status": {**pod.status, "resourceClaimStatuses":
                                             status.get("resourceClaimStatuses") or []}})


async def fetch(objects: Any, pod: Pod) -> FetchedClaims:
    """GET each claim the pod names (never from a cache: a retry must see what the scheduler
    wrote since). Not found is left to the checks (their message); any other failure
    (forbidden, the API server away) is a ClaimNotReady: the pod waits and retries."""
    namespace = pod.metadata.namespace
    found: dict[tuple[str, str], ResourceClaim] = {}
    for _, name in claim_names(pod):
        try:
            obj = await objects.get(kinds.RESOURCE_CLAIM, name, namespace, max_age=0)
        except ObjectError as exc:
            raise ClaimNotReady(f"failed to fetch ResourceClaim {namespace}/{name}: {exc}") from None
        if obj is not None:
            found[(namespace, name)] = ResourceClaim.model_validate(obj)
    return FetchedClaims(found)


__all__ = ["FetchedClaims", "fetch", "with_claim_statuses"]
