"""The images the upstream e2e tests ask for, built here under their exact names.

No registry is reachable, so every image a selected test runs is made
locally and imported into containerd before the run; with the default
imagePullPolicy (IfNotPresent for tagged images) the node never pulls.

The names and tags are the ones k8s.io/kubernetes v1.37.2's
test/utils/image/manifest.go gives (what `e2e.test --list-images` prints);
tests/test_e2e_images.py checks them against the built binary.

| image | how it is built here |
|---|---|
| e2e-test-images/busybox:1.37.0-2 | Debian's busybox-static (1.35) + a symlink per applet, except /bin/sh: Debian's bash with its libraries (busybox 1.35's ash drops environment variables whose names are not shell identifiers, such as envFrom's `data-1`; upstream's 1.37 passes them on) |
| e2e-test-images/agnhost:2.66.1 | agnhost compiled from the pinned module (CGO_ENABLED=0), on the busybox layer, laid out like upstream's Dockerfile (/agnhost, /agnhost-2, porter certs, /uploads, users, ENTRYPOINT /agnhost CMD pause) plus a fake-registry tree (/var/registry) holding `pause:testing`, and -- as upstream's alpine base has them -- Debian's bash, curl and OpenBSD nc (tests exec `curl ...`, `/bin/bash -c ...`, `nc -u ...`) with their shared libraries; /bin/sh is that bash (Debian's busybox ash would run its own applets, e.g. an `nc` without `-u`, instead of the ones on PATH) |
| e2e-test-images/agnhost:2.55 | the same image (AgnhostPrev; the one test using it only changes the image name) |
| pause:3.10.2 | devenv/pause.c compiled with gcc -static (as devenv's pause:3.10) |
| e2e-test-images/nonroot:1.5 | the busybox layer with USER 1234 (upstream: debian-base + USER 1234) |
| e2e-test-images/nonewprivs:1.4 | test/images/nonewprivs compiled from the module, setuid root at /usr/local/bin/nnp, on the busybox layer |
| e2e-test-images/glibc-dns-testing:2.1.1 | upstream is debian:bookworm-slim + dnsutils + coredns; here: the busybox layer plus Debian bookworm's own glibc `hostname` and `bash` with their libraries and libnss_files/libnss_dns, /etc/nsswitch.conf (no dnsutils, no coredns: the tests that use it only run `hostname` and `hostname -f`) |
| e2e-test-images/nginx:1.27.0-2 | STAND-IN: the busybox layer under nginx's name (no nginx binary); the one selected test that runs it keeps `sh -c 'sleep 5'` as its command and only needs the image to change |
| e2e-test-images/kitten:1.8 | STAND-IN: upstream is agnhost (alpine) + the module's test/images/kitten/html files; here the busybox layer + those files (/kitten.jpg, /data.json) + an /etc/os-release naming Alpine Linux (the ImageVolume test mounts the image as a volume and reads data.json and etc/os-release; nothing runs it). It is also SERVED: the test pulls it with imagePullPolicy Always, so the run serves it from a registry on loopback (devenv.registry) that containerd's registry config makes the mirror of registry.k8s.io (REGISTRY_SERVED) |

What cannot be built here is listed in NOT_BUILT (name -> reason).

Archives are OCI image layouts written by devenv.images' reproducible writer
and cached like devenv's (~/.cache/nodeagent/images), keyed by their inputs
(binaries, sources) and this file's source.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from devenv.images import (
    MT_CONFIG,
    MT_INDEX,
    MT_LAYER,
    MT_MANIFEST,
    ImageArchive,
    LayerBuilder,
    _is_static_elf,
    cache_dir,
    oci_arch,
    write_oci_archive,
)
from devenv.packages import busybox_path

E2E_REGISTRY = "registry.k8s.io/e2e-test-images"

BUSYBOX = f"{E2E_REGISTRY}/busybox:1.37.0-2"
AGNHOST = f"{E2E_REGISTRY}/agnhost:2.66.1"
AGNHOST_PREV = f"{E2E_REGISTRY}/agnhost:2.55"
PAUSE = "registry.k8s.io/pause:3.10.2"
NONROOT = f"{E2E_REGISTRY}/nonroot:1.5"
NONEWPRIVS = f"{E2E_REGISTRY}/nonewprivs:1.4"
NGINX = f"{E2E_REGISTRY}/nginx:1.27.0-2"
GLIBC_DNS = f"{E2E_REGISTRY}/glibc-dns-testing:2.1.1"
KITTEN = f"{E2E_REGISTRY}/kitten:1.8"

# Every name built here; each must appear in `e2e.test --list-images`.
BUILT_NAMES: tuple[str, ...] = (BUSYBOX, AGNHOST, AGNHOST_PREV, PAUSE, NONROOT, NONEWPRIVS, NGINX,
                                GLIBC_DNS, KITTEN)

# Built names a selected test pulls with imagePullPolicy Always: the run serves them from a
# loopback registry that containerd asks first for registry.k8s.io (a mirror: devenv.registry).
REGISTRY_SERVED: tuple[str, ...] = (KITTEN,)
REGISTRY_HOST = "registry.k8s.io"

# Names whose image is a stand-in rather than the upstream program (see above).
STAND_INS: dict[str, str] = {
    BUSYBOX: "Debian's busybox 1.35 under the 1.37.0-2 tag, with Debian's bash as /bin/sh: "
             "busybox 1.35's ash drops environment variables whose names are not shell "
             "identifiers (e.g. data-1), which upstream's 1.37 passes on",
    NGINX: "busybox layer under nginx's name, no nginx binary; only "
           "'Pods should have their auto-restart back-off timer reset on image update' "
           "runs it, with command sh -c 'sleep 5'",
    AGNHOST_PREV: "agnhost built from v1.37.2 (2.66.1) also tagged 2.55; "
                  "'should run through the lifecycle of Pods and PodStatus' only swaps the name",
    KITTEN: "busybox layer + the module's kitten.jpg and data.json + an os-release naming Alpine "
            "Linux (upstream's base); mounted as an image volume, never run; served by a loopback "
            "registry mirror since the test pulls it with Always",
}

# Images the e2e binary lists that selected tests reference but that are not
# built here, with the reason. (Images of tests outside the selection -- etcd,
# sample-apiserver, volume servers, perl, node-perf, ... -- are not listed.)
NOT_BUILT: dict[str, str] = {
    "invalid.registry.k8s.io/invalid/alpine:3.1":
        "must NOT exist: the 'invalid registry' test expects the pull to fail",
    f"{E2E_REGISTRY}/agnhost (PullAlways)":
        "'should be able to pull image' sets imagePullPolicy Always: the node must reach "
        "registry.k8s.io, which no machine here can",
}

_EPOCH_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PAUSE_SOURCE = Path(__file__).resolve().parents[2] / "devenv" / "pause.c"


@dataclass(frozen=True)
class Inputs:
    """What the recipes read: binaries from the controlplane cache and module files."""

    agnhost: Path
    nonewprivs: Path
    agnhost_src: Path  # $GOMODCACHE/k8s.io/kubernetes@v1.37.2/test/images/agnhost


def _key(*parts: bytes) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _cached(cache: Path, stem: str, key: str) -> tuple[Path, bool]:
    path = cache / f"e2e-{stem}-{key}.tar"
    if cache.is_dir():
        for old in cache.glob(f"e2e-{stem}-*.tar"):
            if old != path:
                old.unlink(missing_ok=True)
    return path, path.exists()


# --- the busybox base ----------------------------------------------------------

_PASSWD = (b"root:x:0:0:root:/root:/bin/sh\n"
           b"daemon:x:1:1:daemon:/usr/sbin:/bin/false\n"
           b"bin:x:2:2:bin:/bin:/bin/false\n"
           b"nobody:x:65534:65534:nobody:/home:/bin/false\n")
_GROUP = (b"root:x:0:\ndaemon:x:1:\nbin:x:2:\nnogroup:x:65534:\nnobody:x:65534:\n")


def _busybox_binary() -> tuple[Path, bytes]:
    path = busybox_path()
    data = path.read_bytes()
    if not _is_static_elf(data):
        raise RuntimeError(f"{path} is dynamically linked: install busybox-static")
    return path, data


def _busybox_base(layer: LayerBuilder, *, passwd: bytes = _PASSWD, group: bytes = _GROUP,
                  without: frozenset[str] = frozenset()) -> None:
    """/bin/busybox + applet symlinks (but those ``without``) + a minimal /etc, as upstream's
    busybox image."""
    path, binary = _busybox_binary()
    listing = subprocess.run([str(path), "--list"], check=True, capture_output=True,
                             text=True).stdout
    applets = sorted({a for a in listing.split() if a and "/" not in a} - {"busybox"} - without)
    for d in ("bin", "etc", "home", "root", "usr", "usr/bin", "usr/sbin", "usr/local",
              "usr/local/bin", "sbin", "var", "var/www"):
        layer.dir(d, 0o700 if d == "root" else 0o755)
    layer.dir("tmp", 0o1777)
    layer.file("bin/busybox", binary, 0o755)
    for applet in applets:
        layer.symlink(f"bin/{applet}", "busybox")
    layer.file("etc/passwd", passwd)
    layer.file("etc/group", group)


def _config(**extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {"Env": [_EPOCH_PATH], "WorkingDir": "/"}
    cfg.update(extra)
    return cfg


def build_busybox(cache: Path) -> ImageArchive:
    ensure_debian_packages()
    _, binary = _busybox_binary()
    path, hit = _cached(cache, "busybox", _key(binary, _debian_inputs("/bin/bash")))
    if not hit:
        layer = LayerBuilder()
        # /bin/sh is Debian's bash (POSIX mode when called sh): busybox 1.35's ash drops
        # environment variables whose names are not shell identifiers (envFrom's "data-1"),
        # which upstream's busybox 1.37 passes on to the commands it runs.
        _busybox_base(layer, without=frozenset({"sh"}))
        _Files(layer, _BASE_DIRS).debian_binary(Path("/bin/bash"), "bin/sh")
        write_oci_archive(path, layer.finish(), _config(Cmd=["sh"]), (BUSYBOX,))
    return ImageArchive(path, (BUSYBOX,))


def build_nonroot(cache: Path) -> ImageArchive:
    _, binary = _busybox_binary()
    path, hit = _cached(cache, "nonroot", _key(binary))
    if not hit:
        layer = LayerBuilder()
        _busybox_base(layer)
        write_oci_archive(path, layer.finish(), _config(Cmd=["sh"], User="1234"), (NONROOT,))
    return ImageArchive(path, (NONROOT,))


def build_nginx_standin(cache: Path) -> ImageArchive:
    _, binary = _busybox_binary()
    path, hit = _cached(cache, "nginx", _key(binary))
    if not hit:
        layer = LayerBuilder()
        _busybox_base(layer)
        # A marker file makes its digest differ from busybox's (an image change).
        layer.file("etc/nodeagent-stand-in", b"nginx stand-in: busybox only, no nginx\n")
        write_oci_archive(path, layer.finish(), _config(Cmd=["sh"]), (NGINX,))
    return ImageArchive(path, (NGINX,))


def build_kitten_standin(cache: Path, inputs: Inputs) -> ImageArchive:
    html = inputs.agnhost_src.parent / "kitten" / "html"
    jpg, data = (html / "kitten.jpg").read_bytes(), (html / "data.json").read_bytes()
    _, binary = _busybox_binary()
    path, hit = _cached(cache, "kitten", _key(binary, jpg, data, _KITTEN_OS_RELEASE))
    if not hit:
        layer = LayerBuilder()
        _busybox_base(layer)
        layer.file("kitten.jpg", jpg)  # upstream's Dockerfile: COPY html/kitten.jpg kitten.jpg
        layer.file("data.json", data)
        layer.file("etc/os-release", _KITTEN_OS_RELEASE)
        write_oci_archive(path, layer.finish(), _config(Cmd=["test-webserver"]), (KITTEN,))
    return ImageArchive(path, (KITTEN,))


# What upstream's alpine base says (the ImageVolume test reads it), marked as ours.
_KITTEN_OS_RELEASE = (b'NAME="Alpine Linux"\nID=alpine\n'
                      b'PRETTY_NAME="Alpine Linux (nodeagent stand-in: busybox layer)"\n')


def build_nonewprivs(cache: Path, inputs: Inputs) -> ImageArchive:
    nnp = inputs.nonewprivs.read_bytes()
    _, binary = _busybox_binary()
    path, hit = _cached(cache, "nonewprivs", _key(binary, nnp))
    if not hit:
        if not _is_static_elf(nnp):
            raise RuntimeError(f"{inputs.nonewprivs} is not static (build with CGO_ENABLED=0)")
        layer = LayerBuilder()
        _busybox_base(layer)
        layer.file("usr/local/bin/nnp", nnp, 0o4755)  # `chmod +s` as upstream's Dockerfile
        write_oci_archive(path, layer.finish(), _config(Cmd=["nnp"]), (NONEWPRIVS,))
    return ImageArchive(path, (NONEWPRIVS,))


def build_pause(cache: Path) -> ImageArchive:
    source = _PAUSE_SOURCE.read_bytes()
    path, hit = _cached(cache, "pause", _key(source))
    if not hit:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="nodeagent-e2e-pause-") as tmp:
            out = Path(tmp) / "pause"
            subprocess.run(["gcc", "-static", "-O2", "-s", "-o", str(out), str(_PAUSE_SOURCE)],
                           check=True)
            binary = out.read_bytes()
        layer = LayerBuilder()
        layer.file("pause", binary, 0o755)
        write_oci_archive(path, layer.finish(), _config(Entrypoint=["/pause"]), (PAUSE,))
    return ImageArchive(path, (PAUSE,))


# --- Debian binaries with their shared libraries ---------------------------------

# Debian packages whose binaries go into images, with a file proving each is installed.
DEBIAN_REQUIREMENTS: tuple[tuple[str, str], ...] = (
    ("bash", "/bin/bash"),
    ("curl", "/usr/bin/curl"),
    ("netcat-openbsd", "/bin/nc.openbsd"),
    ("hostname", "/bin/hostname"),
)


def ensure_debian_packages() -> None:
    """apt-get install what DEBIAN_REQUIREMENTS names and is missing (root, as devenv does)."""
    import os
    missing = [pkg for pkg, probe in DEBIAN_REQUIREMENTS if not os.path.exists(probe)]
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # stdin is closed in CI; apt must never wait for an answer
    subprocess.run(["apt-get", "update", "-q"], env=env, stdin=subprocess.DEVNULL, check=True)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                   env=env, stdin=subprocess.DEVNULL, check=True)


def _ldd(binary: Path) -> list[Path]:
    """The shared objects `binary` loads (the dynamic loader included), as ldd names them."""
    out = subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts:
            target = parts[parts.index("=>") + 1]
            if target.startswith("/"):
                libs.append(Path(target))
        elif parts and parts[0].startswith("/"):
            libs.append(Path(parts[0]))  # the loader: /lib64/ld-linux-x86-64.so.2
    return libs


class _Files:
    """Adds files to a layer once, creating parent directories as needed."""

    def __init__(self, layer: LayerBuilder, existing_dirs: Iterable[str] = ()) -> None:
        self.layer = layer
        self.dirs = set(existing_dirs)
        self.files: set[str] = set()

    def add(self, dest: str, data: bytes, mode: int = 0o755) -> None:
        dest = dest.lstrip("/")
        if dest in self.files:
            return
        parts = dest.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.dirs:
                self.dirs.add(d)
                self.layer.dir(d)
        self.files.add(dest)
        self.layer.file(dest, data, mode)

    def debian_binary(self, src: Path, dest: str) -> None:
        """A dynamically linked Debian binary at `dest`, plus its libraries at their paths."""
        self.add(dest, src.resolve().read_bytes(), 0o755)
        for lib in _ldd(src):
            self.add(str(lib), lib.resolve().read_bytes(), 0o755)


def _debian_inputs(*paths: str) -> bytes:
    """Cache-key material for Debian binaries: their bytes and their libraries' bytes."""
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).resolve().read_bytes())
        for lib in _ldd(Path(p)):
            h.update(str(lib).encode())
            h.update(lib.resolve().read_bytes())
    return h.digest()


