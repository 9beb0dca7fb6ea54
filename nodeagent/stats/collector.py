"""Usage collection: what the node and each of its pods use, sampled on the kubelet's periods
from the runtime's CRI stats (ListContainerStats, ListPodSandboxStats, ImageFsInfo) and the
host (root cgroup, /proc, statfs), with directory usage (logs, emptyDir and other volumes)
measured less often because it walks files.

The latest :class:`Usage` is what the Summary API (/stats/summary), the resource metrics
(/metrics/resource) and node-pressure eviction read. CPU rates (``usage_nano_cores``) are
derived from two samples when the runtime does not give them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import structlog

from cri import CriError, RuntimeClient
from cri import types as t
from nodeagent import labels as L
from nodeagent.logreader import pod_log_dir
from nodeagent.pleg import Relister
from nodeagent.stats import host

log = structlog.get_logger("nodeagent.stats")

HOUSEKEEPING_SECONDS = 10.0
"""The kubelet's housekeeping interval: CRI stats and the node's own figures."""
VOLUME_STATS_SECONDS = 60.0
"""The kubelet's volumeStatsAggPeriod: directories are walked this often."""
CRI_TIMEOUT_SECONDS = 10.0
MEASURED_PLUGINS = frozenset({"kubernetes.io~csi"})
"""Volume directories whose figures come from their stage (``volume_providers``), not a walk:
a CSI volume's content is the driver's to measure, and may be remote."""


@dataclass(frozen=True)
class Cpu:
    time: float
    usage_core_nano_seconds: int | None
    usage_nano_cores: int | None = None


@dataclass(frozen=True)
class Memory:
    time: float
    working_set_bytes: int | None
    usage_bytes: int | None = None
    rss_bytes: int | None = None
    page_faults: int | None = None
    major_page_faults: int | None = None
    available_bytes: int | None = None


@dataclass(frozen=True)
class Fs:
    time: float
    used_bytes: int | None
    capacity_bytes: int | None = None
    available_bytes: int | None = None
    inodes: int | None = None
    inodes_free: int | None = None
    inodes_used: int | None = None


@dataclass(frozen=True)
class Interface:
    name: str
    rx_bytes: int
    rx_errors: int
    tx_bytes: int
    tx_errors: int


@dataclass(frozen=True)
class Network:
    time: float
    default: Interface | None
    interfaces: tuple[Interface, ...] = ()


@dataclass(frozen=True)
class ContainerUsage:
    name: str
    start_time: float
    cpu: Cpu | None
    memory: Memory | None
    rootfs: Fs | None = None
    logs: Fs | None = None
    id: str = ""
    """The runtime's container ID (cAdvisor's ``name`` label)."""
    image: str = ""
    """The image the container runs, as the pod asked for it (cAdvisor's ``image`` label)."""


@dataclass(frozen=True)
class VolumeUsage:
    name: str
    fs: Fs
    pvc: tuple[str, str] | None = None
    """(namespace, claim name) of a persistent volume claim's volume."""


@dataclass(frozen=True)
class PodUsage:
    uid: str
    name: str
    namespace: str
    start_time: float
    containers: tuple[ContainerUsage, ...]
    cpu: Cpu | None
    memory: Memory | None
    network: Network | None = None
    volumes: tuple[VolumeUsage, ...] = ()
    ephemeral_storage: Fs | None = None
    process_count: int | None = None


@dataclass(frozen=True)
class NodeUsage:
    time: float
    start_time: float | None
    cpu: Cpu | None
    memory: Memory | None
    network: Network | None
    fs: Fs | None
    """The filesystem of rootDir (the kubelet's nodefs)."""
    image_fs: Fs | None
    container_fs: Fs | None
    max_pid: int | None
    processes: int
    """Running tasks (threads), what pid.available counts against ``max_pid``."""
    dedicated_image_fs: bool | None = None
    """The runtime's image filesystem is not the one holding rootDir (None: unknown)."""


@dataclass(frozen=True)
class Usage:
    node: NodeUsage
    pods: tuple[PodUsage, ...]


@dataclass
class _DirUsage:
    at: float = 0.0
    used_bytes: int = 0
    inodes_used: int = 0


