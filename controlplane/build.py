"""Build the Kubernetes control plane binaries from the Go module proxy.

The Go module in conformance/k8s requires k8s.io/kubernetes at one pinned
version (and replaces every staging module with its published v0.x twin); this
module runs `go build` inside it and puts the binaries in a cache outside the
repository, keyed by version:

    ~/.cache/nodeagent/k8s/<version>/bin/{etcd,kube-apiserver,...}

Idempotent: a binary is rebuilt only when it is missing or when its stamp
(a hash of go.mod, go.sum, our Go sources, the Go version and the flags)
differs. Stdlib only, so it can run before anything is pip-installed:
`python3 -m controlplane build` or `python3 controlplane/build.py`.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GO_MODULE = REPO / "conformance" / "k8s"

# The one pinned version; conformance/k8s/go.mod must agree (checked below).
K8S_VERSION = "v1.37.2"

# name -> Go package, in build order. kube-apiserver first: it compiles most
# of the shared dependency graph, so the others mostly reuse Go's build cache.
COMPONENTS: dict[str, str] = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "etcd": "./cmd/etcd",
}

# Built only when named (`python -m controlplane build e2e.test agnhost`):
# the upstream e2e test binary and agnhost, for the upstream node-conformance
# run (conformance/e2e). They come from a second Go module, conformance/k8s/e2e,
# that pins the same k8s.io/kubernetes version: its dependency set is much
# larger, and keeping it out of ../go.mod leaves the stamps above untouched.
# name -> (module dir, Go package, "test" for `go test -c` | "build").
E2E_MODULE = GO_MODULE / "e2e"
CSI_MODULE = GO_MODULE / "csi"
EXTRA_COMPONENTS: dict[str, tuple[Path, str, str]] = {
    "e2e.test": (E2E_MODULE, "k8s.io/kubernetes/test/e2e", "test"),
    "agnhost": (E2E_MODULE, "k8s.io/kubernetes/test/images/agnhost", "build"),
    "nonewprivs": (E2E_MODULE, "k8s.io/kubernetes/test/images/nonewprivs", "build"),
    # the ginkgo CLI, for parallel runs (`ginkgo --nodes N e2e.test -- ...`)
    "ginkgo": (E2E_MODULE, "github.com/onsi/ginkgo/v2/ginkgo", "build"),
    # the upstream kubelet: the baseline node of `python -m conformance.e2e run --node kubelet`
    "kubelet": (E2E_MODULE, "k8s.io/kubernetes/cmd/kubelet", "build"),
    # kubeadm, for what it writes for a kubelet (tests/test_kubeadm_config.py), from its own module
    # (conformance/k8s/kubeadm): most of its packages are the control plane's, in Go's build cache
    "kubeadm": (GO_MODULE / "kubeadm", "k8s.io/kubernetes/cmd/kubeadm", "build"),
    # the mock CSI driver inside k8s.io/kubernetes (test/e2e/storage/drivers/csi-test/mock) on a
    # Unix socket, with plugin registration: a few lines of ours (conformance/k8s/e2e/csimock)
    "csi-mock": (E2E_MODULE, "./csimock", "build"),
    # CSI tools that are their own modules (conformance/k8s/csi): csi-sanity checks a CSI
    # driver against the spec; external-attacher is the sidecar that attaches VolumeAttachments
    "csi-sanity": (CSI_MODULE, "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity", "build"),
    "csi-attacher": (CSI_MODULE, "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher", "build"),
}

# Go's own compiler/linker peak for these packages is about 2-3 GiB per job
# (the kube-apiserver link is the largest); one job per core otherwise.
_GIB_PER_JOB = 3


class BuildError(RuntimeError):
    """A component could not be built (the message names it and the command)."""


def _log(msg: str) -> None:
    print(f"controlplane build: {msg}", file=sys.stderr, flush=True)


def nodeagent_cache() -> Path:
    """XDG cache/nodeagent: every binary cache of ours (k8s here, containerd in devenv) is below."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "nodeagent"


def cache_root() -> Path:
    """Where built binaries live: $NODEAGENT_K8S_CACHE, else XDG cache/nodeagent/k8s."""
    env = os.environ.get("NODEAGENT_K8S_CACHE")
    if env:
        return Path(env)
    return nodeagent_cache() / "k8s"


def bin_dir(version: str = K8S_VERSION) -> Path:
    return cache_root() / version / "bin"


def binary(name: str, version: str = K8S_VERSION) -> Path:
    return bin_dir(version) / name


def go_env() -> dict[str, str]:
    """The environment every `go` call here uses.

    GOTOOLCHAIN: the machines have Go 1.26 and k8s v1.37 needs go >= 1.26.0,
    so the local toolchain is enough; a caller may still export
    GOTOOLCHAIN=go1.27.3 (the proxy serves it) and it is passed through.
    """
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")  # static binaries, as upstream releases them
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -buildvcs=false -mod=readonly").strip()
    return env


