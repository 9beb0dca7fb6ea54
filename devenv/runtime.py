"""Which containerd devenv runs, and where its binaries come from.

    NODEAGENT_RUNTIME=containerd2      (default) containerd 2.x, built here from the Go module proxy
    NODEAGENT_RUNTIME=containerd1.6    Debian 12's containerd 1.6.20, the compatibility target

containerd 2.x is what the nodes our users run have, so it is what nodeagent
is developed and tested on; 1.6 stays because Debian ships it and because the
agent must keep working on runtimes without the newer CRI calls.

The 2.x binaries (containerd, containerd-shim-runc-v2, ctr) are built by the
Go module in devenv/containerd2 into a stamped, version-keyed cache next to
the control plane's (controlplane.build's GoBuild unit and lock):

    ~/.cache/nodeagent/containerd/<version>/bin/{containerd,containerd-shim-runc-v2,ctr}

Only this module knows that path: everything else asks a Runtime for
`command("ctr")` or lets devenv.Containerd start the daemon. crun is Debian's
for both; runc is Debian's (1.1.5) for 1.6, but 2.x's default handler runs a
runc built by the Go module in devenv/runc into the same kind of cache:

    ~/.cache/nodeagent/runc/<version>/bin/runc

because Debian's runc predates idmapped mounts (runc >= 1.2): containerd 2.x
asks `runc features` and, without them, reports that no handler supports user
namespaces, so every `hostUsers: false` pod would be refused. With runc 1.5.x
the default handler says user_namespaces: true (measured: containerd 2.4.2).
It is a cgo build with the `seccomp` tag (libseccomp-dev, pkg-config; see
devenv.packages), as Debian's and upstream's releases are.

Build from the command line with `python -m devenv runtime build`; the
session fixture, `make demo`/`make env`, the benchmarks and the upstream e2e
runner build on first use through Containerd.start().
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from controlplane import build as gobuild

RUNTIME_ENV = "NODEAGENT_RUNTIME"
CONTAINERD2 = "containerd2"
CONTAINERD16 = "containerd1.6"
DEFAULT_RUNTIME = CONTAINERD2
RUNTIMES = (CONTAINERD2, CONTAINERD16)

# The pinned containerd 2.x; devenv/containerd2/go.mod must agree (checked at build).
# v2.4.2 is the newest v2.4.x the proxy serves (`go list -m -versions
# github.com/containerd/containerd/v2`, checked 2026-12-01).
CONTAINERD2_VERSION = "v2.4.2"
GO_MODULE = Path(__file__).resolve().parent / "containerd2"
_PKG = "github.com/containerd/containerd/v2"
# One `go build` of the three: they share most of their packages.
PACKAGES = (f"{_PKG}/cmd/containerd", f"{_PKG}/cmd/containerd-shim-runc-v2", f"{_PKG}/cmd/ctr")
# btrfs needs libbtrfs headers the machines lack (and no btrfs is used here).
BUILD_TAGS = "no_btrfs"


def _log(msg: str) -> None:
    print(f"devenv runtime: {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """$NODEAGENT_CONTAINERD_CACHE, else XDG cache/nodeagent/containerd."""
    env = os.environ.get("NODEAGENT_CONTAINERD_CACHE")
    return Path(env) if env else gobuild.nodeagent_cache() / "containerd"


def containerd2_bin_dir(version: str = CONTAINERD2_VERSION) -> Path:
    return cache_root() / version / "bin"


def ldflags(version: str = CONTAINERD2_VERSION) -> str:
    """The version variables upstream's Makefile sets: CRI's Version then says
    `runtime_version: v2.4.2` instead of the source default `2.4.2+unknown`."""
    return " ".join(["-s", "-w",
                     f"-X {_PKG}/version.Version={version}",
                     f"-X {_PKG}/version.Package={_PKG}"])


def _check_pin(version: str) -> None:
    text = (GO_MODULE / "go.mod").read_text()
    m = re.search(r"^require github\.com/containerd/containerd/v2 (v\S+)", text, re.MULTILINE) \
        or re.search(r"^\s+github\.com/containerd/containerd/v2 (v\S+)", text, re.MULTILINE)
    if not m or m.group(1) != version:
        raise gobuild.BuildError(f"devenv/containerd2/go.mod does not pin containerd {version}")


def _env() -> dict[str, str]:
    env = gobuild.go_env()
    # cgo: upstream's containerd is a cgo binary; the same flags for all three
    # keep it one build that compiles the shared packages once.
    env["CGO_ENABLED"] = "1"
    return env


def _unit(version: str, env: dict[str, str]) -> gobuild.GoBuild:
    h = hashlib.sha256()
    for path in sorted([GO_MODULE / "go.mod", GO_MODULE / "go.sum", *GO_MODULE.glob("*.go")]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    gov = gobuild.go_version(env, GO_MODULE)
    flags = (f"-p={gobuild.jobs()}", "-trimpath", f"-tags={BUILD_TAGS}", f"-ldflags={ldflags(version)}")
    h.update("\0".join([*PACKAGES, gov, env["CGO_ENABLED"], *flags]).encode())
    return gobuild.GoBuild("containerd", GO_MODULE, PACKAGES, containerd2_bin_dir(version),
                           h.hexdigest(), flags=flags)


def build_containerd2(version: str = CONTAINERD2_VERSION, *, force: bool = False) -> Path:
    """Build containerd 2.x (daemon, shim, ctr) unless the cache is up to date;
    return its bin directory. Idempotent; one build at a time per cache (a
    second caller waits on the lock, then finds it built). Minutes cold, a
    stamp read warm."""
    if shutil.which("go") is None:
        raise gobuild.BuildError("go is not on PATH: containerd 2.x is built from the Go "
                                 f"module proxy (or set {RUNTIME_ENV}={CONTAINERD16})")
    _check_pin(version)
    env = _env()
    unit = _unit(version, env)
    if not force and unit.up_to_date():  # the warm path takes no lock
        return unit.out_dir
    t0 = time.monotonic()
    with gobuild.build_lock(unit.out_dir, _log):
        result = unit.run(env, _log, force=force)
    if result.built:
        _log(f"containerd {version} ready in {time.monotonic() - t0:.1f}s -> {unit.out_dir}")
    return unit.out_dir


# runc for containerd 2.x's default handler; devenv/runc/go.mod must agree.
# v1.5.3: the newest v1.5.x the proxy serves (checked 2026-12-01; v1.6.0-rc too).
RUNC_VERSION = "v1.5.3"
RUNC_MODULE = Path(__file__).resolve().parent / "runc"
RUNC_PACKAGE = "github.com/opencontainers/runc"
RUNC_BUILD_TAGS = "seccomp"


def runc_bin_dir(version: str = RUNC_VERSION) -> Path:
    """$NODEAGENT_RUNC_CACHE/<version>/bin, else XDG cache/nodeagent/runc/<version>/bin."""
    env = os.environ.get("NODEAGENT_RUNC_CACHE")
    return (Path(env) if env else gobuild.nodeagent_cache() / "runc") / version / "bin"


def _runc_unit(version: str, env: dict[str, str]) -> gobuild.GoBuild:
    text = (RUNC_MODULE / "go.mod").read_text()
    if not re.search(rf"^require {re.escape(RUNC_PACKAGE)} {re.escape(version)}$", text, re.MULTILINE):
        raise gobuild.BuildError(f"devenv/runc/go.mod does not pin runc {version}")
    h = hashlib.sha256()
    for path in sorted([RUNC_MODULE / "go.mod", RUNC_MODULE / "go.sum", *RUNC_MODULE.glob("*.go")]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    gov = gobuild.go_version(env, RUNC_MODULE)
    # runc's Makefile sets its version the same way (`runc --version` says 1.5.3).
    flags = (f"-p={gobuild.jobs()}", "-trimpath", f"-tags={RUNC_BUILD_TAGS}",
             f"-ldflags=-s -w -X main.version={version.lstrip('v')}")
    h.update("\0".join([RUNC_PACKAGE, gov, env["CGO_ENABLED"], *flags]).encode())
    return gobuild.GoBuild("runc", RUNC_MODULE, (RUNC_PACKAGE,), runc_bin_dir(version), h.hexdigest(), flags=flags)


def build_runc(version: str = RUNC_VERSION, *, force: bool = False) -> Path:
    """Build runc unless the cache is up to date; return the binary. Idempotent, locked
    like containerd's build; seconds when the module cache is warm."""
    if shutil.which("go") is None:
        raise gobuild.BuildError("go is not on PATH: runc for containerd 2.x is built from the Go module proxy "
                                 f"(or set {RUNTIME_ENV}={CONTAINERD16})")
    env = _env()
    unit = _runc_unit(version, env)
    if force or not unit.up_to_date():
        t0 = time.monotonic()
        with gobuild.build_lock(unit.out_dir, _log):
            result = unit.run(env, _log, force=force)
        if result.built:
            _log(f"runc {version} ready in {time.monotonic() - t0:.1f}s -> {unit.out_dir}")
    return unit.binaries[0]


