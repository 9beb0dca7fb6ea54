"""The node's own registry credentials: a docker config file on the node, read as the kubelet
reads one (its default docker config provider).

The first valid ``config.json`` (``{"auths": {...}}``) among the agent's root directory, the
working directory, ``~/.docker`` and ``/.docker`` is used; without one, the first valid legacy
``.dockercfg`` (the entries directly) among the root directory, the working directory, ``~``
and ``/``. A file that is missing, unreadable or not a docker config is passed over for the
next one. What is read is kept for five minutes, so a credential written or rotated on the node
is used within that time without restarting the agent.

Every pod's pulls may use these credentials, static pods' too (the only credentials a
standalone node has); a pod's own image pull secrets are tried before them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import structlog

from plugins.runtime.keyring import (
    DOCKER_CONFIG_JSON,
    DOCKER_CONFIG_JSON_KEY,
    DOCKERCFG,
    DOCKERCFG_KEY,
    Keyring,
    KeyringError,
    auths_of,
)

log = structlog.get_logger("nodeagent.runtime.nodekeyring")

CACHE_SECONDS = 300.0  # the kubelet's CachingDockerConfigProvider lifetime


def candidates(root_dir: Path, cwd: Path, home: Path, fs_root: Path = Path("/")) -> Iterator[tuple[Path, str, str]]:
    """(file, secret type it is read as, its key) in the kubelet's order."""
    for directory in (root_dir, cwd, home / ".docker", fs_root / ".docker"):
        yield directory / "config.json", DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY
    for directory in (root_dir, cwd, home, fs_root):
        yield directory / ".dockercfg", DOCKERCFG, DOCKERCFG_KEY


def read(root_dir: Path, cwd: Path, home: Path, fs_root: Path = Path("/")) -> tuple[Keyring, Path | None]:
    """The credentials of the first valid file, and which file it was (None: none found)."""
    for path, kind, key in candidates(root_dir, cwd, home, fs_root):
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        try:
            auths = auths_of(kind, {key: raw}, secret=str(path)) or {}
        except KeyringError as exc:
            log.warning("node docker config passed over", path=str(path), error=str(exc))
            continue
        keyring = Keyring()
        keyring.add({registry: replace(c, node=True) for registry, c in auths.items()})
        return keyring, path
    return Keyring(), None


class NodeKeyring:
    def __init__(self, root_dir: Path, monotonic: Callable[[], float],
                 cwd: Path | None = None, home: Path | None = None, fs_root: Path = Path("/")) -> None:
        self._root_dir = root_dir
        self._monotonic = monotonic
        self._cwd = cwd
        self._home = home
        self._fs_root = fs_root
        self._keyring = Keyring()
        self._path: Path | None = None
        self._expires: float | None = None

    async def get(self) -> Keyring:
        now = self._monotonic()
        if self._expires is None or now >= self._expires:
            keyring, path = await anyio.to_thread.run_sync(
                read, self._root_dir, self._cwd or Path.cwd(), self._home or Path.home(), self._fs_root)
            if path != self._path:
                log.info("node docker config", path=str(path) if path else None)
            self._keyring, self._path, self._expires = keyring, path, now + CACHE_SECONDS
        return self._keyring
