"""The legacy container log symlinks (pkg/kubelet/kuberuntime/legacy.go):
``/var/log/containers/<pod>_<namespace>_<container>-<containerID>.log`` → the CRI log file.
Log shippers (fluentd, fluent-bit, promtail) still find container logs through them, because
the name carries the pod, namespace and container without parsing directories.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from nodeagent import hostpaths

# ext4 allows 255 bytes per file name; the kubelet cuts the name before the ".log" suffix.
MAX_FILE_NAME = 255
SUFFIX = ".log"


def link_name(pod: str, namespace: str, container: str, container_id: str) -> str:
    return hostpaths.log_symlink_name(pod, namespace, container, container_id, SUFFIX)


def pod_prefix(pod: str, namespace: str) -> str:
    """What every link of the pod starts with (pod names and namespaces have no ``_``)."""
    return f"{pod}_{namespace}_"[: MAX_FILE_NAME - len(SUFFIX)]


def links_into(directory: Path, prefix: str, target_dir: Path) -> dict[str, str]:
    """The links in ``directory`` named ``prefix…`` that point into ``target_dir`` (dangling
    ones too): name → target. The target check keeps a pod with the same name and namespace
    but another UID (an edited static pod) from losing its links."""
    found = {}
    inside = os.path.normpath(os.path.abspath(target_dir)) + "/"
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return {}
    for name in entries:
        if not name.startswith(prefix):
            continue
        try:
            target = os.readlink(directory / name)
        except OSError:
            continue  # not a link (or gone): not ours to touch
        if os.path.normpath(target).startswith(inside):
            found[name] = target
    return found


def reconcile(directory: Path, prefix: str, target_dir: Path,
              wanted: Mapping[str, str]) -> tuple[list[str], list[str], bool]:
    """Make the pod's links in ``directory`` exactly ``wanted`` (name → log file). A link is
    made only when its log file exists, as the kubelet does (no dangling links). Returns the
    names created and removed, and whether every wanted link is in place now (False while a
    log file is still missing)."""
    have = links_into(directory, prefix, target_dir)
    created, removed = [], []
    for name in sorted(set(have) - set(wanted)):
        _unlink(directory / name)
        removed.append(name)
    absent = [(n, t) for n, t in sorted(wanted.items()) if have.get(n) != t]
    missing = [(n, t) for n, t in absent if os.path.exists(t)]
    if missing:
        directory.mkdir(parents=True, exist_ok=True)
    for name, target in missing:
        link = directory / name
        _unlink(link)
        os.symlink(target, link)
        created.append(name)
    return created, removed, len(missing) == len(absent)


def remove_all(directory: Path, prefix: str, target_dir: Path) -> Iterable[str]:
    names = list(links_into(directory, prefix, target_dir))
    for name in names:
        _unlink(directory / name)
    return names


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


__all__ = ["MAX_FILE_NAME", "link_name", "links_into", "pod_prefix", "reconcile", "remove_all"]
