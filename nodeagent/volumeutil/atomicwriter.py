"""The kubelet's atomic writer (pkg/volume/util/atomic_writer.go): a volume's files replaced all
at once through a ``..data`` symlink switch, so a reader never sees half an update."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from nodeagent.volumeutil import SetupError, ownership

DATA_DIR = "..data"  # the atomic writer's symlink to the current payload
DATA_DIR_TMP = "..data_tmp"


def _validate(rel: str) -> None:
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or any(p.startswith("..") for p in parts):
        raise SetupError(f"invalid downwardAPI item path {rel!r}")


Content = str | bytes
"""File content: text (downward API values) or bytes (configMap binaryData, secrets)."""


def _current_payload(target: Path) -> dict[str, tuple[bytes, int, int]] | None:
    """Relative path → (content, mode, gid) of the files ``..data`` shows now."""
    data = target / DATA_DIR
    if not data.is_dir():
        return None
    found: dict[str, tuple[bytes, int, int]] = {}
    for file in data.rglob("*"):
        if file.is_file():
            info = file.stat()
            found[str(file.relative_to(data))] = (file.read_bytes(), stat.S_IMODE(info.st_mode), info.st_gid)
    return found


def _as_bytes(content: Content) -> bytes:
    return content.encode() if isinstance(content, str) else content


def write_atomically(target: Path, payload: Mapping[str, tuple[Content, int]], fs_group: int | None = None) -> bool:
    """The kubelet's atomic writer: the payload goes into a fresh ``..<timestamp>`` directory,
    ``..data`` is switched to it with one rename, and each top-level name is a symlink through
    ``..data``; a reader never sees half an update. Returns whether anything changed.

    With ``fs_group`` the whole volume is given to that group (read-only mask) after the new
    payload is written and before it becomes visible, as the kubelet's configMap, secret,
    projected and downwardAPI plugins do through the writer's setPerms hook."""
    for rel in payload:
        _validate(rel)
    target.mkdir(parents=True, exist_ok=True)
    wanted_files = {
        rel: (_as_bytes(content),
              ownership.owned_mode(mode, read_only=True) if fs_group is not None else stat.S_IMODE(mode))
        for rel, (content, mode) in payload.items()}
    current = _current_payload(target)
    if current is not None and {rel: (c, m) for rel, (c, m, _) in current.items()} == wanted_files \
            and (fs_group is None or all(gid == fs_group for _, _, gid in current.values())):
        return False
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()) + f"{time.time_ns() % 10**9:09d}"
    fresh = target / stamp
    fresh.mkdir(mode=0o755)
    os.chmod(fresh, 0o755)  # others must reach the files whatever the agent's umask
    for rel, (content, mode) in payload.items():
        file = fresh / rel
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(_as_bytes(content))
        os.chmod(file, mode)
    if fs_group is not None:
        ownership.set_volume_ownership(target, fs_group, read_only=True)
    old = os.readlink(target / DATA_DIR) if (target / DATA_DIR).is_symlink() else None
    tmp_link = target / DATA_DIR_TMP
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(stamp)
    os.replace(tmp_link, target / DATA_DIR)
    wanted = {rel.split("/", 1)[0] for rel in payload}
    for name in wanted:
        link = target / name
        if not link.is_symlink():
            link.symlink_to(f"{DATA_DIR}/{name}")
    for entry in target.iterdir():
        # User-visible names the new payload no longer has, and the previous payload.
        if entry.name.startswith("..") or entry.name in wanted:
            continue
        if entry.is_symlink():
            entry.unlink()
    if old and old != stamp:
        _remove_tree(target / old)
    return True


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_dir() and not child.is_symlink():
            child.rmdir()
        else:
            child.unlink()
    path.rmdir()
