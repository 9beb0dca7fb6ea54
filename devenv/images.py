"""Container images for the test environment, built locally as OCI archives.

No image registry is reachable from our machines, so the two images every
test needs are made here from Debian's files:

- busybox: Debian's static /bin/busybox plus a symlink per applet;
- pause: devenv/pause.c compiled with `gcc -static`.

Each becomes an OCI image-layout tar (oci-layout, index.json, blobs/sha256/...)
that `ctr images import` loads. Archives are byte-for-byte reproducible (fixed
mtimes, owners and order) and cached outside the repo under a key made of
their inputs and of this file's own source, so any change to the recipe below
rebuilds them and an unchanged recipe costs nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from devenv.packages import busybox_path

BUSYBOX_IMAGE = "docker.io/library/busybox:1.36"
# Names our tests and upstream (e2e) tests ask for; all point at one image.
BUSYBOX_NAMES: tuple[str, ...] = (
    BUSYBOX_IMAGE,
    "docker.io/library/busybox:latest",
    "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
)
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# 3.6 is containerd 1.6's built-in default sandbox image: tagging it too means
# a config that forgets sandbox_image still finds a pause image.
PAUSE_NAMES: tuple[str, ...] = (PAUSE_IMAGE, "registry.k8s.io/pause:3.6")
ALL_IMAGE_NAMES: tuple[str, ...] = BUSYBOX_NAMES + PAUSE_NAMES

# A fixed timestamp keeps archives reproducible (digests depend on mtimes).
_EPOCH = 1704067200  # 2024-01-01T00:00:00Z
_CREATED = "2024-01-01T00:00:00Z"
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_PAUSE_SOURCE = Path(__file__).with_name("pause.c")

MT_LAYER = "application/vnd.oci.image.layer.v1.tar"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class ImageArchive:
    """A built OCI archive and the image names it carries."""

    path: Path
    names: tuple[str, ...]


def cache_dir() -> Path:
    """Where built archives live: outside the repo, shared by every checkout."""
    base = os.environ.get("NODEAGENT_CACHE_DIR")
    if base:
        root = Path(base)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        root = Path(xdg) / "nodeagent"
    return root / "images"


def oci_arch() -> str:
    """The OCI name of this machine's architecture (ctr imports only matching ones)."""
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


class LayerBuilder:
    """An uncompressed, reproducible layer tar assembled in memory."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._tar = tarfile.open(fileobj=self._buf, mode="w", format=tarfile.PAX_FORMAT)

    def _info(self, path: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type = kind
        info.mode = mode
        info.mtime = _EPOCH
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    def dir(self, path: str, mode: int = 0o755) -> None:
        self._tar.addfile(self._info(path, tarfile.DIRTYPE, mode))

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        info = self._info(path, tarfile.REGTYPE, mode)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))

    def symlink(self, path: str, target: str) -> None:
        info = self._info(path, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self._tar.addfile(info)

    def finish(self) -> bytes:
        self._tar.close()
        return self._buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _json(obj: object) -> bytes:
    # Sorted keys and no spaces: stable bytes, hence stable digests.
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_oci_archive(dest: Path, layer: bytes, image_config: dict[str, object],
                      names: tuple[str, ...]) -> None:
    """Write a one-layer OCI image-layout tar at `dest` tagged with `names`.

    Every name gets its own index.json entry with two annotations:
    `org.opencontainers.image.ref.name` (the OCI standard) and
    `io.containerd.image.name`, which ctr 1.6's import takes verbatim as the
    image name. Full references in the OCI annotation are also kept as-is by
    ctr, but the containerd annotation makes that independent of its
    prefix-translation rules (which differ with --base-name).
    """
    arch = oci_arch()
    layer_digest, _ = _blob(layer)
    config = {
        "architecture": arch,
        "os": "linux",
        "created": _CREATED,
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": _CREATED, "created_by": "nodeagent devenv"}],
    }
    config_digest, config_bytes = _blob(_json(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": MT_LAYER, "digest": layer_digest, "size": len(layer)}],
    }
    manifest_digest, manifest_bytes = _blob(_json(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [
            {
                "mediaType": MT_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": arch, "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name,
                },
            }
            for name in names
        ],
    }
    out = LayerBuilder()  # the archive itself is just another reproducible tar
    out.file("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
    out.file("index.json", _json(index))
    out.dir("blobs")
    out.dir("blobs/sha256")
    for digest, data in (_blob(layer), (config_digest, config_bytes),
                         (manifest_digest, manifest_bytes)):
        out.file("blobs/sha256/" + digest.removeprefix("sha256:"), data)
    _atomic_write(dest, out.finish())


def _atomic_write(dest: Path, data: bytes) -> None:
    # Two processes may build the same archive at once (a test session and
    # `make env`): write aside, then rename, so nobody reads half a file.
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache is not secret
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise


def _key(*parts: bytes) -> str:
    """Cache key: the inputs plus this module's source (the recipe)."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _cached(cache: Path, stem: str, key: str) -> tuple[Path, bool]:
    """Path for stem+key, whether it exists; stale archives of `stem` are removed."""
    path = cache / f"{stem}-{key}.tar"
    if cache.is_dir():
        for old in cache.glob(f"{stem}-*.tar"):
            if old != path:
                old.unlink(missing_ok=True)
    return path, path.exists()