def dir_usage(path: Path) -> tuple[int, int]:
    """(bytes, inodes) under ``path`` on its filesystem, symlinks not followed (du -x -s and
    find -xdev, as the kubelet's fsquota-less volume metrics)."""
    total, inodes = 0, 0
    try:
        device = os.lstat(path).st_dev
    except OSError:
        return 0, 0
    stack = [str(path)]
    while stack:
        current = stack.pop()
        try:
            entries = os.scandir(current)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                inodes += 1
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False) and st.st_dev == device:
                    stack.append(entry.path)
    return total, inodes


@dataclass
class UsageCollector:
    runtime: RuntimeClient
    relister: Relister
    node_name: str
    root_dir: Path
    pod_logs_dir: Path
    housekeeping_seconds: float = HOUSEKEEPING_SECONDS
    volume_stats_seconds: float = VOLUME_STATS_SECONDS
    cgroup_root: Path = host.CGROUP
    proc: Path = host.PROC
    latest: Usage | None = None
    """The last complete sample (None before the first)."""
    error: str = ""
    """Why the last sample is missing pod figures ("" when the runtime answered)."""
    samples: int = 0
    last_sample_seconds: float = 0.0
    _previous_cpu: dict[str, Cpu] = field(default_factory=dict)
    _dirs: dict[Path, _DirUsage] = field(default_factory=dict)
    _wake: anyio.Event = field(default_factory=anyio.Event)
    listeners: list[Callable[[Usage], None]] = field(default_factory=list)
    """Called with every new sample (eviction's monitor)."""
    volume_providers: list[Callable[[str], Iterable[VolumeUsage]]] = field(default_factory=list)
    """Figures of volumes a stage measures itself, by pod UID (the csi stage's
    ``volume_usage``: NodeGetVolumeStats, with the PVC). Their plugin directories are not
    walked, and a PVC's volume is not the pod's ephemeral storage."""

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sample now, then every housekeeping period or when asked (``request``). Reports
        started at once: nothing in the agent's start waits for the first sample."""
        task_status.started()
        while True:
            try:
                await self.sample()
            except OSError as exc:  # a host file that cannot be read: next period, not a restart
                self.error = str(exc)
                log.warning("usage sample failed", error=self.error)
            with anyio.move_on_after(self.housekeeping_seconds):
                await self._wake.wait()
            self._wake = anyio.Event()

    def request(self) -> None:
        """Sample now rather than at the next tick (eviction after it killed a pod)."""
        self._wake.set()

    def render_metrics(self) -> str:
        """nodeagent_stats_* series for /metrics: how many samples, how long the last took."""
        return ("# HELP nodeagent_stats_samples_total Usage samples taken (nodeagent.stats).\n"
                "# TYPE nodeagent_stats_samples_total counter\n"
                f"nodeagent_stats_samples_total {self.samples}\n"
                "# HELP nodeagent_stats_sample_seconds Seconds the last usage sample took.\n"
                "# TYPE nodeagent_stats_sample_seconds gauge\n"
                f"nodeagent_stats_sample_seconds {self.last_sample_seconds:.6f}\n"
                "# HELP nodeagent_stats_runtime_error 1 when the last sample lacked the runtime's figures.\n"
                "# TYPE nodeagent_stats_runtime_error gauge\n"
                f"nodeagent_stats_runtime_error {1 if self.error else 0}\n")

    async def sample(self) -> Usage:
        begin = time.monotonic()
        try:
            return await self._sample()
        finally:
            self.last_sample_seconds = time.monotonic() - begin

    async def _sample(self) -> Usage:
        now = time.time()
        node = await anyio.to_thread.run_sync(self._node, now)
        node = replace(node, **await self._runtime_filesystems(now))
        pods: tuple[PodUsage, ...] = ()
        try:
            with anyio.fail_after(CRI_TIMEOUT_SECONDS):
                containers = await self.runtime.list_container_stats()
                sandboxes = await self._sandbox_stats()
            pods = await anyio.to_thread.run_sync(self._pods, containers, sandboxes, now)
            self.error = ""
        except (CriError, TimeoutError) as exc:
            self.error = str(exc) or "CRI stats did not answer"
            log.warning("container stats unavailable", error=self.error)
            if self.latest is not None:
                pods = self.latest.pods
        usage = Usage(node=node, pods=pods)
        self.latest = usage
        self.samples += 1
        for listener in list(self.listeners):
            listener(usage)
        return usage

    async def _sandbox_stats(self) -> list[t.PodSandboxStats]:
        try:
            return await self.runtime.list_pod_sandbox_stats()
        except CriError as exc:
            if getattr(exc.code, "name", "") == "UNIMPLEMENTED":
                return []  # pod figures are then the sum of the containers'
            if "not in ready state" in str(exc):
                # containerd 1.6 fails the whole call when one sandbox is stopped (a completed
                # pod's): the containers' figures still stand; pod network and process counts
                # are missing until that sandbox goes.
                log.debug("pod sandbox stats unavailable", error=str(exc))
                return []
            raise

    async def _runtime_filesystems(self, now: float) -> dict[str, Any]:
        try:
            with anyio.fail_after(CRI_TIMEOUT_SECONDS):
                usages = await self.runtime.image_fs_info()
        except (CriError, TimeoutError):
            return {"image_fs": None, "container_fs": None, "dedicated_image_fs": None}
        image_fs = self._runtime_fs(usages, now)
        return {"image_fs": image_fs, "container_fs": image_fs, "dedicated_image_fs": self._dedicated(usages)}

    def _dedicated(self, usages: Iterable[t.FilesystemUsage]) -> bool | None:
        """HasDedicatedImageFs: another device than rootDir's."""
        for usage in usages:
            mount = usage.fs_id.mountpoint if usage.fs_id is not None else ""
            try:
                return os.stat(mount).st_dev != os.stat(self.root_dir).st_dev if mount else None
            except OSError:
                return None
        return None

    @staticmethod
    def _runtime_fs(usages: Iterable[t.FilesystemUsage], now: float) -> Fs | None:
        for usage in usages:
            mount = usage.fs_id.mountpoint if usage.fs_id is not None else ""
            disk = host.filesystem(Path(mount)) if mount else None
            return Fs(time=now, used_bytes=usage.used_bytes,
                      capacity_bytes=disk.capacity_bytes if disk else None,
                      available_bytes=disk.available_bytes if disk else None,
                      inodes=disk.inodes if disk else None, inodes_free=disk.inodes_free if disk else None,
                      inodes_used=usage.inodes_used)
        return None

    # --- the node (in a thread: file reads) ----------------------------------------------------

    def _node(self, now: float) -> NodeUsage:
        cpu = self._rate("node", Cpu(now, host.cpu_usage_ns(self.cgroup_root)))
        mem = host.memory(self.cgroup_root, self.proc)
        memory = Memory(now, mem.working_set_bytes, mem.usage_bytes, mem.rss_bytes, mem.page_faults,
                        mem.major_page_faults, mem.available_bytes) if mem else None
        nodefs = host.filesystem(self.root_dir)
        fs = _fs(nodefs, now) if nodefs else None
        maxpid, processes = host.process_limits(self.proc)
        return NodeUsage(time=now, start_time=host.boot_time(self.proc), cpu=cpu, memory=memory,
                         network=_network(self.proc, now), fs=fs, image_fs=None, container_fs=None,
                         max_pid=maxpid, processes=processes)

    def _rate(self, key: str, cpu: Cpu) -> Cpu:
        """usage_nano_cores from the previous sample of ``key`` when the source gave none."""
        previous = self._previous_cpu.get(key)
        self._previous_cpu[key] = cpu
        if cpu.usage_nano_cores is not None or cpu.usage_core_nano_seconds is None or previous is None \
                or previous.usage_core_nano_seconds is None or cpu.time <= previous.time:
            return cpu
        delta = cpu.usage_core_nano_seconds - previous.usage_core_nano_seconds
        return replace(cpu, usage_nano_cores=max(int(delta / (cpu.time - previous.time)), 0))

    # --- the pods (in a thread: directory walks) -----------------------------------------------

    def _pods(self, containers: list[t.ContainerStats], sandboxes: list[t.PodSandboxStats],
              now: float) -> tuple[PodUsage, ...]:
        by_pod: dict[str, list[t.ContainerStats]] = {}
        for stats in containers:
            labels = stats.attributes.labels if stats.attributes else {}
            if labels.get(L.MANAGED_BY) == self.node_name:
                by_pod.setdefault(labels.get(L.POD_UID, ""), []).append(stats)
        sandbox_of = {s.attributes.labels.get(L.POD_UID, ""): s for s in sandboxes
                      if s.attributes is not None and s.attributes.labels.get(L.MANAGED_BY) == self.node_name}
        out = []
        seen: set[str] = set()
        for uid, pod in self.relister.pods().items():
            sandbox = pod.ready_sandbox()
            if sandbox is None:
                continue
            seen.add(uid)
            running = {c.id: c for c in pod.containers if c.running}
            log_dir = pod_log_dir(self.pod_logs_dir, pod.namespace, pod.name, uid)
            usages = []
            for stats in by_pod.get(uid, []):
                record = running.get(stats.attributes.id if stats.attributes else "")
                if record is None:
                    continue  # the kubelet reports running containers only
                usages.append(ContainerUsage(
                    name=record.name, start_time=record.started_at / 1e9,
                    cpu=self._rate(record.id, _cpu(stats.cpu, now)), memory=_memory(stats.memory, now),
                    rootfs=_writable(stats.writable_layer, now),
                    logs=self._dir_fs(log_dir / record.name, now), id=record.id, image=record.image))
            pod_stats = sandbox_of.get(uid)
            linux = pod_stats.linux if pod_stats is not None else None
            cpu = self._rate(f"pod:{uid}", _cpu(linux.cpu, now)) if linux and linux.cpu else _sum_cpu(usages, now)
            memory = _memory(linux.memory, now) if linux and linux.memory else _sum_memory(usages, now)
            volumes = tuple(self._volumes(uid, now))
            out.append(PodUsage(
                uid=uid, name=pod.name, namespace=pod.namespace, start_time=sandbox.created_at / 1e9,
                containers=tuple(usages), cpu=cpu, memory=memory,
                network=_pod_network(linux.network, now) if linux and linux.network else None,
                volumes=volumes, ephemeral_storage=_ephemeral(usages, volumes, now),
                process_count=linux.process.process_count if linux and linux.process else None))
        # Rates are kept for what was sampled now; a gone pod's or container's go with it.
        live = {"node"} | {f"pod:{uid}" for uid in seen} | {
            s.attributes.id for stats in by_pod.values() for s in stats if s.attributes is not None}
        for key in [k for k in self._previous_cpu if k not in live]:
            del self._previous_cpu[key]
        return tuple(out)

    def _volumes(self, uid: str, now: float) -> Iterable[VolumeUsage]:
        for provider in self.volume_providers:
            try:
                yield from provider(uid)
            except Exception as exc:  # noqa: BLE001 -- a stage's bug costs its figures, not the sample
                log.warning("volume figures of a stage failed", pod=uid, error=repr(exc))
        base = self.root_dir / "pods" / uid / "volumes"
        try:
            plugins = sorted(p for p in base.iterdir() if p.is_dir() and p.name not in MEASURED_PLUGINS)
        except OSError:
            return
        for plugin in plugins:
            for volume in sorted(p for p in plugin.iterdir() if p.is_dir()):
                fs = self._dir_fs(volume, now)
                if fs is not None:
                    yield VolumeUsage(name=volume.name, fs=fs)

    def _dir_fs(self, path: Path, now: float) -> Fs | None:
        if self.volume_stats_seconds < 0:
            return None  # volumeStatsAggPeriod negative: disabled, as the kubelet's
        cached = self._dirs.get(path)
        if cached is None or now - cached.at >= self.volume_stats_seconds:
            if not path.exists():
                self._dirs.pop(path, None)
                return None
            used, inodes = dir_usage(path)
            cached = self._dirs[path] = _DirUsage(now, used, inodes)
        disk = host.filesystem(path)
        return Fs(time=cached.at, used_bytes=cached.used_bytes, inodes_used=cached.inodes_used,
                  capacity_bytes=disk.capacity_bytes if disk else None,
                  available_bytes=disk.available_bytes if disk else None,
                  inodes=disk.inodes if disk else None, inodes_free=disk.inodes_free if disk else None)

    def forget(self, uid: str) -> None:
        """A pod went: drop what was cached for it."""
        prefix = str(self.root_dir / "pods" / uid)
        for path in [p for p in self._dirs if str(p).startswith(prefix)]:
            del self._dirs[path]
        self._previous_cpu.pop(f"pod:{uid}", None)


