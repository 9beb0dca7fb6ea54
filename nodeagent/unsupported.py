"""Refuse, never ignore: a pod asking for something nodeagent does not implement, whose absence
would change what the pod gets — a volume, an isolation, a runtime — is rejected at admission
with a clear reason, as the kubelet refuses what it cannot honour, instead of running without it.

What is only informative, or only other components' business, stays a warning: the
``nodeagent.io/UnhonouredFields`` condition lists every field parsed and not acted upon
(nodeagent/model.py ``unhonoured_fields``). docs/ARCHITECTURE.md lists both kinds.

The test is on the unhonoured paths themselves: once nodeagent models a field (a PVC volume, a
runtime class), it is no longer unhonoured and no longer refused here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodeagent.model import Pod, unhonoured_fields

UNSUPPORTED_VOLUME = "UnsupportedVolume"
UNSUPPORTED_FIELD = "UnsupportedPodField"


@dataclass(frozen=True)
class Refusal:
    reason: str
    message: str


_VOLUME_SOURCE = re.compile(r"^spec\.volumes\[(\d+)\]\.(\w+)$")
# Paths (after list indexes are dropped) whose absence changes what the pod gets, and why.
_CONSEQUENTIAL = {
    "spec.runtimeClassName": "the pod would run under the default runtime handler instead of its runtime class",
    "spec.overhead": "the pod's runtime-class overhead would not be accounted for",
    "spec.ephemeralContainers.targetContainerName": "the debug container would not share the target's namespaces",
    "spec.resourceClaims.resourceClaim": "a device claim the pod asks for would be missing",
}


def refusal(pod: Pod) -> Refusal | None:
    """Why ``pod`` must not run on this node as it is, or None."""
    extra = pod.spec.model_extra or {}
    if extra.get("hostUsers") is False:
        return Refusal(UNSUPPORTED_FIELD, "spec.hostUsers: false asks for a user namespace, which nodeagent does "
                                          "not set up yet: the pod would run in the host's user namespace")
    sc = pod.spec.security_context
    if sc is not None and (sc.model_extra or {}).get("supplementalGroupsPolicy") == "Strict":
        return Refusal(UNSUPPORTED_FIELD, "spec.securityContext.supplementalGroupsPolicy: Strict is not "
                                          "implemented: the containers would keep the groups of their images")
    for path in unhonoured_fields(pod):
        volume = _VOLUME_SOURCE.match(path)
        if volume is not None:
            name = pod.spec.volumes[int(volume.group(1))].name
            return Refusal(UNSUPPORTED_VOLUME, f'volume "{name}" is a {volume.group(2)} volume, which nodeagent does '
                                               "not mount: the pod would run without it")
        general = re.sub(r"\[\d+\]", "", path)
        why = _CONSEQUENTIAL.get(general)
        if why is not None:
            return Refusal(UNSUPPORTED_FIELD, f"{path} is not implemented by nodeagent: {why}")
    return None


__all__ = ["Refusal", "UNSUPPORTED_FIELD", "UNSUPPORTED_VOLUME", "refusal"]
