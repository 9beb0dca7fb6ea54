"""CDI for runtimes that do not resolve it: read the CDI spec files (cncf-tags/container-device-
interface SPEC.md) and turn a device's containerEdits into what CRI can carry — environment,
device nodes, bind mounts.

containerd 1.6 has no CDI support and drops ContainerConfig.CDI_devices (an unknown field to
its CRI), so the DRA devices a driver describes in CDI would never reach the container. What CRI
cannot express (hooks, non-bind mounts, mount options beyond ro and propagation, a device node's
mode/owner, intelRdt, additionalGids, netDevices) is returned as ``skipped`` for the caller to
report: never dropped silently.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cri import types as t

_KIND = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_BIND = frozenset({"bind", "rbind"})
_PROPAGATION = {
    "rshared": t.MountPropagation.PROPAGATION_BIDIRECTIONAL, "shared": t.MountPropagation.PROPAGATION_BIDIRECTIONAL,
    "rslave": t.MountPropagation.PROPAGATION_HOST_TO_CONTAINER,
    "slave": t.MountPropagation.PROPAGATION_HOST_TO_CONTAINER,
    "rprivate": t.MountPropagation.PROPAGATION_PRIVATE, "private": t.MountPropagation.PROPAGATION_PRIVATE,
}
_UNEXPRESSIBLE = ("intelRdt", "additionalGids", "netDevices")


class CdiError(Exception):
    """A CDI device cannot be given to a container (unknown, ambiguous, or its spec is invalid)."""


@dataclass
class CriEdits:
    """containerEdits as CRI ContainerConfig parts."""

    envs: dict[str, str] = field(default_factory=dict)
    devices: list[t.Device] = field(default_factory=list)
    mounts: list[t.Mount] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Spec:
    path: str
    kind: str
    edits: dict[str, Any]
    devices: dict[str, dict[str, Any]]


def qualified_name(device_id: str) -> tuple[str, str]:
    """``vendor.com/class=name`` → (kind, name); raises CdiError."""
    kind, sep, name = device_id.partition("=")
    if not sep or not _KIND.match(kind) or not _NAME.match(name):
        raise CdiError(f"{device_id!r} is not a qualified CDI device name (vendor.com/class=name)")
    return kind, name


class CdiSpecs:
    """The devices of every spec file in ``dirs`` (lowest priority first, as containerd's
    cdi_spec_dirs): a device in a later directory overrides one in an earlier; the same device
    twice in one directory is a conflict, and unusable."""

    def __init__(self, dirs: Sequence[Path]) -> None:
        self.dirs = list(dirs)
        self._files: dict[str, tuple[tuple[int, int, int], _Spec | str]] = {}
        self._devices: dict[str, tuple[_Spec, dict[str, Any]]] = {}
        self._conflicts: dict[str, list[str]] = {}
        self._errors: dict[str, str] = {}

    def refresh(self) -> None:
        """Re-read what changed on disk (blocking: call it in a worker thread)."""
        files: dict[str, tuple[tuple[int, int, int], _Spec | str]] = {}
        devices: dict[str, tuple[_Spec, dict[str, Any]]] = {}
        conflicts: dict[str, list[str]] = {}
        for directory in self.dirs:
            in_dir: dict[str, str] = {}
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if not entry.name.endswith((".json", ".yaml")) or not entry.is_file():
                    continue
                st = entry.stat()
                signature = (st.st_mtime_ns, st.st_size, st.st_ino)
                cached = self._files.get(entry.path)
                spec = cached[1] if cached is not None and cached[0] == signature else _load(entry.path)
                files[entry.path] = (signature, spec)
                if isinstance(spec, str):
                    continue
                for name in spec.devices:
                    qualified = f"{spec.kind}={name}"
                    if qualified in in_dir:
                        conflicts.setdefault(qualified, [in_dir[qualified]]).append(spec.path)
                    in_dir[qualified] = spec.path
                    devices[qualified] = (spec, spec.devices[name])
        self._files, self._devices, self._conflicts = files, devices, conflicts
        self._errors = {path: spec for path, (_, spec) in files.items() if isinstance(spec, str)}

    def has(self, device_id: str) -> bool:
        return device_id in self._devices and device_id not in self._conflicts

    def resolve(self, device_ids: Sequence[str]) -> CriEdits:
        """The CRI edits for ``device_ids`` (spec-wide edits once per spec, then each device's);
        raises CdiError naming every device that cannot be resolved."""
        problems = []
        for device_id in device_ids:
            try:
                qualified_name(device_id)
            except CdiError as exc:
                problems.append(str(exc))
                continue
            if device_id in self._conflicts:
                problems.append(f"{device_id} is defined in several specs: {', '.join(self._conflicts[device_id])}")
            elif device_id not in self._devices:
                problems.append(f"{device_id} is in no CDI spec in {', '.join(map(str, self.dirs))}"
                                + (f" (invalid specs: {'; '.join(self._errors.values())})" if self._errors else ""))
        if problems:
            raise CdiError("unresolvable CDI devices: " + "; ".join(problems))
        out = CriEdits()
        seen_specs: set[str] = set()
        for device_id in dict.fromkeys(device_ids):
            spec, device = self._devices[device_id]
            if spec.path not in seen_specs:
                seen_specs.add(spec.path)
                _apply(spec.edits, f"{spec.path} containerEdits", out)
            _apply(device.get("containerEdits") or {}, device_id, out)
        return out


def _load(path: str) -> _Spec | str:
    """A parsed spec, or why it cannot be used."""
    try:
        text = Path(path).read_text()
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        return f"{path}: unreadable: {exc}"
    if not isinstance(data, dict):
        return f"{path}: not a mapping"
    if not isinstance(data.get("cdiVersion"), str):
        return f"{path}: cdiVersion is required"
    kind = data.get("kind")
    if not isinstance(kind, str) or not _KIND.match(kind):
        return f"{path}: kind {kind!r} is not vendor/class"
    devices: dict[str, dict[str, Any]] = {}
    for device in data.get("devices") or []:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not _NAME.match(name):
            return f"{path}: device name {name!r} is invalid"
        if name in devices:
            return f"{path}: device {name!r} is defined twice"
        devices[name] = device
    if not devices:
        return f"{path}: a spec needs at least one device"
    return _Spec(path, kind, data.get("containerEdits") or {}, devices)


def _apply(edits: dict[str, Any], where: str, out: CriEdits) -> None:
    for entry in edits.get("env") or []:
        key, sep, value = str(entry).partition("=")
        if not sep or not key:
            raise CdiError(f"{where}: env entry {entry!r} is not KEY=VALUE")
        out.envs[key] = value
    for node in edits.get("deviceNodes") or []:
        out.devices.append(_device(node, where, out.skipped))
    for mount in edits.get("mounts") or []:
        converted = _mount(mount, where, out.skipped)
        if converted is not None:
            out.mounts.append(converted)
    for hook in edits.get("hooks") or []:
        out.skipped.append(f"{where}: hook {hook.get('hookName', '?')} {hook.get('path', '?')} "
                           "(CRI cannot run OCI hooks)")
    for key in _UNEXPRESSIBLE:
        if edits.get(key):
            out.skipped.append(f"{where}: {key} (no CRI field)")


def _device(node: dict[str, Any], where: str, skipped: list[str]) -> t.Device:
    path = node.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise CdiError(f"{where}: deviceNode path {path!r} must be absolute")
    host = node.get("hostPath") or path
    try:
        st = os.stat(host)
    except OSError as exc:
        raise CdiError(f"{where}: device node {host}: {exc.strerror}") from None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise CdiError(f"{where}: {host} is not a device node")
    # CRI copies the host node's type and numbers; a spec asking for others cannot be honoured.
    wanted = {"type": node.get("type"), "major": node.get("major"), "minor": node.get("minor")}
    actual = {"type": "c" if stat.S_ISCHR(st.st_mode) else "b", "major": os.major(st.st_rdev),
              "minor": os.minor(st.st_rdev)}
    differs = [k for k, v in wanted.items() if v not in (None, "", actual[k]) and not (k == "type" and v == "u"
                                                                                        and actual[k] == "c")]
    if differs:
        skipped.append(f"{where}: deviceNode {path} {', '.join(f'{k}={wanted[k]}' for k in differs)} "
                       f"(CRI uses the host node's {', '.join(f'{k}={actual[k]}' for k in differs)})")
    for key in ("fileMode", "uid", "gid"):
        if node.get(key) is not None:
            skipped.append(f"{where}: deviceNode {path} {key}={node[key]} (CRI uses the host node's)")
    return t.Device(container_path=path, host_path=host, permissions=node.get("permissions") or "rwm")


def _mount(mount: dict[str, Any], where: str, skipped: list[str]) -> t.Mount | None:
    host, target = mount.get("hostPath"), mount.get("containerPath")
    if not isinstance(host, str) or not isinstance(target, str) or not target:
        raise CdiError(f"{where}: a mount needs hostPath and containerPath")
    options = [str(o) for o in mount.get("options") or []]
    kind = mount.get("type") or ""
    if kind not in ("", "bind", "rbind") and not _BIND & set(options):
        skipped.append(f"{where}: mount {target} of type {kind} (CRI mounts are bind mounts)")
        return None
    propagation = t.MountPropagation.PROPAGATION_PRIVATE
    extra = []
    for option in options:
        if option in _PROPAGATION:
            propagation = _PROPAGATION[option]
        elif option not in (*_BIND, "ro", "rw"):
            extra.append(option)
    if extra:
        skipped.append(f"{where}: mount {target} options {', '.join(extra)} (CRI has no mount options)")
    return t.Mount(container_path=target, host_path=host, readonly="ro" in options, propagation=propagation)