def _fs(usage: host.FsUsage, now: float) -> Fs:
    return Fs(time=now, used_bytes=usage.used_bytes, capacity_bytes=usage.capacity_bytes,
              available_bytes=usage.available_bytes, inodes=usage.inodes, inodes_free=usage.inodes_free,
              inodes_used=usage.inodes_used)


def _cpu(cpu: t.CpuUsage | None, now: float) -> Cpu:
    if cpu is None:
        return Cpu(now, None)
    return Cpu(cpu.timestamp / 1e9 if cpu.timestamp else now, cpu.usage_core_nano_seconds, cpu.usage_nano_cores)


def _memory(memory: t.MemoryUsage | None, now: float) -> Memory | None:
    if memory is None:
        return None
    return Memory(memory.timestamp / 1e9 if memory.timestamp else now, memory.working_set_bytes, memory.usage_bytes,
                  memory.rss_bytes, memory.page_faults, memory.major_page_faults, memory.available_bytes)


def _writable(fs: t.FilesystemUsage | None, now: float) -> Fs | None:
    if fs is None:
        return None
    return Fs(time=fs.timestamp / 1e9 if fs.timestamp else now, used_bytes=fs.used_bytes, inodes_used=fs.inodes_used)


def _sum_cpu(containers: list[ContainerUsage], now: float) -> Cpu | None:
    cpus = [c.cpu for c in containers if c.cpu is not None and c.cpu.usage_core_nano_seconds is not None]
    if not cpus:
        return None
    rates = [c.usage_nano_cores for c in cpus]
    return Cpu(now, sum(c.usage_core_nano_seconds or 0 for c in cpus),
               sum(r or 0 for r in rates) if all(r is not None for r in rates) else None)


