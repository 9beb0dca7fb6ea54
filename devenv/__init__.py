"""The real test environment: a private containerd with CRI, bridge CNI and
locally built busybox and pause images.

    from devenv import up, BUSYBOX_IMAGE
    env = up("/tmp/my-env")        # idempotent; env.endpoint == "unix://..."

Which containerd: $NODEAGENT_RUNTIME, `containerd2` (default; built from the Go
module proxy) or `containerd1.6` (Debian's); see devenv.runtime.

CLI: `python -m devenv up|down|status|packages|images|runtime [--dir DIR]`.
"""

import devenv.forkexec  # noqa: F401  (first: gRPC's fork handlers off before gRPC loads)

# isort: split
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
from devenv.runtime import RUNTIME_ENV, RUNTIMES, Runtime
from devenv.runtime import selected as selected_runtime

__all__ = [
    "ALL_IMAGE_NAMES",
    "BUSYBOX_IMAGE",
    "BUSYBOX_NAMES",
    "DEFAULT_DIR",
    "DEFAULT_SUBNET",
    "NAMESPACE",
    "PAUSE_IMAGE",
    "PAUSE_NAMES",
    "RUNTIMES",
    "RUNTIME_ENV",
    "Containerd",
    "ImageArchive",
    "Runtime",
    "build_images",
    "cache_dir",
    "derived_subnet",
    "down",
    "ensure_packages",
    "missing_packages",
    "selected_runtime",
    "up",
]
