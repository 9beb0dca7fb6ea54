"""What a pod needs from the API server: the volumes and env references this stage resolves,
and their field paths (reported as unhonoured when there is no API server), imagePullSecrets
among them (the runtime stage reads those, plugins/runtime/pullsecrets.py)."""

from __future__ import annotations

from nodeagent.model import Pod, Volume
from plugins.apivolumes.envsources import uses_api
from plugins.apivolumes.payload import plugin_dir


def api_volumes(pod: Pod) -> list[Volume]:
    """The configMap, secret and projected volumes some container mounts. The kubelet ignores
    volumes no container mounts (its desired-state populator skips them)."""
    mounted = {m.name for c in pod.all_containers() for m in c.volume_mounts}
    return [v for v in pod.spec.volumes if plugin_dir(v) is not None and v.name in mounted]


def api_fields(pod: Pod) -> list[str]:
    """Paths of every field that needs the API, named as unhonoured_fields names them."""
    found = [f"spec.volumes[{i}].{alias}" for i, v in enumerate(pod.spec.volumes)
             for alias, value in (("configMap", v.config_map), ("secret", v.secret), ("projected", v.projected))
             if value is not None]
    for group, containers in (("initContainers", pod.spec.init_containers), ("containers", pod.spec.containers)):
        for j, c in enumerate(containers):
            if c.env_from:
                found.append(f"spec.{group}[{j}].envFrom")
            for k, var in enumerate(c.env):
                source = var.value_from
                if source is not None and source.config_map_key_ref is not None:
                    found.append(f"spec.{group}[{j}].env[{k}].valueFrom.configMapKeyRef")
                if source is not None and source.secret_key_ref is not None:
                    found.append(f"spec.{group}[{j}].env[{k}].valueFrom.secretKeyRef")
    # Read by the runtime stage; listed here so that a standalone agent reports them with the
    # rest (one stage owns the unhonoured-fields condition). Empty names are ignored, as the
    # kubelet ignores them.
    found += [f"spec.imagePullSecrets[{i}]" for i, ref in enumerate(pod.spec.image_pull_secrets) if ref.name]
    return found


def needs_api(pod: Pod) -> bool:
    return bool(api_volumes(pod)) or any(uses_api(c) for c in pod.all_containers())
