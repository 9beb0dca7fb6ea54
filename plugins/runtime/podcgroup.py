"""The pod cgroup, as the kubelet's pod container manager keeps it (pkg/kubelet/cm/
pod_container_manager_linux.go, helpers_linux.go ResourceConfigForPod).

containerd 1.6 puts a sandbox's containers under the sandbox config's ``cgroup_parent`` and
never writes that parent's limits (UpdatePodSandboxResources arrived in containerd 2.x): the
kubelet owns the pod cgroup, and so do we. Every pod gets ``<pods root>/<qos>/pod<uid>``, the
kubelet's layout: with ``cgroupRoot`` set, the pods root is the kubelet's own,
``<cgroupRoot>/kubepods`` (``cgroupRoot: /`` gives ``/kubepods/burstable/pod<uid>``, what the
kubelet makes and what monitoring and the node e2e specs look for); without it,
``/nodeagent-pods`` (a root of our own, so that a kubelet left on a test host never mistakes our
pods for its orphans and kills them: its cleanupOrphanedPodCgroups walks ``/kubepods``). The QoS
tiers are made at start and sized as the kubelet's QoS container manager sizes them
(:func:`ensure_qos_tiers`). Before the sandbox runs, the cpu and memory directories are made
and given the pod's values: shares from the pod's CPU requests, a CFS quota from its CPU limit
and a memory limit, where the pod-level ``spec.resources`` win over the sum of the containers.
A resize rewrites them (resize.py); cleanup removes the directories once no container is left
in them, and a periodic sweep removes those of pods the agent no longer runs (:func:`sweep`).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection
from pathlib import Path

import anyio

from cri import types as t
from nodeagent import hostpaths, quantity
from nodeagent.kube.resources import (
    CPU_PERIOD_US,
    Values,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    pod_requests,
    qos_class,
)
from nodeagent.kubeletconfig.node import NodeConfig
from nodeagent.model import Pod
from nodeagent.stages import PodContext

CGROUP_FS = Path("/sys/fs/cgroup")
DEFAULT_ROOT = "/nodeagent-pods"
"""Where pod cgroups live when ``cgroupRoot`` is not set."""
KUBEPODS = "kubepods"
"""The kubelet's node allocatable cgroup under its cgroupRoot (cm.defaultNodeAllocatableCgroupName)."""
V1_CONTROLLERS = ("cpu", "memory")
"""The hierarchies whose pod-level files we write; runc makes the pod directory in the others
(cpuset among them, which needs its cpus and mems copied down before any task may join)."""


def enabled(settings: NodeConfig | None) -> bool:
    """The node's ``cgroupsPerQOS`` (default true): false makes no pod cgroups at all, as the
    kubelet's podContainerManagerNoop."""
    return settings is None or settings.cgroups_per_qos is not False


def pods_root(settings: NodeConfig | None = None) -> str:
    """The cgroupfs path every pod cgroup is under: ``<cgroupRoot>/kubepods``, or
    :data:`DEFAULT_ROOT` when cgroupRoot is empty (validated as a clean absolute path)."""
    configured = settings.cgroup_root if settings is not None else ""
    if not configured:
        return DEFAULT_ROOT
    return posixpath.join(posixpath.normpath("/" + configured.strip("/")), KUBEPODS)


def cgroup_parent(pod: Pod, settings: NodeConfig | None = None) -> str:
    """The pod cgroup, as CRI's ``cgroup_parent`` (cgroupfs driver); empty without cgroupsPerQOS:
    the runtime then places the sandbox itself."""
    if not enabled(settings):
        return ""
    qos = qos_class(pod)
    name = hostpaths.pod_cgroup_name(pod.uid)
    root = pods_root(settings)
    if qos == "Guaranteed":
        return f"{root}/{name}"
    return f"{root}/{qos.lower()}/{name}"


def ensure_qos_tiers(root: str, burstable_cpu_milli: int) -> None:
    """The Burstable and BestEffort tiers under ``root`` as the kubelet's QoS container manager
    keeps them (qos_container_manager_linux.go: made at start, before any pod needs one, and
    monitoring and the node e2e specs expect both): BestEffort with the minimum CPU shares (2),
    Burstable with the shares of its pods' summed CPU requests (:func:`size_burstable_tier`).
    Raises OSError when the host does not let us."""
    rel = root.strip("/")
    for tier in ("burstable", "besteffort"):
        for directory in _tier_dirs(rel, tier):
            directory.mkdir(parents=True, exist_ok=True)
            if unified():
                _enable_controllers(directory)
    _write_shares(rel, "besteffort", milli_cpu_to_shares(0))
    size_burstable_tier(root, burstable_cpu_milli)


def size_burstable_tier(root: str, cpu_milli: int) -> None:
    """setCPUCgroupConfig: the Burstable tier's CPU shares from the CPU requests of every
    Burstable pod (the minimum, 2, with none), so that under contention the tiers share the CPU
    as their pods asked; the kubelet redoes it as pods come and go, and so does the runtime stage."""
    _write_shares(root.strip("/"), "burstable", milli_cpu_to_shares(cpu_milli))