def _is_static_elf(data: bytes) -> bool:
    """True when an ELF64 binary has no PT_INTERP, i.e. needs no dynamic loader."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    order: Literal["little", "big"] = "little" if data[5] == 1 else "big"
    phoff = int.from_bytes(data[32:40], order)
    phentsize = int.from_bytes(data[54:56], order)
    phnum = int.from_bytes(data[56:58], order)
    for i in range(phnum):
        off = phoff + i * phentsize
        if int.from_bytes(data[off:off + 4], order) == 3:  # PT_INTERP
            return False
    return True


def build_busybox(cache: Path | None = None) -> ImageArchive:
    """The busybox image: /bin/busybox, a /bin symlink per applet, minimal /etc."""
    cache = cache or cache_dir()
    binary_path = busybox_path()
    binary = binary_path.read_bytes()
    path, hit = _cached(cache, "busybox", _key(binary))
    if hit:
        return ImageArchive(path, BUSYBOX_NAMES)
    if not _is_static_elf(binary):
        raise RuntimeError(f"{binary_path} is dynamically linked: install busybox-static")
    listing = subprocess.run([str(binary_path), "--list"], check=True,
                             capture_output=True, text=True).stdout
    applets = sorted({a for a in listing.split() if a and "/" not in a} - {"busybox"})

    layer = LayerBuilder()
    for d in ("bin", "etc", "root", "usr", "usr/bin", "usr/sbin", "sbin", "var", "var/www"):
        layer.dir(d, 0o700 if d == "root" else 0o755)
    layer.dir("tmp", 0o1777)
    layer.file("bin/busybox", binary, 0o755)
    for applet in applets:
        layer.symlink(f"bin/{applet}", "busybox")
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                             b"nobody:x:65534:65534:nobody:/home:/bin/false\n")
    layer.file("etc/group", b"root:x:0:\nnobody:x:65534:\n")
    write_oci_archive(path, layer.finish(),
                      {"Env": [_PATH_ENV], "Cmd": ["sh"], "WorkingDir": "/"}, BUSYBOX_NAMES)
    return ImageArchive(path, BUSYBOX_NAMES)


def build_pause(cache: Path | None = None) -> ImageArchive:
    """The pause image: pause.c compiled statically, as /pause."""
    cache = cache or cache_dir()
    source = _PAUSE_SOURCE.read_bytes()
    path, hit = _cached(cache, "pause", _key(source))
    if hit:
        return ImageArchive(path, PAUSE_NAMES)
    with tempfile.TemporaryDirectory(prefix="nodeagent-pause-") as tmp:
        binary_path = Path(tmp) / "pause"
        subprocess.run(["gcc", "-static", "-O2", "-s", "-o", str(binary_path),
                        str(_PAUSE_SOURCE)], check=True)
        binary = binary_path.read_bytes()
    layer = LayerBuilder()
    layer.file("pause", binary, 0o755)
    write_oci_archive(path, layer.finish(),
                      {"Env": [_PATH_ENV], "Entrypoint": ["/pause"], "WorkingDir": "/"},
                      PAUSE_NAMES)
    return ImageArchive(path, PAUSE_NAMES)


def build_images(cache: Path | None = None) -> list[ImageArchive]:
    """Both archives, built only when their cache entry is missing."""
    return [build_busybox(cache), build_pause(cache)]
