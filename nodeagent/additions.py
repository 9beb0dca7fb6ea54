"""What prepare stages contribute to containers: mounts, devices, CDI devices, environment.

Volumes, devices (DRA/CDI) and other prepare stages do not build container configs; they set
their additions on the pod (``ctx.additions``: one entry per stage and container, or ``"*"``
for every container), and the stage that creates containers merges them into each
ContainerConfig. So each concern stays in its own stage while the runtime stage stays the
only caller of CreateContainer, and a stage withdraws exactly what it added (a retry, an
updated spec, its unprepare) without touching another's.

Two stages giving one container the same mount path, device path or env name with different
values is a conflict: the merge raises :class:`AdditionConflict` naming both, and the
container is not created (CreateContainerConfigError) rather than created with whichever won.

Who may add and who may read is declared like any per-pod fact: a stage that sets additions
lists :data:`CONTAINER_ADDITIONS` in ``provides``, the one that merges them in ``uses``.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cri import types as t
from nodeagent.facts import Fact, UndeclaredFact

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


CONTAINER_ADDITIONS = Fact[None]("core.containerAdditions",
                                 "mounts, devices, CDI devices and env prepare stages give containers "
                                 "(ctx.additions, per stage and container)")
"""The declaration marker for additions: provided by the stages that set them, used by the
stage that creates containers."""


class AdditionConflict(ValueError):
    """Two stages gave a container contradicting additions (the message names both)."""


class PodAdditions:
    """Every stage's additions for one pod: (stage, container) → ContainerAdditions."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], ContainerAdditions] = {}

    def set(self, stage: str, container: str, additions: ContainerAdditions) -> None:
        additions.contributed_by = {stage}
        self._entries[(stage, container)] = additions

    def get(self, stage: str, container: str) -> ContainerAdditions | None:
        return self._entries.get((stage, container))

    def withdraw(self, stage: str, container: str | None = None) -> None:
        for key in [k for k in self._entries if k[0] == stage and (container is None or k[1] == container)]:
            del self._entries[key]

    def stages(self) -> builtins.set[str]:
        """Stages that have additions left (the contract suite checks none leak)."""
        return {stage for stage, _ in self._entries}

    def merged(self, container: str) -> ContainerAdditions:
        """Everything for ``container``: the entries for every container, then its own, stage
        by stage in the order they were set; raises AdditionConflict on a contradiction."""
        merged = ContainerAdditions()
        owner: dict[tuple[str, str], tuple[str, object]] = {}

        def claim(what: str, key: str, value: object, stage: str) -> None:
            seen = owner.get((what, key))
            if seen is not None and seen[0] != stage and seen[1] != value:
                raise AdditionConflict(f"{what} {key!r} of container {container!r} is given by stages "
                                       f"{seen[0]!r} and {stage!r} differently")
            owner[(what, key)] = (stage, value)

        for (stage, target), part in self._entries.items():
            if target not in (ALL_CONTAINERS, container):
                continue
            for m in part.mounts:
                claim("mount path", m.container_path, m.host_path, stage)
            for b in part.binds:
                claim("mount path", b.container_path, (b.volume, b.sub_path), stage)
            for d in part.devices:
                claim("device path", d.container_path, d.host_path, stage)
            for key, value in part.envs.items():
                claim("env", key, value, stage)
            if part.api_env is not None:
                claim("API env", "", id(part.api_env), stage)
                merged.api_env = part.api_env
            merged.mounts.extend(part.mounts)
            merged.binds.extend(part.binds)
            merged.devices.extend(part.devices)
            merged.cdi_devices.extend(d for d in part.cdi_devices if d not in merged.cdi_devices)
            merged.envs.update(part.envs)
            merged.annotations.update(part.annotations)
            merged.contributed_by.add(stage)
        return merged


class AdditionsAccess:
    """``ctx.additions``: one stage's door to its pod's container additions."""

    def __init__(self, additions: PodAdditions, stage: str, provides: bool, uses: bool) -> None:
        self._additions = additions
        self._stage = stage
        self._provides = provides
        self._uses = uses

    def set(self, container: str, additions: ContainerAdditions) -> None:
        """This stage's additions for ``container`` (``"*"``: every container), replacing what
        it set there before."""
        self._check(self._provides, "sets")
        self._additions.set(self._stage, container, additions)

    def get(self, container: str) -> ContainerAdditions | None:
        """What this stage set for ``container``."""
        return self._additions.get(self._stage, container)

    def withdraw(self, container: str | None = None) -> None:
        """Take back what this stage added (for ``container``, or for all)."""
        self._additions.withdraw(self._stage, container)

    def merged(self, container: str) -> ContainerAdditions:
        """Every stage's additions for ``container`` (AdditionConflict on a contradiction)."""
        self._check(self._uses, "reads")
        return self._additions.merged(container)

    def _check(self, allowed: bool, verb: str) -> None:
        if not allowed:
            raise UndeclaredFact(f"stage {self._stage!r} {verb} container additions without declaring "
                                 f"{CONTAINER_ADDITIONS.name!r} (in provides to set, uses to read)")


def add_mounts(entry: ContainerAdditions, mounts: Iterable[t.Mount | VolumeBind]) -> None:
    """Mounts by path to ``mounts``, binds to ``binds``."""
    for m in mounts:
        if isinstance(m, VolumeBind):
            entry.binds.append(m)
        else:
            entry.mounts.append(m)