def _weight(shares: int) -> int:
    """cgroup v2's cpu.weight for v1 shares (the runtime's conversion)."""
    return 1 + ((shares - 2) * 9999) // 262142


def _tier_dirs(rel: str, tier: str) -> list[Path]:
    if unified():
        return [CGROUP_FS / rel / tier]
    return [CGROUP_FS / controller / rel / tier for controller in V1_CONTROLLERS]


def _write_shares(rel: str, tier: str, shares: int) -> None:
    if unified():
        (CGROUP_FS / rel / tier / "cpu.weight").write_text(str(_weight(shares)))
    else:
        (CGROUP_FS / "cpu" / rel / tier / "cpu.shares").write_text(str(shares))


def unified() -> bool:
    return (CGROUP_FS / "cgroup.controllers").exists()


def pod_values(pod: Pod) -> Values:
    """ResourceConfigForPod: requests summed (or pod-level), limits summed only when every
    container has one (else unlimited), pod-level limits winning; the overhead added to both."""
    requests = pod_requests(pod)
    limits: dict[str, int] = {}
    for res in ("cpu", "memory"):
        containers = pod.spec.containers
        if all(quantity.parse(c.resources.limits.get(res, 0)) > 0 for c in containers):
            total = sum(quantity.base_units(res, c.resources.limits[res]) for c in containers)
            sidecars = sum(quantity.base_units(res, c.resources.limits[res]) for c in pod.spec.init_containers
                           if c.restart_policy == "Always" and res in c.resources.limits)
            peak = max((quantity.base_units(res, c.resources.limits.get(res, 0)) for c in pod.spec.init_containers
                        if c.restart_policy != "Always"), default=0)
            limits[res] = max(total + sidecars, peak)
        if pod.spec.resources is not None and res in pod.spec.resources.limits:
            limits[res] = quantity.base_units(res, pod.spec.resources.limits[res])
        # PodLimits adds the runtime class's overhead to a limit that exists (none stays none).
        if limits.get(res) and res in (pod.spec.overhead or {}):
            limits[res] += quantity.base_units(res, (pod.spec.overhead or {})[res])
    return Values(cpu_request=requests.get("cpu", 0), cpu_limit=limits.get("cpu", 0),
                  memory_request=requests.get("memory", 0), memory_limit=limits.get("memory", 0))


def sandbox_resources(pod: Pod, v: Values) -> t.LinuxContainerResources:
    """``v`` as CRI resources, for UpdatePodSandboxResources (the kubelet's
    convertResourceConfigToLinuxContainerResources of the pod's resource config)."""
    best_effort = qos_class(pod) == "BestEffort"
    quota = milli_cpu_to_quota(v.cpu_limit) if v.cpu_limit else 0
    return t.LinuxContainerResources(cpu_shares=milli_cpu_to_shares(0 if best_effort else v.cpu_request),
                                     cpu_period=CPU_PERIOD_US if quota else 0, cpu_quota=quota,
                                     memory_limit_in_bytes=v.memory_limit)


def _files(pod: Pod, v: Values, settings: NodeConfig | None) -> dict[Path, str]:
    """cgroup file -> value, for this host's cgroup version."""
    best_effort = qos_class(pod) == "BestEffort"
    shares = milli_cpu_to_shares(0 if best_effort else v.cpu_request)
    quota = milli_cpu_to_quota(v.cpu_limit) if v.cpu_limit else -1
    rel = cgroup_parent(pod, settings).lstrip("/")
    if unified():
        base = CGROUP_FS / rel
        return {
            base / "cpu.weight": str(_weight(shares)),
            base / "cpu.max": f"{quota if quota > 0 else 'max'} {CPU_PERIOD_US}",
            base / "memory.max": str(v.memory_limit) if v.memory_limit else "max",
        }
    cpu = CGROUP_FS / "cpu" / rel
    memory = CGROUP_FS / "memory" / rel
    return {
        cpu / "cpu.shares": str(shares),
        cpu / "cpu.cfs_period_us": str(CPU_PERIOD_US),
        cpu / "cpu.cfs_quota_us": str(quota),
        memory / "memory.limit_in_bytes": str(v.memory_limit) if v.memory_limit else "-1",
    }


def _write(pod: Pod, v: Values, settings: NodeConfig | None) -> None:
    for path, value in _files(pod, v, settings).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if unified():
            _enable_controllers(path.parent)
        path.write_text(value)


def _enable_controllers(directory: Path) -> None:
    """cgroup v2: cpu and memory must be enabled in every ancestor's subtree_control."""
    chain = []
    d = directory.parent
    while d != CGROUP_FS and CGROUP_FS in d.parents:
        chain.append(d)
        d = d.parent
    for ancestor in reversed(chain):
        control = ancestor / "cgroup.subtree_control"
        enabled = control.read_text().split()
        for ctl in ("cpu", "memory"):
            if ctl not in enabled:
                control.write_text(f"+{ctl}")


