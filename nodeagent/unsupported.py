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

from cri import types as t
from nodeagent.model import Pod, unhonoured_fields

UNSUPPORTED_VOLUME = "UnsupportedVolume"
UNSUPPORTED_FIELD = "UnsupportedPodField"
UNSUPPORTED_CGROUP_DRIVER = "UnsupportedCgroupDriver"


@dataclass(frozen=True)
class Refusal:
    reason: str
    message: str


# The first containerd whose CRI mounts images (Mount.image, containerd PR #10579, 2.1.0).
IMAGE_MOUNTS_SINCE = (2, 1)
_VERSION = re.compile(r"v?(\d+)\.(\d+)")

_VOLUME_SOURCE = re.compile(r"^spec\.volumes\[(\d+)\]\.(\w+)$")
# Paths (after list indexes are dropped) whose absence changes what the pod gets, and why.
_CONSEQUENTIAL = {
    "spec.ephemeralContainers.targetContainerName": "the debug container would not share the target's namespaces",
    "spec.resourceClaims.resourceClaim": "a device claim the pod asks for would be missing",
}


def mounts_images(runtime: t.VersionInfo | None) -> bool:
    """Whether the runtime's CRI mounts image volumes. containerd before 2.1 ignores
    ``Mount.image`` (an unknown field to it); other runtimes (CRI-O since 1.31) are trusted
    to say so themselves at CreateContainer."""
    if runtime is None or runtime.runtime_name != "containerd":
        return True
    found = _VERSION.match(runtime.runtime_version)
    return found is None or (int(found.group(1)), int(found.group(2))) >= IMAGE_MOUNTS_SINCE


def refusal(pod: Pod, runtime: t.VersionInfo | None = None, *, cgroup_driver: str = "cgroupfs") -> Refusal | None:
    """Why ``pod`` must not run on this node as it is, or None. ``runtime`` (the CRI Version
    answer) says what the runtime can do; None: assume it can. ``cgroup_driver`` is the node's
    (nodeagent/cgroupdriver.py)."""
    if cgroup_driver != "cgroupfs":
        # Pod cgroups are cgroupfs paths here: runc under the systemd driver refuses them.
        return Refusal(UNSUPPORTED_CGROUP_DRIVER, f"the runtime uses the {cgroup_driver} cgroup driver, which "
                                                  "nodeagent does not implement (its pod cgroups are cgroupfs "
                                                  "paths): the pod's sandbox could not be created")
    if not mounts_images(runtime):
        assert runtime is not None
        for vol in pod.spec.volumes:
            if vol.image is not None and any(m.name == vol.name for c in
                                                (*pod.all_containers(), *pod.spec.ephemeral_containers)
                                                for m in c.volume_mounts):
                # The kubelet would send the mount and the runtime would fail every
                # CreateContainer (CreateContainerError, forever); refused at once instead.
                return Refusal(UNSUPPORTED_VOLUME, f'volume "{vol.name}" is an image volume, which the runtime '
                                                   f"({runtime.runtime_name} {runtime.runtime_version}) cannot mount: "
                                                   "image volumes need containerd 2.1 or later")
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


__all__ = ["IMAGE_MOUNTS_SINCE", "UNSUPPORTED_CGROUP_DRIVER", "UNSUPPORTED_FIELD", "UNSUPPORTED_VOLUME", "Refusal",
           "mounts_images", "refusal"]
