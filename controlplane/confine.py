"""The upstream kubelet on a machine it does not own: what it would change beyond its own pods,
kept to itself or undone.

The kubelet runs here as a baseline (benchmarks/kubelet_peer.py, standalone) and as the node of an
upstream conformance run (conformance/e2e, ``--node kubelet``). On a node of its own it may change
the host as it likes; on these machines other nodes (nodeagent's tests, other sessions' kubelets)
run beside it. What it changes, read from its v1.37.2 source, and what is done about each:

- **Kernel tunables.** On start it sets vm.overcommit_memory=1, kernel.panic=10,
  kernel.panic_on_oops=1 and three more (container_manager_linux.go, setupKernelTunables), and
  they are host-wide. It runs in a private mount namespace where each of those /proc/sys files is a
  bind-mounted copy of the host's value, so its writes land in the copy (:func:`tunables_written`).
- **Its volumes must still reach the runtime.** A mount namespace of its own would hide the tmpfs
  of every secret, configMap and projected volume it mounts under its root dir from containerd,
  which runs in the host's, and the containers would see empty directories. The root dir is
  therefore a *shared* bind mount made before the namespace (these machines' mounts are all
  private), and the namespace is made without changing propagation: what the kubelet mounts there
  appears in the host's namespace at once, as it does under a containerized kubelet with an
  rshared root dir.
- **Orphan pod cgroups.** It kills the processes of pod cgroups under its root that it does not
  know (cleanupOrphanedPodCgroups). Its ``cgroupRoot`` is a directory of its own
  (:func:`make_cgroup_root`), so no other node's pods are under it.
- **iptables.** It adds KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY and KUBE-FIREWALL (a DROP rule for
  non-loopback traffic to 127.0.0.0/8, jumped to from INPUT and OUTPUT) to the host's tables when
  it runs in the host's network namespace: :func:`remove_iptables_chains` takes them out after.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")

# The /proc/sys files setupKernelTunables reads and (in its default mode) writes.
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)

# The chains the kubelet makes (pkg/kubelet/kubelet_network_linux.go), per table.
KUBELET_CHAINS = {"mangle": ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"),
                  "nat": ("KUBE-KUBELET-CANARY",),
                  "filter": ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY")}

# Inside the new mount namespace: each tunable shadowed by its copy, then the kubelet itself
# (exec: the process the caller started *is* the kubelet, for its pid, CPU and RSS).
SHADOW_TUNABLES = """set -e
dir=$1; shift
for t in {tunables}; do
  mount --bind "$dir/$(echo "$t" | tr / _)" "/proc/sys/$t"
done
exec "$@"
"""


def copy_tunables(directory: Path) -> None:
    """The host's values of :data:`KERNEL_TUNABLES` into ``directory``, one file each, so that
    the kubelet reads what it would have read."""
    directory.mkdir(parents=True, exist_ok=True)
    for t in KERNEL_TUNABLES:
        (directory / t.replace("/", "_")).write_text(Path("/proc/sys", t).read_text())


def tunables_written(directory: Path) -> dict[str, str]:
    """What the kubelet set in its shadowed /proc/sys files (it would have set the host's)."""
    out = {}
    for t in KERNEL_TUNABLES:
        value = (directory / t.replace("/", "_")).read_text().strip()
        if value != Path("/proc/sys", t).read_text().strip():
            out[t] = value
    return out


def make_shared(directory: Path) -> None:
    """``directory`` as a shared mount point of the host's namespace (a bind mount onto itself
    first when it is not one), so that mounts made below it in a namespace copied from the host's
    appear in the host's too. Undone by unmounting it (devenv.hostclean.unmount_all)."""
    directory.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", str(directory)], check=False).returncode != 0:
        subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
    subprocess.run(["mount", "--make-shared", str(directory)], check=True)


def confined_argv(argv: Sequence[str], tunables: Path) -> list[str]:
    """``argv`` run in a mount namespace of its own with the kernel tunables shadowed by the
    copies in ``tunables`` (:func:`copy_tunables`). Propagation is left as it is: a shared mount
    point (:func:`make_shared`) stays shared with the host's."""
    script = SHADOW_TUNABLES.format(tunables=" ".join(KERNEL_TUNABLES))
    return ["unshare", "--mount", "--propagation", "unchanged", "sh", "-c", script, "kubelet-confined",
            str(tunables), *argv]


def cgroup_hierarchies(root: Path = CGROUP_FS) -> list[Path]:
    """Every mounted hierarchy under /sys/fs/cgroup (v1: one per controller, plus systemd and
    the controller-less unified mount), skipping the aliases (cpu,cpuacct is linked as cpu)."""
    return [path for path in sorted(root.iterdir()) if path.is_dir() and not path.is_symlink()]


def make_cgroup_root(name: str) -> None:
    """The kubelet refuses a cgroupRoot that does not exist in every hierarchy; cpuset needs its
    cpus and mems filled in before any child may hold a task."""
    for hierarchy in cgroup_hierarchies():
        d = hierarchy / name.strip("/")
        d.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent = hierarchy / knob
            if parent.exists() and not (d / knob).read_text().strip():
                (d / knob).write_text(parent.read_text())


def remove_cgroup_root(name: str) -> list[Path]:
    """rmdir the root and what the kubelet made under it, deepest first; returns what could not
    be removed (a cgroup that still holds a task)."""
    if not name.strip("/"):
        raise ValueError("refusing to remove the host's root cgroup (every empty cgroup of the machine)")
    left = []
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / name.strip("/")
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in [*dirs, top]:
            try:
                d.rmdir()
            except OSError:
                left.append(d)
    return left


def confine(argv: Sequence[str], workdir: Path, root_dir: Path, cgroup_root: str) -> list[str]:
    """Everything above for one kubelet: tunables copied under ``workdir``, ``root_dir`` shared,
    ``cgroup_root`` made; returns the argv that runs it so."""
    copy_tunables(workdir / "tunables")
    make_shared(root_dir)
    make_cgroup_root(cgroup_root)
    return confined_argv(argv, workdir / "tunables")


def release(cgroup_root: str) -> tuple[list[str], list[Path]]:
    """After the kubelet stopped: its iptables chains removed (:func:`remove_iptables_chains`),
    its cgroup root removed; returns both functions' answers."""
    return remove_iptables_chains(), remove_cgroup_root(cgroup_root)


def remove_iptables_chains() -> list[str]:
    """Take the kubelet's chains (:data:`KUBELET_CHAINS`) out of the host's iptables and
    ip6tables: first every rule that jumps to one, then the chains. Returns what was removed, as
    ``tool table chain``; a tool that is not installed is skipped."""
    removed = []
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table, chains in KUBELET_CHAINS.items():
            listing = subprocess.run([tool, "-w", "-t", table, "-S"], check=False, capture_output=True, text=True)
            if listing.returncode != 0:
                continue
            for line in listing.stdout.splitlines():
                words = shlex.split(line)
                if len(words) >= 4 and words[0] == "-A" and "-j" in words and words[words.index("-j") + 1] in chains:
                    subprocess.run([tool, "-w", "-t", table, "-D", *words[1:]], check=False, capture_output=True)
            for chain in chains:
                if subprocess.run([tool, "-w", "-t", table, "-F", chain], check=False,
                                  capture_output=True).returncode == 0:
                    subprocess.run([tool, "-w", "-t", table, "-X", chain], check=False, capture_output=True)
                    removed.append(f"{tool} {table} {chain}")
    return removed
