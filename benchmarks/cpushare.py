"""Who had the CPU during a short window: CPU seconds per class of process between two snapshots.

The gang benchmark's start skew is made in the half second between the commit and the last
member's start, when eight nodes' agents, runtimes and one control plane share this machine's
cores. A snapshot here is every class's utime + stime so far (for the runtimes' shims with the
children they reaped: the runc that created and started a container), so the difference of two
says how much of the window each class took; the machine's own busy time says what was left.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from benchmarks.pod_start import busy_cores, machine_cpu, proc_cpu

SHIM = "containerd-shim"


@dataclass(frozen=True)
class Snapshot:
    at: float
    """time.time() of the snapshot."""
    cpu: Mapping[str, float]
    """Seconds of CPU each class has used so far."""
    machine: tuple[int, int]


def shims_of(sockets: Iterable[str], proc: Path = Path("/proc")) -> list[int]:
    """The shim processes serving any of these containerd sockets (their command line names the
    socket; they are not containerd's children once started)."""
    wanted = [s.removeprefix("unix://") for s in sockets]
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if argv and SHIM.encode() in argv[0] and any(s.encode() in argv for s in wanted):
            found.append(int(entry.name))
    return found


def snapshot(classes: Mapping[str, Iterable[int]], *, with_children: Iterable[str] = ()) -> Snapshot:
    """CPU so far of each class's processes (a process that has gone counts nothing)."""
    reaping = set(with_children)
    cpu: dict[str, float] = {}
    for name, pids in classes.items():
        total = 0.0
        for pid in pids:
            try:
                total += proc_cpu(pid, children=name in reaping)
            except OSError:
                continue
        cpu[name] = total
    return Snapshot(time.time(), cpu, machine_cpu())


def shares(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per class between two snapshots, plus ``window`` (seconds) and
    ``machine_cores`` (cores busy on the whole machine, of ``os.cpu_count()``)."""
    out = {name: after.cpu.get(name, 0.0) - used for name, used in before.cpu.items()}
    out["window"] = after.at - before.at
    out["machine_cores"] = busy_cores(before.machine, after.machine)
    return out


