"""downwardAPI volume files (pkg/volume/downwardapi): each item's value from the pod's metadata
or a container's resources, with its mode; shared by downwardAPI and projected volumes."""

from __future__ import annotations

from nodeagent.kube.env import FieldError, PodFacts, metadata_value, resource_value
from nodeagent.model import Container, DownwardAPIVolumeSource, Pod


def downward_payload(volume: DownwardAPIVolumeSource, pod: Pod, facts: PodFacts) -> dict[str, tuple[str, int]]:
    """Relative path → (content, mode) for every item."""
    payload: dict[str, tuple[str, int]] = {}
    default_container: Container = pod.all_containers()[0]
    for item in volume.items:
        mode = item.mode if item.mode is not None else volume.default_mode
        if item.field_ref is not None:
            content = metadata_value(pod, item.field_ref.field_path)
        elif item.resource_field_ref is not None:
            content = resource_value(pod, default_container, item.resource_field_ref, facts)
        else:
            raise FieldError(f"downwardAPI item {item.path!r} names neither fieldRef nor resourceFieldRef")
        payload[item.path] = (content, mode)
    return payload