_NSS_LIBS = (Path("/lib/x86_64-linux-gnu/libnss_files.so.2"),
             Path("/lib/x86_64-linux-gnu/libnss_dns.so.2"))
_NSSWITCH = b"passwd: files\ngroup: files\nhosts: files dns\n"

_BASE_DIRS = ("bin", "etc", "home", "root", "usr", "usr/bin", "usr/sbin", "usr/local",
              "usr/local/bin", "sbin", "var", "var/www", "tmp")


def build_glibc_dns(cache: Path) -> ImageArchive:
    ensure_debian_packages()
    _, bb = _busybox_binary()
    nss = [n for n in _NSS_LIBS if n.exists()]
    key = _key(bb, _debian_inputs("/bin/hostname", "/bin/bash", *map(str, nss)))
    path, hit = _cached(cache, "glibc-dns", key)
    if not hit:
        layer = LayerBuilder()
        _busybox_base(layer)
        files = _Files(layer, _BASE_DIRS)
        # /usr/bin precedes /bin (busybox's applets) on PATH: `hostname` is glibc's
        files.debian_binary(Path("/bin/hostname"), "usr/bin/hostname")
        files.debian_binary(Path("/bin/bash"), "bin/bash")
        for lib in nss:
            files.debian_binary(lib, str(lib))
        files.add("etc/nsswitch.conf", _NSSWITCH, 0o644)
        write_oci_archive(path, layer.finish(), _config(Cmd=["bash"]), (GLIBC_DNS,))
    return ImageArchive(path, (GLIBC_DNS,))


