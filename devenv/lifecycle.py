"""`up` and `down`: the whole environment in one idempotent call each.

Shared by the CLI (`python -m devenv up`, `make env`), CI and the README, so
that there is exactly one way to bring the environment up.
"""

from __future__ import annotations

import os
import shutil

from devenv.containerd import DEFAULT_DIR, Containerd
from devenv.images import build_images
from devenv.packages import ensure_packages

__all__ = ["DEFAULT_DIR", "down", "up"]


def up(base_dir: str | os.PathLike[str] = DEFAULT_DIR, *, subnet: str | None = None,
       install: bool = True) -> Containerd:
    """Install what is missing, build images, start containerd, import images.

    Each step is skipped when already done, so calling it on a running
    environment only checks it (and re-imports images whose recipe changed).
    The daemon is detached: it keeps running after this process exits.
    `subnet` applies to a first start; see Containerd for the default.
    """
    if install:
        ensure_packages()
    archives = build_images()
    env = Containerd(base_dir, subnet=subnet)
    env.start()
    env.import_images(archives)
    return env


def down(base_dir: str | os.PathLike[str] = DEFAULT_DIR, *, purge: bool = False) -> Containerd:
    """Remove all pods, stop containerd, clean the host; with purge, delete base_dir too."""
    env = Containerd(base_dir)
    env.stop()
    if purge:
        shutil.rmtree(env.base_dir, ignore_errors=True)
    return env
