"""A container's volumeMounts to CRI mounts (kubelet_pods.go makeMounts): the volume's host
path, or — for a subPath, or a hostPath with a type — what the runtime stage binds safely at
each container start (nodeagent/volumebind.py), readOnly, and mount propagation."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cri import types as t
from nodeagent.additions import VolumeBind
from nodeagent.kube.env import expand
from nodeagent.model import Container, VolumeMount

PROPAGATION = {
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
    host_path_type: str | None = None
    """A hostPath volume's type ("" for none); None for the volumes under the pod directory."""


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


def check_sub_path(sub: str) -> None:
    """What the spec alone can tell (makeMounts): the rest — symlinks, missing directories — is
    decided on the volume itself at each container start (nodeagent/volumebind.py)."""
    if os.path.isabs(sub):
        raise MountConfigError(f"error SubPath `{sub}` must not be an absolute path")
    if ".." in sub.split("/"):
        raise MountConfigError(f"unable to provision SubPath `{sub}`: must not contain '..'")


def resolve_recursive_read_only(mount: VolumeMount, runtime_supports: bool) -> bool:
    """resolveRecursiveReadOnly: whether the mount is made recursively read-only (its submounts
    too), or MountConfigError for a mode the mount or the runtime handler cannot have."""
    mode = mount.recursive_read_only
    if mode is None or mode == "Disabled":
        return False
    if not mount.read_only:
        raise MountConfigError(f"volume {mount.name!r} requested recursive read-only mode, but it is not read-only")
    if mount.mount_propagation not in (None, "None"):
        raise MountConfigError(f"volume {mount.name!r} requested recursive read-only mode, but it is not compatible "
                               f"with propagation {mount.mount_propagation!r}")
    if mode == "Enabled" and not runtime_supports:
        raise MountConfigError(f"volume {mount.name!r} requested recursive read-only mode, but it is not supported "
                               "by the runtime")
    return runtime_supports


def wants_recursive_read_only(container: Container) -> bool:
    return any(m.recursive_read_only not in (None, "Disabled") for m in container.volume_mounts)


def with_recursive_read_only(container: Container, mounts: Sequence[t.Mount],
                             runtime_supports: bool) -> tuple[list[t.Mount], set[str]]:
    """``mounts`` with CRI's recursive_read_only set where the container's volumeMount (found by
    its mount path, unique in a container) resolves to it; and the mount paths it was set on.
    Raises MountConfigError as :func:`resolve_recursive_read_only`."""
    by_path = {m.mount_path: m for m in container.volume_mounts}
    out, made = [], set()
    for mount in mounts:
        spec = by_path.get(mount.container_path)
        if spec is not None and resolve_recursive_read_only(spec, runtime_supports):
            mount = replace(mount, recursive_read_only=True)
            made.add(mount.container_path)
        out.append(mount)
    return out, made


def container_mounts(container: Container, volumes: Mapping[str, PreparedVolume | None],
                     env: Mapping[str, str]) -> list[t.Mount | VolumeBind]:
    """``volumes`` maps every volume of the pod to its prepared form, or to None for a volume
    this caller does not set up (its mounts are skipped: another stage's, or a source nodeagent
    does not implement and reports unhonoured). A subPath, and a hostPath with a type, become a
    :class:`VolumeBind` that the runtime stage binds at each start of the container; the rest
    are mounts by path (directories only the agent writes, or an unchecked hostPath)."""
    mounts: list[t.Mount | VolumeBind] = []
    for index, vm in enumerate(container.volume_mounts):
        if vm.name not in volumes:
            raise MountConfigError(f"cannot find volume \"{vm.name}\" to mount into container \"{container.name}\"")
        prepared = volumes[vm.name]
        if prepared is None:
            continue
        sub = sub_path_of(vm, env)
        if sub:
            check_sub_path(sub)
        readonly = vm.read_only or prepared.read_only
        propagation = PROPAGATION[vm.mount_propagation]
        if sub or prepared.host_path_type:
            mounts.append(VolumeBind(volume=vm.name, index=index, volume_path=str(prepared.host_path), sub_path=sub,
                                     host_path_type=prepared.host_path_type, container_path=vm.mount_path,
                                     readonly=readonly, propagation=propagation))
            continue
        mounts.append(t.Mount(container_path=vm.mount_path, host_path=str(prepared.host_path), readonly=readonly,
                              propagation=propagation))
    return mounts