@dataclass(frozen=True)
class Runtime:
    """One containerd flavour: how devenv starts it and writes its config."""

    name: str  # one of RUNTIMES
    # The config schema written for it: 3 is 2.x's native one (plugin ids
    # io.containerd.cri.v1.*); 1.6 knows only version 2.
    config_version: int
    # Where containerd, its shim and ctr are; None: Debian's, on PATH.
    bin_dir: Path | None = None
    # The runc of the default handler; None: Debian's (/usr/sbin/runc, found by the shim).
    runc: Path | None = None

    def ensure(self) -> Runtime:
        """Make the binaries exist (build 2.x and its runc if needed); return self."""
        if self.name == CONTAINERD2:
            assert self.bin_dir is not None
            built = build_containerd2()
            if built != self.bin_dir:
                raise RuntimeError(f"containerd 2.x built into {built}, expected {self.bin_dir}")
            if self.runc is not None and build_runc() != self.runc:
                raise RuntimeError(f"runc not built into {self.runc}")
        return self

    def command(self, name: str) -> str:
        """The executable to run for `containerd` / `ctr` / the shim."""
        return str(self.bin_dir / name) if self.bin_dir else name

    def path_env(self, path: str) -> str:
        """PATH for the daemon: our shim before any other (containerd finds
        containerd-shim-runc-v2 on PATH), then what `path` had."""
        return f"{self.bin_dir}:{path}" if self.bin_dir else path


def selected(name: str | None = None) -> Runtime:
    """The runtime `name` names, else $NODEAGENT_RUNTIME's, else containerd 2.x.
    Does not build anything (Runtime.ensure() does)."""
    name = name or os.environ.get(RUNTIME_ENV) or DEFAULT_RUNTIME
    if name == CONTAINERD2:
        return Runtime(CONTAINERD2, 3, containerd2_bin_dir(), runc_bin_dir() / "runc")
    if name == CONTAINERD16:
        return Runtime(CONTAINERD16, 2)
    raise ValueError(f"{RUNTIME_ENV}={name!r}: expected one of {', '.join(RUNTIMES)}")


def main(argv: list[str] | None = None) -> int:
    """`python -m devenv runtime [build|which]`."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m devenv runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build containerd 2.x and its runc into the cache (idempotent)")
    p_build.add_argument("--force", action="store_true")
    sub.add_parser("which", help=f"print the runtime {RUNTIME_ENV} selects")
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            print(build_containerd2(force=args.force))
            print(build_runc(force=args.force))
        except gobuild.BuildError as e:
            _log(f"error: {e}")
            return 1
    else:
        rt = selected()
        print(rt.name, rt.command("containerd"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
