"""The real test environment: a private containerd with CRI, bridge CNI and
locally built busybox and pause images.

    from devenv import up, BUSYBOX_IMAGE
    env = up("/tmp/my-env")        # idempotent; env.endpoint == "unix://..."

CLI: `python -m devenv up|down|status|packages|images [--dir DIR]`.
"""

from devenv.containerd import DEFAULT_DIR, DEFAULT_SUBNET, NAMESPACE, Containerd, derived_subnet
from devenv.images import (
    ALL_IMAGE_NAMES,
    BUSYBOX_IMAGE,
    BUSYBOX_NAMES,
    PAUSE_IMAGE,
    PAUSE_NAMES,
    ImageArchive,
    build_images,
    cache_dir,
)
from devenv.lifecycle import down, up
from devenv.packages import ensure_packages, missing_packages

__all__ = [
    "ALL_IMAGE_NAMES",
    "BUSYBOX_IMAGE",
    "BUSYBOX_NAMES",
    "DEFAULT_DIR",
    "DEFAULT_SUBNET",
    "NAMESPACE",
    "PAUSE_IMAGE",
    "PAUSE_NAMES",
    "Containerd",
    "ImageArchive",
    "build_images",
    "cache_dir",
    "derived_subnet",
    "down",
    "ensure_packages",
    "missing_packages",
    "up",
]
