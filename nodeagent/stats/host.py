"""What the node itself uses, read as the kubelet (through cAdvisor) reads it: the root cgroup
for CPU and memory, /proc for memory, processes and the network, statfs for filesystems.

Every reader takes its root (``/sys/fs/cgroup``, ``/proc``) as a parameter, so tests can point
it at a fixed tree. cgroup v1 (``cpuacct/cpuacct.usage``, ``memory/memory.stat``) and v2
(``cpu.stat``, ``memory.stat`` at the root) are both understood; a value that cannot be read
is None (the Summary API leaves it out), never a guess.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
PROC = Path("/proc")


@dataclass(frozen=True)
class FsUsage:
    capacity_bytes: int
    available_bytes: int
    used_bytes: int
    inodes: int
    inodes_free: int

    @property
    def inodes_used(self) -> int:
        return self.inodes - self.inodes_free


def filesystem(path: Path) -> FsUsage | None:
    """statfs of the filesystem holding ``path`` (the kubelet's nodefs / imagefs figures:
    available is what an unprivileged writer gets, f_bavail)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    capacity = st.f_blocks * st.f_frsize
    return FsUsage(capacity_bytes=capacity, available_bytes=st.f_bavail * st.f_frsize,
                   used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize, inodes=st.f_files, inodes_free=st.f_ffree)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _keyed(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def cgroup_v2(root: Path = CGROUP) -> bool:
    return (root / "cgroup.controllers").exists()


def cpu_usage_ns(root: Path = CGROUP) -> int | None:
    """Cumulative CPU time of the whole node, in core-nanoseconds."""
    if cgroup_v2(root):
        usec = _keyed(_read(root / "cpu.stat")).get("usage_usec")
        return usec * 1000 if usec is not None else None
    for name in ("cpuacct", "cpu,cpuacct"):
        text = _read(root / name / "cpuacct.usage")
        if text is not None and text.strip().isdigit():
            return int(text.strip())
    return None


@dataclass(frozen=True)
class MemoryUsage:
    usage_bytes: int
    working_set_bytes: int
    rss_bytes: int
    page_faults: int | None
    major_page_faults: int | None
    available_bytes: int


def meminfo(proc: Path = PROC) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in (_read(proc / "meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def memory(root: Path = CGROUP, proc: Path = PROC) -> MemoryUsage | None:
    """The node's memory as the kubelet sees it: working set = usage - inactive file pages,
    available = capacity - working set (the figure memory.available eviction compares)."""
    info = meminfo(proc)
    total = info.get("MemTotal")
    if total is None:
        return None
    if cgroup_v2(root):
        stat = _keyed(_read(root / "memory.stat"))
        usage = total - info.get("MemFree", 0)  # the root cgroup has no memory.current
        inactive = stat.get("inactive_file", info.get("Inactive(file)", 0))
        rss = stat.get("anon", 0)
        faults, major = stat.get("pgfault"), stat.get("pgmajfault")
    else:
        stat = _keyed(_read(root / "memory" / "memory.stat"))
        raw = _read(root / "memory" / "memory.usage_in_bytes")
        if raw is None or not raw.strip().isdigit():
            return None
        usage = int(raw.strip())
        inactive = stat.get("total_inactive_file", 0)
        rss = stat.get("total_rss", 0)
        faults, major = stat.get("total_pgfault"), stat.get("total_pgmajfault")
    working_set = max(usage - inactive, 0)
    return MemoryUsage(usage_bytes=usage, working_set_bytes=working_set, rss_bytes=rss, page_faults=faults,
                       major_page_faults=major, available_bytes=max(total - working_set, 0))


def process_limits(proc: Path = PROC) -> tuple[int | None, int]:
    """(the most processes the node allows, how many there are): the kubelet's rlimit stats
    (pid.available eviction compares them)."""
    maxpid = None
    for name in ("sys/kernel/pid_max", "sys/kernel/threads-max"):
        text = _read(proc / name)
        if text is not None and text.strip().isdigit():
            maxpid = int(text.strip()) if maxpid is None else min(maxpid, int(text.strip()))
    # The running tasks (threads too: pid_max and threads-max bound them), the second number
    # of /proc/loadavg's fourth field, as the kubelet reads it; a count of /proc's processes
    # when that file is missing.
    fields = (_read(proc / "loadavg") or "").split()
    if len(fields) >= 4 and "/" in fields[3] and fields[3].split("/")[1].isdigit():
        return maxpid, int(fields[3].split("/")[1])
    try:
        count = sum(1 for entry in os.scandir(proc) if entry.name.isdigit())
    except OSError:
        count = 0
    return maxpid, count


@dataclass(frozen=True)
class InterfaceUsage:
    name: str
    rx_bytes: int
    rx_errors: int
    tx_bytes: int
    tx_errors: int


def default_interface(proc: Path = PROC) -> str | None:
    """The interface of the default IPv4 route (/proc/net/route)."""
    for line in (_read(proc / "net" / "route") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def interfaces(proc: Path = PROC) -> list[InterfaceUsage]:
    """/proc/net/dev of the agent's network namespace (the host's), loopback left out."""
    out = []
    for line in (_read(proc / "net" / "dev") or "").splitlines()[2:]:
        name, _, rest = line.partition(":")
        values = rest.split()
        if len(values) >= 16 and name.strip() != "lo":
            out.append(InterfaceUsage(name.strip(), int(values[0]), int(values[2]), int(values[8]), int(values[10])))
    return out


def boot_time(proc: Path = PROC) -> float | None:
    for line in (_read(proc / "stat") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


__all__ = ["FsUsage", "InterfaceUsage", "MemoryUsage", "boot_time", "cgroup_v2", "cpu_usage_ns", "default_interface",
           "filesystem", "interfaces", "meminfo", "memory", "process_limits"]