async def apply(ctx: PodContext, pod: Pod, values: Values | None = None) -> None:
    """Make the pod cgroup (if missing) and set ``values`` (default: the pod's). Raises OSError
    when the host does not let us (the sandbox then still runs, with containerd's defaults).
    Without cgroupsPerQOS there is no pod cgroup: nothing is written."""
    if not enabled(ctx.settings):
        return
    await anyio.to_thread.run_sync(_write, pod, values if values is not None else pod_values(pod), ctx.settings)


def widest(a: Values, b: Values) -> Values:
    """Limits no tighter than either (0 = unlimited): what the pod cgroup holds while its
    containers move from ``a`` to ``b``, so that no container is ever limited beyond its pod
    (cgroup v1 refuses a child CFS quota above its parent's)."""
    def loosest(x: int, y: int) -> int:
        return 0 if not x or not y else max(x, y)

    return Values(cpu_request=b.cpu_request, cpu_limit=loosest(a.cpu_limit, b.cpu_limit),
                  memory_request=b.memory_request, memory_limit=loosest(a.memory_limit, b.memory_limit))


def _memory_usage(pod: Pod, settings: NodeConfig | None) -> int | None:
    rel = cgroup_parent(pod, settings).lstrip("/")
    path = CGROUP_FS / rel / "memory.current" if unified() else CGROUP_FS / "memory" / rel / "memory.usage_in_bytes"
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


async def memory_usage(pod: Pod, settings: NodeConfig | None) -> int | None:
    """What the pod's processes use now (the pod cgroup's usage), None when unknown."""
    return await anyio.to_thread.run_sync(_memory_usage, pod, settings)


def _remove(pod: Pod, settings: NodeConfig | None) -> None:
    rel = cgroup_parent(pod, settings).lstrip("/")
    roots = [CGROUP_FS] if unified() else [p for p in CGROUP_FS.iterdir() if p.is_dir()]
    for root in roots:
        d = root / rel
        if d.is_dir():
            # Leftover child directories of removed containers go first (runc removes its own).
            _rmdir_tree(d)


async def remove(pod: Pod, settings: NodeConfig | None) -> None:
    """Best effort: a directory still holding a process stays (and is retried next cleanup)."""
    await anyio.to_thread.run_sync(_remove, pod, settings)


def _rmdir_tree(d: Path) -> bool:
    """rmdir ``d`` after its child directories, deepest first; False when the kernel refuses
    (a cgroup holding a process is never removed). os.walk bottom-up: directory entries' types
    come with the listing, where rglob and is_dir paid a stat for each of a cgroup's dozens of
    files, in every hierarchy, at every pod's cleanup."""
    for parent, children, _files in os.walk(d, topdown=False):
        for child in children:
            try:
                os.rmdir(os.path.join(parent, child))
            except OSError:
                pass
    try:
        os.rmdir(d)
    except OSError:
        return False
    return True


def sweep(active: Collection[str], min_age_seconds: float, now: float, root: str = DEFAULT_ROOT) -> list[str]:
    """Remove the pod cgroups under our root whose pod is not ``active`` and that hold no
    process, when older than ``min_age_seconds`` (a pod's directory is made just before its
    sandbox; the age keeps a pod being set up, of this agent or another on the host, safe).
    The kubelet's cleanupOrphanedPodCgroups: a pod cleanup cut short (agent killed, a process
    slow to exit, a sandbox made without the agent) leaves directories that nothing else
    removes and that every walk of the hierarchy pays for. Returns the UIDs removed."""
    removed: list[str] = []
    keep = set()
    for uid in active:
        try:
            keep.add(hostpaths.pod_cgroup_name(uid))  # by name: a long UID's name is hashed
        except hostpaths.UnsafeName:
            continue
    roots = [CGROUP_FS] if unified() else [p for p in CGROUP_FS.iterdir() if p.is_dir()]
    for hierarchy in roots:
        base = hierarchy / root.strip("/")
        for parent in (base, base / "besteffort", base / "burstable"):
            try:
                candidates = [d for d in parent.iterdir() if d.name.startswith("pod") and d.is_dir()]
            except OSError:
                continue
            for d in candidates:
                uid = d.name.removeprefix("pod")
                if d.name in keep:
                    continue
                try:
                    if now - d.stat().st_mtime < min_age_seconds:
                        continue
                except OSError:
                    continue
                if _rmdir_tree(d) and uid not in removed:
                    removed.append(uid)
    return removed


__all__ = ["DEFAULT_ROOT", "apply", "cgroup_parent", "enabled", "ensure_qos_tiers", "memory_usage", "pod_values",
           "pods_root", "remove", "sandbox_resources", "size_burstable_tier", "sweep", "widest"]
