"""Refuse, never ignore (issue 15 §7): a pod asking for something nodeagent does not implement,
whose absence would change what it gets, is refused with a reason naming the field; what is
harmless stays a reported field and the pod runs."""

from __future__ import annotations

from typing import Any

import pytest

from cri import types as t
from nodeagent.model import Pod
from nodeagent.unsupported import UNSUPPORTED_FIELD, UNSUPPORTED_VOLUME, refusal


def _pod(**spec: Any) -> Pod:
    container = spec.pop("container", {})
    return Pod.model_validate({"metadata": {"name": "p", "uid": "u"},
                               "spec": {"containers": [{"name": "c", "image": "i", **container}], **spec}})


@pytest.mark.parametrize(("spec", "reason", "words"), [
    ({"volumes": [{"name": "nfs", "nfs": {"server": "s", "path": "/"}}]}, UNSUPPORTED_VOLUME, "nfs volume"),
    ({"volumes": [{"name": "disk", "iscsi": {"targetPortal": "t", "iqn": "i", "lun": 0}}]}, UNSUPPORTED_VOLUME,
     'volume "disk" is a iscsi volume'),
    ({"securityContext": {"supplementalGroupsPolicy": "Strict"}}, UNSUPPORTED_FIELD, "supplementalGroupsPolicy"),
])
def test_what_the_pod_would_run_without_is_refused(spec: dict[str, Any], reason: str, words: str) -> None:
    refused = refusal(_pod(**spec))
    assert refused is not None and refused.reason == reason and words in refused.message, refused


@pytest.mark.parametrize("spec", [
    {"hostUsers": True},
    # honoured since issue 15 §3/§4: the runtime stage resolves the class and sets up the user
    # namespace, or fails the sandbox with the kubelet's reason (tests/test_runtimeclass.py)
    {"hostUsers": False},
    {"runtimeClassName": "gvisor", "overhead": {"cpu": "10m"}},
    {"schedulingGates": [{"name": "g"}]},
    {"securityContext": {"supplementalGroupsPolicy": "Merge"}},
    {"volumes": [{"name": "v", "emptyDir": {}}]},
    {"volumes": [{"name": "v", "configMap": {"name": "x"}}]},  # modelled: the apivolumes stage's business
    # modelled: the csi stage's business (it refuses standalone, and waits for what is missing)
    {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]},
    {"volumes": [{"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]},
    {"volumes": [{"name": "inline", "csi": {"driver": "d"}}]},
    {"volumes": [{"name": "b", "persistentVolumeClaim": {"claimName": "c"}}],
     "container": {"volumeDevices": [{"name": "b", "devicePath": "/dev/b"}]}},
])
def test_what_is_harmless_or_honoured_is_not(spec: dict[str, Any]) -> None:
    assert refusal(_pod(**spec)) is None


CONTAINERD_16 = t.VersionInfo(runtime_name="containerd", runtime_version="1.6.20~ds1")
CONTAINERD_24 = t.VersionInfo(runtime_name="containerd", runtime_version="v2.4.2+unknown")


def test_an_image_volume_is_refused_only_where_the_runtime_cannot_mount_it() -> None:
    # containerd before 2.1 ignores CRI Mount.image: every CreateContainer would fail.
    mounted = _pod(volumes=[{"name": "img", "image": {"reference": "busybox"}}],
                   container={"volumeMounts": [{"name": "img", "mountPath": "/img"}]})
    refused = refusal(mounted, CONTAINERD_16)
    assert refused is not None and refused.reason == UNSUPPORTED_VOLUME, refused
    assert refused.message == ('volume "img" is an image volume, which the runtime (containerd 1.6.20~ds1) '
                               "cannot mount: image volumes need containerd 2.1 or later")
    assert refusal(mounted, CONTAINERD_24) is None
    assert refusal(mounted, t.VersionInfo(runtime_name="containerd", runtime_version="2.0.5")) is not None
    assert refusal(mounted, t.VersionInfo(runtime_name="cri-o", runtime_version="1.34.0")) is None
    assert refusal(mounted) is None  # the model alone: image volumes are implemented
    # A volume no container mounts changes nothing the pod gets (the kubelet only pulls it).
    unmounted = _pod(volumes=[{"name": "img", "image": {"reference": "busybox"}}])
    assert refusal(unmounted, CONTAINERD_16) is None
