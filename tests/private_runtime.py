"""A containerd of a test's own (for tests that remove images or fill its disk, which the
session's shared containerd must never see), and small distinct images to put in it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devenv import Containerd, build_images
from devenv.images import ImageArchive, LayerBuilder, write_oci_archive
from devenv.packages import busybox_path


def runnable_image(directory: Path, name: str) -> ImageArchive:
    """An image of its own (a unique marker file) that can run ``sh -c``: busybox inside."""
    layer = LayerBuilder()
    for d in ("bin", "tmp", "etc"):
        layer.dir(d)
    layer.file("bin/busybox", busybox_path().read_bytes(), 0o755)
    for applet in ("sh", "sleep", "head", "cat", "true", "dd"):
        layer.symlink(f"bin/{applet}", "busybox")
    layer.file("marker", uuid.uuid4().hex.encode())
    path = directory / f"{uuid.uuid4().hex}.tar"
    write_oci_archive(path, layer.finish(), {"Env": ["PATH=/bin"], "Cmd": ["sh"]}, (name,))
    return ImageArchive(path, (name,))


def blob_image(directory: Path, name: str, size: int) -> ImageArchive:
    """An image of ``size`` random bytes that runs nothing (to be unused)."""
    layer = LayerBuilder()
    layer.file("blob", os.urandom(size))
    path = directory / f"{uuid.uuid4().hex}.tar"
    write_oci_archive(path, layer.finish(), {"Cmd": ["/nothing"]}, (name,))
    return ImageArchive(path, (name,))


@contextmanager
def mounted_tmpfs(size: str) -> Iterator[Path]:
    """A size-limited tmpfs (a small filesystem to fill); unmounted at the end."""
    where = Path(tempfile.mkdtemp(prefix="na-fs-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


@contextmanager
def private_containerd(base: Path, *extra: ImageArchive) -> Iterator[Containerd]:
    """A containerd under ``base`` (short: its socket path must fit), with busybox, pause and
    ``extra`` imported; stopped, its pods removed, at the end."""
    env = Containerd(base)
    env.start()
    try:
        env.import_images([*build_images(), *extra])
        env.wait_image_stats()
        yield env
    finally:
        env.stop()


__all__ = ["blob_image", "mounted_tmpfs", "private_containerd", "runnable_image"]