def _sum_memory(containers: list[ContainerUsage], now: float) -> Memory | None:
    mems = [c.memory for c in containers if c.memory is not None]
    if not mems:
        return None
    return Memory(now, sum(m.working_set_bytes or 0 for m in mems), sum(m.usage_bytes or 0 for m in mems),
                  sum(m.rss_bytes or 0 for m in mems))


def _ephemeral(containers: tuple[ContainerUsage, ...] | list[ContainerUsage], volumes: tuple[VolumeUsage, ...],
               now: float) -> Fs:
    """rootfs + logs + the pod's volumes on the node's disk (the kubelet's ephemeral-storage)."""
    used = sum((c.rootfs.used_bytes or 0) if c.rootfs else 0 for c in containers)
    used += sum((c.logs.used_bytes or 0) if c.logs else 0 for c in containers)
    used += sum(v.fs.used_bytes or 0 for v in volumes if v.pvc is None)
    return Fs(time=now, used_bytes=used)


def _network(proc: Path, now: float) -> Network | None:
    found = [Interface(i.name, i.rx_bytes, i.rx_errors, i.tx_bytes, i.tx_errors) for i in host.interfaces(proc)]
    if not found:
        return None
    name = host.default_interface(proc)
    return Network(now, next((i for i in found if i.name == name), found[0]), tuple(found))


def _pod_network(network: t.NetworkUsage, now: float) -> Network:
    def interface(i: t.NetworkInterfaceUsage) -> Interface:
        return Interface(i.name, i.rx_bytes or 0, i.rx_errors or 0, i.tx_bytes or 0, i.tx_errors or 0)

    default = interface(network.default_interface) if network.default_interface else None
    return Network(network.timestamp / 1e9 if network.timestamp else now, default,
                   tuple(interface(i) for i in network.interfaces))


__all__ = ["ContainerUsage", "Cpu", "Fs", "Memory", "Network", "NodeUsage", "PodUsage", "Usage", "UsageCollector",
           "VolumeUsage", "dir_usage"]