def go_version(env: dict[str, str], module: Path = GO_MODULE) -> str:
    """The Go toolchain's version as `module` would use it (part of every stamp)."""
    out = subprocess.run(["go", "env", "GOVERSION"], cwd=module, env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _check_pin(module: Path = GO_MODULE) -> None:
    text = (module / "go.mod").read_text()
    m = re.search(r"^require k8s\.io/kubernetes (v\S+)", text, re.MULTILINE) or \
        re.search(r"^\s+k8s\.io/kubernetes (v\S+)", text, re.MULTILINE)
    if not m or m.group(1) != K8S_VERSION:
        rel = (module / "go.mod").relative_to(REPO)
        raise BuildError(f"{rel} does not pin k8s.io/kubernetes {K8S_VERSION}")


def ldflags(version: str = K8S_VERSION) -> str:
    """-s -w to keep binaries small; -X version vars like hack/lib/version.sh sets.

    Without them the binaries report v0.0.0-master, which kubectl's skew
    check and `kubectl version` show; the build date is fixed to the
    version's so that the flags (and the stamp) stay stable.
    """
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        for key, val in (("gitVersion", version), ("gitMajor", major), ("gitMinor", minor),
                         ("gitTreeState", "clean"), ("buildDate", "1970-01-01T00:00:00Z")):
            flags.append(f"-X {pkg}.{key}={val}")
    return " ".join(flags)


def _stamp(name: str, go_version: str, version: str) -> str:
    if name in EXTRA_COMPONENTS:
        return _extra_stamp(name, go_version, version)
    h = hashlib.sha256()
    for rel in ("go.mod", "go.sum"):
        h.update((GO_MODULE / rel).read_bytes())
    for path in sorted((GO_MODULE / "cmd").rglob("*.go")):
        h.update(str(path.relative_to(GO_MODULE)).encode())
        h.update(path.read_bytes())
    h.update(f"{name}\0{COMPONENTS[name]}\0{go_version}\0{ldflags(version)}\0trimpath".encode())
    return h.hexdigest()


def _extra_stamp(name: str, go_version: str, version: str) -> str:
    module, pkg, kind = EXTRA_COMPONENTS[name]
    h = hashlib.sha256()
    for path in sorted([module / "go.mod", module / "go.sum", *module.glob("*.go")]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    if pkg.startswith("./"):  # a package of our own in the module: its sources too
        for path in sorted((module / pkg).rglob("*.go")):
            h.update(str(path.relative_to(module)).encode())
            h.update(path.read_bytes())
    h.update(f"{name}\0{pkg}\0{kind}\0{go_version}\0{ldflags(version)}\0trimpath".encode())
    return h.hexdigest()


def is_built(name: str, version: str = K8S_VERSION) -> bool:
    """True if the binary exists (the stamp is checked by build(), not here)."""
    return os.access(binary(name, version), os.X_OK)


def jobs() -> int:
    """How many packages `go build` compiles at once: cores, bounded by memory."""
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = 8
    return max(1, min(os.cpu_count() or 1, int(mem_gib // _GIB_PER_JOB)))


@dataclass
class Result:
    name: str
    path: Path
    built: bool  # False: already up to date
    seconds: float


@dataclass(frozen=True)
class GoBuild:
    """One `go build` (or `go test -c`) of one or more packages into a stamped cache.

    Each package gives the binary named by its last path element; `stamp` says
    what was built (sources, toolchain, flags) and is kept next to the binaries
    as `.NAME.stamp`, so an unchanged unit is skipped at the cost of reading a
    file. Binaries are written to a temporary name and renamed into place, so
    an interrupted build never leaves a truncated binary that looks built.
    devenv builds containerd 2.x with the same unit.
    """

    name: str  # the stamp's and the log's name
    module: Path  # the Go module the command runs in
    packages: tuple[str, ...]
    out_dir: Path
    stamp: str
    flags: tuple[str, ...] = ()  # after the verb: -p, -trimpath, -tags, -ldflags ...
    test: bool = False  # `go test -c` (one package) instead of `go build`
    # The binaries' names, one per package; default: each package's last path element.
    names: tuple[str, ...] = ()

    @property
    def binaries(self) -> list[Path]:
        names = self.names or tuple(p.rstrip("/").rsplit("/", 1)[-1] for p in self.packages)
        return [self.out_dir / n for n in names]

    @property
    def stamp_path(self) -> Path:
        return self.out_dir / f".{self.name}.stamp"

    def up_to_date(self) -> bool:
        if not all(os.access(b, os.X_OK) for b in self.binaries):
            return False
        try:
            return self.stamp_path.read_text() == self.stamp
        except OSError:
            return False

    def run(self, env: dict[str, str], log: Callable[[str], None], *,
            force: bool = False) -> Result:
        """Build unless up to date (call it inside build_lock(out_dir))."""
        first = self.binaries[0]
        if not force and self.up_to_date():
            log(f"{self.name}: up to date ({first})")
            return Result(self.name, first, False, 0.0)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{self.name}.tmp.", dir=self.out_dir) as tmp:
            if len(self.packages) == 1:  # -o names the file (`go test -c` needs that)
                outs = [Path(tmp) / first.name]
                target = str(outs[0])
            else:  # -o DIR/ writes one binary per main package into DIR, named by package
                if self.names:
                    raise BuildError(f"{self.name}: names are for one-package builds")
                outs = [Path(tmp) / b.name for b in self.binaries]
                target = tmp + "/"
            verb = ["test", "-c"] if self.test else ["build"]
            cmd = ["go", *verb, *self.flags, "-o", target, *self.packages]
            log(f"{self.name}: building {' '.join(self.packages)} ...")
            t0 = time.monotonic()
            proc = subprocess.run(cmd, cwd=self.module, env=env, check=False)
            dt = time.monotonic() - t0
            if proc.returncode != 0:
                raise BuildError(f"{self.name}: go build failed (exit {proc.returncode}) "
                                 f"after {dt:.0f}s: {' '.join(cmd)}")
            for out, dest in zip(outs, self.binaries, strict=True):
                os.replace(out, dest)
        self.stamp_path.write_text(self.stamp)
        size = sum(b.stat().st_size for b in self.binaries) / 2**20
        log(f"{self.name}: built in {dt:.1f}s ({size:.0f} MiB)")
        return Result(self.name, first, True, dt)


@contextmanager
def build_lock(out_dir: Path, log: Callable[[str], None]) -> Iterator[None]:
    """One build at a time per cache (two test sessions starting together):
    the second waits, then finds the binaries up to date."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another build holds {out_dir / '.build.lock'}; waiting")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(names: list[str] | None = None, *, version: str = K8S_VERSION,
          force: bool = False) -> list[Result]:
    """Build the named components (default: all) into bin_dir(version).

    Sequential per binary, each `go build -p jobs()`: Go already compiles
    packages in parallel inside one build, and two concurrent builds of
    overlapping graphs would compile the shared packages twice.
    """
    if version != K8S_VERSION:
        raise BuildError(f"only {K8S_VERSION} is pinned in conformance/k8s/go.mod")
    names = list(names or COMPONENTS)
    unknown = [n for n in names if n not in COMPONENTS and n not in EXTRA_COMPONENTS]
    if unknown:
        raise BuildError(f"unknown component(s): {', '.join(unknown)}; "
                         f"known: {', '.join([*COMPONENTS, *EXTRA_COMPONENTS])}")
    if shutil.which("go") is None:
        raise BuildError("go is not on PATH (see ../shared/ENVIRONMENT.md)")
    _check_pin()
    for module in {EXTRA_COMPONENTS[n][0] for n in names if n in EXTRA_COMPONENTS}:
        if module != CSI_MODULE:  # the CSI tools' module does not build from k8s.io/kubernetes
            _check_pin(module)
    env = go_env()
    gov = go_version(env)
    out_dir = bin_dir(version)
    with build_lock(out_dir, _log):
        return _build_locked(names, version, force, env, gov, out_dir)


def _build_locked(names: list[str], version: str, force: bool, env: dict[str, str],
                  gov: str, out_dir: Path) -> list[Result]:
    p = jobs()
    results: list[Result] = []
    total0 = time.monotonic()
    for name in names:
        module, pkg, kind = EXTRA_COMPONENTS.get(name) or (GO_MODULE, COMPONENTS[name], "build")
        unit = GoBuild(name, module, (pkg,), out_dir, _stamp(name, gov, version),
                       flags=(f"-p={p}", "-trimpath", f"-ldflags={ldflags(version)}"),
                       test=kind == "test", names=(name,))  # e2e.test is not its package's name
        results.append(unit.run(env, _log, force=force))
    _log(f"done in {time.monotonic() - total0:.1f}s -> {out_dir}")
    return results


def ensure_built(names: list[str] | None = None, version: str = K8S_VERSION) -> Path:
    """Build what is missing or stale; return the bin directory."""
    build(names, version=version)
    return bin_dir(version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane build",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("components", nargs="*",
                        help=f"default: all of {', '.join(COMPONENTS)}; "
                             f"on request only: {', '.join(EXTRA_COMPONENTS)}")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--print-dir", action="store_true",
                        help="only print the bin directory and exit")
    args = parser.parse_args(argv)
    if args.print_dir:
        print(bin_dir())
        return 0
    try:
        build(args.components or None, force=args.force)
    except BuildError as e:
        _log(f"error: {e}")
        return 1
    print(bin_dir())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
