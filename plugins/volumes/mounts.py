"""A container's volumeMounts to CRI mounts (kubelet_pods.go makeMounts): the volume's host
path, or a subPath inside it (created with the volume's mode when missing, and never allowed
to leave the volume), readOnly, and mount propagation."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cri import types as t
from nodeagent.model import Container, VolumeMount
from plugins.runtime.env import expand

_PROPAGATION = {
    None: t.MountPropagation.PROPAGATION_PRIVATE,
    "None": t.MountPropagation.PROPAGATION_PRIVATE,
    "HostToContainer": t.MountPropagation.PROPAGATION_HOST_TO_CONTAINER,
    "Bidirectional": t.MountPropagation.PROPAGATION_BIDIRECTIONAL,
}


class MountConfigError(ValueError):
    """A mount the container cannot get: the kubelet's CreateContainerConfigError."""


@dataclass(frozen=True)
class PreparedVolume:
    host_path: Path
    read_only: bool = False
    """Volumes the kubelet always mounts read-only (downwardAPI)."""


def sub_path_of(mount: VolumeMount, env: Mapping[str, str]) -> str:
    """subPath, or subPathExpr expanded against the container's environment
    (ExpandContainerVolumeMounts: a reference to a missing or empty variable is an error)."""
    if not mount.sub_path_expr:
        return mount.sub_path
    missing: set[str] = set()

    def lookup(name: str) -> str:
        value = env.get(name, "")
        if not value:
            missing.add(name)
        return value

    expanded = expand(mount.sub_path_expr, lookup)
    if missing:
        raise MountConfigError(f"missing value for {', '.join(sorted(missing))}")
    return expanded


def _sub_path(volume: Path, sub: str) -> Path:
    if os.path.isabs(sub):
        raise MountConfigError(f"error SubPath `{sub}` must not be an absolute path")
    if ".." in sub.split("/"):
        raise MountConfigError(f"unable to provision SubPath `{sub}`: must not contain '..'")
    path = volume / sub
    if not path.exists() and not path.is_symlink():
        # Created now, with the volume's mode, so that the runtime does not create it later
        # with its own (the kubelet's reason too).
        path.mkdir(mode=stat.S_IMODE(volume.stat().st_mode), parents=True, exist_ok=True)
        os.chmod(path, stat.S_IMODE(volume.stat().st_mode))
    real, root = path.resolve(), volume.resolve()
    if real != root and root not in real.parents:
        # A symlink inside the volume must not lead the bind mount out of it.
        raise MountConfigError(f"subpath {sub!r} of volume {volume} resolves outside the volume")
    return real


def container_mounts(container: Container, volumes: Mapping[str, PreparedVolume | None],
                     env: Mapping[str, str]) -> list[t.Mount]:
    """``volumes`` maps every volume of the pod to its prepared form, or to None for a volume
    nodeagent does not implement (its mounts are skipped; the field is reported unhonoured)."""
    mounts: list[t.Mount] = []
    for vm in container.volume_mounts:
        if vm.name not in volumes:
            raise MountConfigError(f"cannot find volume \"{vm.name}\" to mount into container \"{container.name}\"")
        prepared = volumes[vm.name]
        if prepared is None:
            continue
        host_path = prepared.host_path
        sub = sub_path_of(vm, env)
        if sub:
            host_path = _sub_path(host_path, sub)
        mounts.append(t.Mount(
            container_path=vm.mount_path,
            host_path=str(host_path),
            readonly=vm.read_only or prepared.read_only,
            propagation=_PROPAGATION[vm.mount_propagation],
        ))
    return mounts
