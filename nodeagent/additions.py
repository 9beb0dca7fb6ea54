"""What prepare stages contribute to containers: mounts, devices, CDI devices, environment.

Volumes, devices (DRA/CDI) and other prepare stages do not build container configs; they add
to the pod's :data:`CONTAINER_ADDITIONS` in the stash, and the stage that creates containers
merges them into each ContainerConfig. This keeps each concern in its own stage while the
runtime stage stays the only caller of CreateContainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cri import types as t
from nodeagent.stash import Stash, StashKey

ALL_CONTAINERS = "*"


@dataclass(frozen=True)
class ApiEnv:
    """What a container's environment takes from the API (envFrom, configMapKeyRef,
    secretKeyRef), read by the apivolumes stage so that the env builder stays a pure function
    (plugins/runtime/env.py container_env)."""

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


@dataclass
class ContainerAdditions:
    mounts: list[t.Mount] = field(default_factory=list)
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
        merged.devices.extend(part.devices)
        merged.cdi_devices.extend(part.cdi_devices)
        merged.envs.update(part.envs)
        merged.annotations.update(part.annotations)
        if part.api_env is not None:
            merged.api_env = part.api_env
        merged.contributed_by |= part.contributed_by
    return merged


def contribute(stash: Stash, stage: str, container: str = ALL_CONTAINERS) -> ContainerAdditions:
    """The entry a stage fills for ``container``; calling it again returns the same entry, so a
    stage that runs again (RETRY, agent restart) should clear what it added before re-adding."""
    table = stash.setdefault(CONTAINER_ADDITIONS, {})
    entry = table.setdefault(container, ContainerAdditions())
    entry.contributed_by.add(stage)
    return entry
