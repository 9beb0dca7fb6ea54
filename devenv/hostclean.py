"""Forced cleanup of what a containerd leaves on the host when it is killed.

A stopped containerd leaves running shims (and their containers), overlay and
nsfs mounts under its root/state, shim sockets in /run/containerd/s and CNI
result caches. Tests run many environments on one machine, so each must be
removed completely; these helpers find those leftovers by path, never by
process name, so that another environment on the machine is left alone.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below `base`, in mount order (parents first)."""
    prefix = str(base).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape(line.split()[4])
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


def unmount_all(base: Path) -> list[str]:
    """Lazily unmount everything below `base`, deepest first; return what was unmounted.

    umount2(MNT_DETACH) through libc avoids one `umount` process per mount
    (a session can have hundreds) and never blocks on a busy mount.
    """
    done: list[str] = []
    for _ in range(5):  # a detached parent can reveal mounts stacked underneath
        points = mounts_under(base)
        if not points:
            break
        for point in sorted(set(points), key=lambda p: p.count("/"), reverse=True):
            if _libc.umount2(point.encode(), _MNT_DETACH) == 0:
                done.append(point)
            else:
                err = ctypes.get_errno()
                if err not in (errno.EINVAL, errno.ENOENT):  # already gone
                    raise OSError(err, f"umount2 {point}: {os.strerror(err)}")
    return done


def pid_cmdline(pid: int) -> list[str]:
    """argv of a process ([] if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def pid_alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie (a zombie's parent may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def shims_of(socket_path: str) -> dict[int, list[str]]:
    """containerd-shim processes started by the containerd listening on `socket_path`.

    A v2 shim is started as `containerd-shim-runc-v2 -namespace NS -id ID
    -address SOCKET`, so the address tells which containerd owns it.
    """
    shims: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = pid_cmdline(int(entry))
        if not argv or "containerd-shim" not in os.path.basename(argv[0]):
            continue
        try:
            if argv[argv.index("-address") + 1] == socket_path:
                shims[int(entry)] = argv
        except (ValueError, IndexError):
            continue
    return shims


def shim_socket(argv: list[str]) -> Path | None:
    """Where a shim listens: /run/containerd/s/sha256(address/namespace/id).

    Mirrors containerd's shim.SocketAddress (1.6 runtime/v2/shim, 2.x pkg/shim: the
    same); the socket root is fixed there (not under our state dir), so a killed
    shim leaves it behind.
    """
    try:
        ns = argv[argv.index("-namespace") + 1]
        ident = argv[argv.index("-id") + 1]
        address = argv[argv.index("-address") + 1]
    except (ValueError, IndexError):
        return None
    digest = hashlib.sha256(os.path.join(address, ns, ident).encode()).hexdigest()
    return Path("/run/containerd/s") / digest


def kill_and_wait(pids: list[int], sig: int = signal.SIGKILL, timeout: float = 5.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def delete_runc_containers(runc_root: Path, binary: str = "runc") -> list[str]:
    """`runc delete --force` every container in the state under `runc_root`.

    Killing a shim does not kill its containers (they are re-parented), but
    runc kills a container's whole cgroup or PID namespace. Our containerd
    config points runc's state at a private root, so everything found here
    is ours. Layout: RUNC_ROOT/NAMESPACE/CONTAINER_ID/ (the shim passes
    --root RUNC_ROOT/NAMESPACE); crun uses the same layout and flags.
    """
    deleted: list[str] = []
    if not runc_root.is_dir():
        return deleted
    for ns_dir in runc_root.iterdir():
        if not ns_dir.is_dir():
            continue
        for cdir in ns_dir.iterdir():
            if cdir.is_dir():
                subprocess.run([binary, "--root", str(ns_dir), "delete", "--force", cdir.name],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
                deleted.append(cdir.name)
    return deleted


def delete_link(name: str) -> bool:
    """Remove a network interface (our bridge) if it exists."""
    if not Path("/sys/class/net", name).exists():
        return False
    subprocess.run(["ip", "link", "del", name], capture_output=True, stdin=subprocess.DEVNULL)
    return True


def link_ipv4_networks(name: str) -> list[str]:
    """The IPv4 interfaces (address/prefix, as `ip` prints them) of a network interface;
    empty when it does not exist."""
    if not Path("/sys/class/net", name).exists():
        return []
    out = subprocess.run(["ip", "-j", "-4", "addr", "show", "dev", name], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL).stdout
    try:
        links = json.loads(out or "[]")
    except ValueError:
        return []
    return [f"{a['local']}/{a['prefixlen']}" for link in links for a in link.get("addr_info", [])
            if "local" in a and "prefixlen" in a]


def delete_cni_cache(network_name: str, sandbox_ids: list[str],
                     cache_dir: Path = Path("/var/lib/cni/results")) -> None:
    """Drop libcni's cached ADD results of our pods.

    containerd 1.6 keeps them in the global /var/lib/cni/results, named
    NETWORK-SANDBOXID-IFNAME: ours for eth0, "cni-loopback" for lo. A CNI DEL
    removes them; a killed pod never gets one.
    """
    if not cache_dir.is_dir():
        return
    for f in cache_dir.glob(f"{network_name}-*"):
        f.unlink(missing_ok=True)
    for sandbox in sandbox_ids:
        (cache_dir / f"cni-loopback-{sandbox}-lo").unlink(missing_ok=True)
