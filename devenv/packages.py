"""Debian packages the real test environment needs, installed only when missing.

CI starts on a fresh Debian 12 machine, so nothing here may assume the tools
are present; on a developer machine they usually are, and then we must not
touch apt at all (no network, no root needed, no minutes lost).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Requirement:
    """One Debian package and a file whose presence proves it is usable."""

    package: str
    probe: str  # an absolute path, or a command name looked up on PATH

    def satisfied(self) -> bool:
        if os.path.isabs(self.probe):
            return os.path.exists(self.probe)
        return shutil.which(self.probe) is not None


# The second OCI runtime, configured as CRI runtime handler "crun" (RuntimeClass).
CRUN = Requirement("crun", "/usr/bin/crun")

# Probes are files rather than `dpkg -s`, because what matters is the tool being
# there (and a probe is ~1000x faster than a dpkg call per package).
REQUIREMENTS: tuple[Requirement, ...] = (
    # containerd 1.6, the compatibility target (2.x is built by devenv.runtime);
    # its containerd-shim-runc-v2 is only used by 1.6.
    Requirement("containerd", "/usr/bin/containerd"),
    Requirement("runc", "/usr/sbin/runc"),
    CRUN,
    # Debian puts the CNI plugins in /usr/lib/cni, not /opt/cni/bin.
    Requirement("containernetworking-plugins", "/usr/lib/cni/bridge"),
    # The busybox image is made from this binary; it must be the static build.
    Requirement("busybox-static", "/bin/busybox"),
    Requirement("iproute2", "ip"),
    # portmap and bridge need iptables (a dependency of the CNI plugins anyway).
    Requirement("iptables", "iptables"),
    # pause.c is compiled with `gcc -static`: that needs libc.a from libc6-dev.
    Requirement("gcc", "gcc"),
    Requirement("make", "make"),  # .ci/run and the README go through make
    Requirement("libc6-dev", "/usr/include/stdio.h"),
    # runc for containerd 2.x is a cgo build with seccomp (devenv.runtime.build_runc):
    # libseccomp-golang finds the library through pkg-config.
    Requirement("libseccomp-dev", "/usr/include/seccomp.h"),
    Requirement("pkg-config", "pkg-config"),
    # The shutdown stage's logind path (systemd-inhibit, gdbus) and its test's stand-in logind
    # on a private bus (dbus-daemon, the system Python's dbus and GLib bindings).
    Requirement("systemd", "/usr/bin/systemd-inhibit"),
    Requirement("libglib2.0-bin", "gdbus"),
    Requirement("dbus-daemon", "dbus-daemon"),
    Requirement("python3-dbus", "/usr/lib/python3/dist-packages/dbus"),
    Requirement("python3-gi", "/usr/lib/python3/dist-packages/gi"),
)


def missing_packages() -> list[str]:
    """Names of the required packages whose probe file is absent."""
    return [r.package for r in REQUIREMENTS if not r.satisfied()]


def ensure_packages(*, log: bool = True) -> list[str]:
    """Install the missing packages with apt-get; return what was installed.

    `apt-get update` runs only when something must be installed: it is the slow,
    network-bound part, and a warm machine should not pay for it.
    """
    missing = missing_packages()
    if not missing:
        return []
    if os.geteuid() != 0:
        raise PermissionError(
            f"devenv needs Debian packages {' '.join(missing)}; run as root "
            f"or install them: apt-get install -y {' '.join(missing)}"
        )
    if log:
        print(f"devenv: installing {' '.join(missing)}", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # stdin is closed in CI; make sure apt never waits for an answer.
    run = dict(env=env, stdin=subprocess.DEVNULL, check=True)
    subprocess.run(["apt-get", "update", "-q"], **run)  # type: ignore[call-overload]
    subprocess.run(  # type: ignore[call-overload]
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], **run
    )
    still = missing_packages()
    if still:
        raise RuntimeError(f"apt-get did not provide: {' '.join(still)}")
    return missing


def busybox_path() -> Path:
    """The static busybox binary (on merged-/usr Debian /bin is /usr/bin)."""
    return Path("/bin/busybox").resolve()


if __name__ == "__main__":
    # Runnable as a plain file (`python3 devenv/packages.py`), before the
    # project and its Python dependencies are installed: stdlib only here.
    installed = ensure_packages()
    print("devenv: installed " + " ".join(installed) if installed
          else "devenv: all Debian packages present", file=sys.stderr)