# --- agnhost ---------------------------------------------------------------------

# Upstream's Dockerfile: `adduser -u 1000 -D user-defined-in-image`,
# `addgroup -g 50000 group-defined-in-image`, the user in that group too.
_AGNHOST_PASSWD = _PASSWD + b"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
_AGNHOST_GROUP = (_GROUP + b"user-defined-in-image:x:1000:\n"
                  b"group-defined-in-image:x:50000:user-defined-in-image\n")


def _registry_tree(layer: LayerBuilder, pause_binary: bytes) -> None:
    """/var/registry as agnhost's fake-registry-server reads it, holding pause:testing.

    Upstream fills it with crane from registry.k8s.io/pause:3.10.2; here the
    same layout is made from our pause binary: a tag file holding the digest
    of an image index, which names one manifest, whose config and layer are
    blobs. Paths: <dir>/<sha256>/<first 2 hex>/<hex>/data.
    """
    def digest_path(kind: str, digest: str) -> str:
        hexd = digest.removeprefix("sha256:")
        return f"var/registry/pause/{kind}/sha256/{hexd[:2]}/{hexd}/data"

    def blob(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    def dumps(obj: object) -> bytes:
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    pause_layer = LayerBuilder()
    pause_layer.file("pause", pause_binary, 0o755)
    layer_bytes = pause_layer.finish()
    arch = oci_arch()
    config = dumps({
        "architecture": arch, "os": "linux", "created": "2024-01-01T00:00:00Z",
        "config": _config(Entrypoint=["/pause"]),
        "rootfs": {"type": "layers", "diff_ids": [blob(layer_bytes)]},
    })
    manifest = dumps({
        "schemaVersion": 2, "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": blob(config), "size": len(config)},
        "layers": [{"mediaType": MT_LAYER, "digest": blob(layer_bytes), "size": len(layer_bytes)}],
    })
    index = dumps({
        "schemaVersion": 2, "mediaType": MT_INDEX,
        "manifests": [{"mediaType": MT_MANIFEST, "digest": blob(manifest), "size": len(manifest),
                       "platform": {"architecture": arch, "os": "linux"}}],
    })
    made: set[str] = set()

    def dirs_for(path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in made and d not in ("var",):
                made.add(d)
                layer.dir(d)

    entries = [("manifests/testing", (blob(index) + "\n").encode())]
    entries += [(digest_path("manifests", blob(x))[len("var/registry/pause/"):], x)
                for x in (index, manifest)]
    entries += [(digest_path("blobs", blob(x))[len("var/registry/pause/"):], x)
                for x in (config, layer_bytes)]
    for rel, data in entries:
        path = "var/registry/pause/" + rel
        dirs_for(path)
        layer.file(path, data, 0o644)


def build_agnhost(cache: Path, inputs: Inputs, pause: ImageArchive) -> ImageArchive:
    agnhost = inputs.agnhost.read_bytes()
    crt = (inputs.agnhost_src / "porter" / "localhost.crt").read_bytes()
    key = (inputs.agnhost_src / "porter" / "localhost.key").read_bytes()
    pause_binary = _pause_binary(pause.path)
    _, bb = _busybox_binary()
    names = (AGNHOST, AGNHOST_PREV)
    ensure_debian_packages()
    debian = _debian_inputs("/bin/bash", "/usr/bin/curl", "/bin/nc.openbsd",
                            *(str(n) for n in _NSS_LIBS if n.exists()))
    path, hit = _cached(cache, "agnhost", _key(agnhost, bb, crt, key, pause_binary, debian))
    if not hit:
        if not _is_static_elf(agnhost):
            raise RuntimeError(f"{inputs.agnhost} is not static (build with CGO_ENABLED=0)")
        layer = LayerBuilder()
        # /bin/sh is bash: Debian's busybox ash prefers its own applets to PATH (its nc has
        # no -u), where upstream's alpine ash runs /usr/bin/nc (netcat-openbsd) as tests expect.
        _busybox_base(layer, passwd=_AGNHOST_PASSWD, group=_AGNHOST_GROUP, without=frozenset({"sh"}))
        layer.dir("home/user-defined-in-image")
        layer.dir("uploads", 0o755)
        layer.file("agnhost", agnhost, 0o755)
        layer.symlink("agnhost-2", "agnhost")  # `ln -s agnhost agnhost-2`
        layer.file("localhost.crt", crt)
        layer.file("localhost.key", key)
        _registry_tree(layer, pause_binary)
        # upstream's alpine base has bash, curl and netcat-openbsd; /usr/bin precedes
        # busybox's /bin on PATH, so `curl` and `nc` are these
        files = _Files(layer, (*_BASE_DIRS, "var", "home/user-defined-in-image", "uploads"))
        files.debian_binary(Path("/bin/bash"), "bin/bash")
        layer.symlink("bin/sh", "bash")
        files.debian_binary(Path("/usr/bin/curl"), "usr/bin/curl")
        files.debian_binary(Path("/bin/nc.openbsd"), "usr/bin/nc")
        for lib in _NSS_LIBS:  # getaddrinfo() of curl and nc loads these
            if lib.exists():
                files.debian_binary(lib, str(lib))
        files.add("etc/nsswitch.conf", _NSSWITCH, 0o644)
        ports: dict[str, dict[str, str]] = {f"{p}/tcp": {} for p in (80, 8080, 8081, 9376, 5000)}
        write_oci_archive(path, layer.finish(),
                          _config(Entrypoint=["/agnhost"], Cmd=["pause"], ExposedPorts=ports),
                          names)
    return ImageArchive(path, names)


def _pause_binary(archive: Path) -> bytes:
    """The /pause file out of our pause archive (its one layer)."""
    import io
    import tarfile
    with tarfile.open(archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        mdigest = index["manifests"][0]["digest"].removeprefix("sha256:")
        manifest = json.load(outer.extractfile(f"blobs/sha256/{mdigest}"))  # type: ignore[arg-type]
        ldigest = manifest["layers"][0]["digest"].removeprefix("sha256:")
        layer_bytes = outer.extractfile(f"blobs/sha256/{ldigest}").read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as inner:
        return inner.extractfile("pause").read()  # type: ignore[union-attr]


# --- all of them -------------------------------------------------------------------

def inputs(build: bool = True) -> Inputs:
    """Locate (building if needed) agnhost and nnp, and the agnhost sources."""
    from controlplane import build as cpbuild
    names = ["agnhost", "nonewprivs"]
    if build:
        cpbuild.ensure_built(names)
    return Inputs(agnhost=cpbuild.binary("agnhost"), nonewprivs=cpbuild.binary("nonewprivs"),
                  agnhost_src=module_dir() / "test" / "images" / "agnhost")


def module_dir() -> Path:
    """Where the pinned k8s.io/kubernetes module's source is (downloading it if needed)."""
    from controlplane import build as cpbuild
    out = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"],
                         cwd=cpbuild.E2E_MODULE, env=cpbuild.go_env(), check=True,
                         capture_output=True, text=True).stdout.strip()
    if not out:
        subprocess.run(["go", "mod", "download", "k8s.io/kubernetes"], cwd=cpbuild.E2E_MODULE,
                       env=cpbuild.go_env(), check=True)
        return module_dir()
    return Path(out)


def build_all(cache: Path | None = None, *, build_binaries: bool = True) -> list[ImageArchive]:
    """Every archive (cached); builds agnhost and nnp binaries first if missing."""
    cache = cache or cache_dir()
    ins = inputs(build_binaries)
    pause = build_pause(cache)
    return [build_busybox(cache), pause, build_agnhost(cache, ins, pause),
            build_nonroot(cache), build_nonewprivs(cache, ins), build_nginx_standin(cache),
            build_glibc_dns(cache), build_kitten_standin(cache, ins)]


def names_of(archives: Iterable[ImageArchive]) -> list[str]:
    return [n for a in archives for n in a.names]
