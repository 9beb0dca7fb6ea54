"""Refuse, never ignore (issue 15 §7): a pod asking for something nodeagent does not implement,
whose absence would change what it gets, is refused with a reason naming the field; what is
harmless stays a reported field and the pod runs."""

from __future__ import annotations

from typing import Any

import pytest

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
    ({"volumes": [{"name": "img", "image": {"reference": "busybox"}}]}, UNSUPPORTED_VOLUME, "image volume"),
    ({"runtimeClassName": "gvisor"}, UNSUPPORTED_FIELD, "spec.runtimeClassName is not implemented"),
    ({"hostUsers": False}, UNSUPPORTED_FIELD, "user namespace"),
    ({"securityContext": {"supplementalGroupsPolicy": "Strict"}}, UNSUPPORTED_FIELD, "supplementalGroupsPolicy"),
])
def test_what_the_pod_would_run_without_is_refused(spec: dict[str, Any], reason: str, words: str) -> None:
    refused = refusal(_pod(**spec))
    assert refused is not None and refused.reason == reason and words in refused.message, refused


@pytest.mark.parametrize("spec", [
    {"hostUsers": True},
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
