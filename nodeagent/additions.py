"""What prepare stages contribute to containers: mounts, devices, CDI devices, environment.

Volumes, devices (DRA/CDI) and other prepare stages do not build container configs; they add
to the pod's :data:`CONTAINER_ADDITIONS` in the stash, and the stage that creates containers
merges them into each ContainerConfig. This keeps each concern in its own stage while the
runtime stage stays the only caller of CreateContainer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from cri import types as t
from nodeagent.stash import Stash, StashKey

ALL_CONTAINERS = "*"


@dataclass(frozen=True)
class ApiEnv:
    """What a container's environment takes from the API (envFrom, configMapKeyRef,
    secretKeyRef), read by the apivolumes stage so that the env builder stays a pure function
    (nodeagent/kube/env.py container_env)."""

    env_from: dict[str, str] = field(default_factory=dict)
    """envFrom merged in order, prefixes applied; the container's env entries override it."""
    values: dict[tuple[str, str, str], str] = field(default_factory=dict)
    """("ConfigMap" | "Secret", object name, key) → value. A reference absent here was
    optional and its object or key missing: the variable is not set (the kubelet's rule)."""
    error: str = ""
    """A required object or key is missing (or could not be read): the kubelet's message; the
    container cannot be created (CreateContainerConfigError) until it is resolved."""
    services: Mapping[str, str] = field(default_factory=dict)
    """Service variables (FOO_SERVICE_HOST, ...): the lowest precedence, visible to $(VAR)."""


@dataclass(frozen=True)
class VolumeBind:
    """A volumeMount the runtime stage binds itself at each creation of the container, instead
    of handing the runtime a path: a subPath (the container, or another of the pod, may have
    turned a component of it into a symlink since the last start), or a hostPath with a type
    (what was checked must be what is mounted). :mod:`nodeagent.volumebind` opens it without
    following a symlink out of the volume, bind-mounts the opened object under
    ``<pod dir>/volume-subpaths/<volume>/<container>/<index>`` and gives that path to the
    runtime as the mount's host path."""

    volume: str
    index: int
    """The volumeMount's index in the container's volumeMounts (the kubelet's target name)."""
    volume_path: str
    """The volume's host path: its directory under the pod directory, or the hostPath."""
    sub_path: str = ""
    """Relative to the volume, already expanded (subPathExpr) and free of ``..``; "" is the volume."""
    host_path_type: str | None = None
    """A hostPath volume's type ("" for none); None for volumes under the pod directory."""
    container_path: str = ""
    readonly: bool = False
    propagation: t.MountPropagation = t.MountPropagation.PROPAGATION_PRIVATE


@dataclass
class ContainerAdditions:
    mounts: list[t.Mount] = field(default_factory=list)
    binds: list[VolumeBind] = field(default_factory=list)
    """Mounts made at each creation of the container (merged after ``mounts``)."""
    devices: list[t.Device] = field(default_factory=list)
    cdi_devices: list[t.CDIDevice] = field(default_factory=list)
    envs: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    api_env: ApiEnv | None = None
    """None: nothing was read from the API for this container (standalone mode)."""
    contributed_by: set[str] = field(default_factory=set)


CONTAINER_ADDITIONS = StashKey[dict[str, ContainerAdditions]]("core.container_additions")
"""Container name (or ``"*"`` for every container) → what stages added for it."""


def additions_for(stash: Stash, container: str) -> ContainerAdditions:
    """The merged additions for ``container``: those for every container, then its own."""
    table = stash.get(CONTAINER_ADDITIONS, {})
    merged = ContainerAdditions()
    for key in (ALL_CONTAINERS, container):
        part = table.get(key)
        if part is None:
            continue
        merged.mounts.extend(part.mounts)
        merged.binds.extend(part.binds)
        merged.devices.extend(part.devices)
        merged.cdi_devices.extend(part.cdi_devices)
        merged.envs.update(part.envs)
        merged.annotations.update(part.annotations)
        if part.api_env is not None:
            merged.api_env = part.api_env
        merged.contributed_by |= part.contributed_by
    return merged


def add_mounts(entry: ContainerAdditions, mounts: Iterable[t.Mount | VolumeBind]) -> None:
    """Mounts by path to ``mounts``, binds to ``binds``."""
    for m in mounts:
        if isinstance(m, VolumeBind):
            entry.binds.append(m)
        else:
            entry.mounts.append(m)


def remove_mounts(entry: ContainerAdditions, mounts: Collection[t.Mount | VolumeBind]) -> None:
    entry.mounts[:] = [m for m in entry.mounts if m not in mounts]
    entry.binds[:] = [b for b in entry.binds if b not in mounts]


def contribute(stash: Stash, stage: str, container: str = ALL_CONTAINERS) -> ContainerAdditions:
    """The entry a stage fills for ``container``; calling it again returns the same entry, so a
    stage that runs again (RETRY, agent restart) should clear what it added before re-adding."""
    table = stash.setdefault(CONTAINER_ADDITIONS, {})
    entry = table.setdefault(container, ContainerAdditions())
    entry.contributed_by.add(stage)
    return entry
