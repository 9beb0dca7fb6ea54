"""Container garbage collection, as the kubelet's containerGC (pkg/kubelet/kuberuntime/
kuberuntime_gc.go) plus its housekeeping of orphaned pod directories (kubelet_volumes.go).

Only this node's runtime objects (label ``nodeagent.io/node``) are touched; a pod counts as

* *gone* when the agent no longer tracks it (deleted, and its worker forgotten): everything of
  it goes — dead containers, inactive sandboxes, its log directory, its pod directory;
* *finished* when it is Completed, Rejected or Terminated: its dead containers stay (status,
  logs) unless eviction asks for everything (``evict_finished``, the kubelet's
  DeleteAllUnusedContainers);
* else alive: its dead containers beyond ``maximumDeadContainersPerContainer`` per container
  go, oldest first, then the node-wide ``maximumDeadContainers``; of its sandboxes the newest
  stays, older inactive ones (not ready, no container) go.

Dead means not running and created more than ``minimumContainerTTLDuration`` ago; a container
in an unknown state is stopped before it is removed. Dangling ``/var/log/containers`` links of
exited or gone containers are removed. A pod directory is only removed when nothing is mounted
in it (a hostPath bind there would take the host's files with it).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import structlog

from cri import CriError, NotFound, RuntimeClient
from cri import types as t
from nodeagent import labels as L
from nodeagent.lifecycle import PodState
from nodeagent.mounttable import mounts_under
from nodeagent.stages import PodSnapshot
from plugins.gc.config import GcConfig

log = structlog.get_logger("nodeagent.gc")

FINISHED = frozenset({PodState.COMPLETED, PodState.REJECTED, PodState.TERMINATED})
TERMINATING = frozenset({PodState.TERMINATING})
ORPHAN_MIN_AGE_SECONDS = 60.0
"""A pod directory or log directory of a pod the agent does not know is left alone this long
(a pod being set up in another agent sharing the directory, a restart's replay)."""


@dataclass
class _Dead:
    id: str
    uid: str
    name: str
    created_at: int
    state: t.ContainerState


@dataclass
class ContainerGCResult:
    containers: int = 0
    sandboxes: int = 0
    log_dirs: int = 0
    pod_dirs: int = 0
    errors: list[str] = field(default_factory=list)


class ContainerGC:
    def __init__(self, config: GcConfig, runtime: RuntimeClient, node_name: str,
                 pods: Callable[[], Sequence[PodSnapshot]], root_dir: Path, pod_logs_dir: Path,
                 symlink_dir: Path | None, now: Callable[[], float] = time.time) -> None:
        self.config = config
        self.runtime = runtime
        self.node = node_name
        self.pods = pods
        self.root_dir = root_dir
        self.pod_logs_dir = pod_logs_dir
        self.symlink_dir = symlink_dir
        self.now = now
        self.cleaned_pod_dirs = 0
        self.pod_dir_errors = 0

    async def garbage_collect(self, evict_finished: bool = False) -> ContainerGCResult:
        result = ContainerGCResult()
        states = {p.ref.uid: p.state for p in self.pods()}
        containers = [c for c in await self.runtime.list_containers() if c.labels.get(L.MANAGED_BY) == self.node]

        def removable(uid: str) -> bool:
            state = states.get(uid)
            return state is None or (evict_finished and state in FINISHED)

        await self._containers(containers, states, removable, result)
        await self._sandboxes(states, removable, result)
        # Pods the runtime still has (any agent's: a log directory may be shared) keep their directories.
        in_runtime = {c.labels.get(L.POD_UID, "") for c in await self.runtime.list_containers()}
        in_runtime |= {s.labels.get(L.POD_UID, "") for s in await self.runtime.list_pod_sandbox()}
        await anyio.to_thread.run_sync(self._log_dirs, states, in_runtime, result)
        await self._symlinks(result)
        await anyio.to_thread.run_sync(self._pod_dirs, states, in_runtime, result)
        if result.containers or result.sandboxes or result.log_dirs or result.pod_dirs:
            log.info("container garbage collected", containers=result.containers, sandboxes=result.sandboxes,
                     log_dirs=result.log_dirs, pod_dirs=result.pod_dirs)
        return result

    # --- containers --------------------------------------------------------------------------

    async def _containers(self, containers: Sequence[t.Container], states: dict[str, PodState],
                          removable: Callable[[str], bool], result: ContainerGCResult) -> None:
        min_created = (self.now() - self.config.minimum_container_ttl_duration) * 1e9
        units: dict[tuple[str, str], list[_Dead]] = {}
        for c in containers:
            if c.state == t.ContainerState.CONTAINER_RUNNING or c.created_at > min_created:
                continue
            uid = c.labels.get(L.POD_UID, "")
            if states.get(uid) in TERMINATING:
                continue  # its worker is removing it right now
            dead = _Dead(c.id, uid, c.labels.get(L.CONTAINER_NAME, c.metadata.name), c.created_at, c.state)
            units.setdefault((uid, dead.name), []).append(dead)
        for key in list(units):
            if removable(key[0]):
                unit = units.pop(key)
                await self._remove_oldest(unit, len(unit), result)
        per_unit = self.config.maximum_dead_containers_per_container
        if per_unit >= 0:
            for unit in units.values():
                await self._keep_newest(unit, per_unit, result)
        most = self.config.maximum_dead_containers
        total = sum(len(u) for u in units.values())
        if most >= 0 and units and total > most:
            each = max(most // len(units), 1)
            for unit in units.values():
                await self._keep_newest(unit, each, result)
            flat = sorted((d for u in units.values() for d in u), key=lambda d: d.created_at)
            if len(flat) > most:
                await self._remove_oldest(flat, len(flat) - most, result)

    async def _keep_newest(self, unit: list[_Dead], keep: int, result: ContainerGCResult) -> None:
        unit.sort(key=lambda d: d.created_at, reverse=True)
        if len(unit) > keep:
            doomed = unit[keep:]
            del unit[keep:]
            await self._remove_oldest(doomed, len(doomed), result)

    async def _remove_oldest(self, dead: list[_Dead], count: int, result: ContainerGCResult) -> None:
        for one in sorted(dead, key=lambda d: d.created_at)[:count]:
            try:
                if one.state == t.ContainerState.CONTAINER_UNKNOWN:
                    log.info("container is in unknown state, try killing it before removal", container_id=one.id)
                    await self.runtime.stop_container(one.id, 0)
                await self.runtime.remove_container(one.id)
                result.containers += 1
            except NotFound:
                continue
            except CriError as exc:
                result.errors.append(f"failed to remove container {one.id}: {exc}")

    # --- sandboxes ---------------------------------------------------------------------------

    async def _sandboxes(self, states: dict[str, PodState], removable: Callable[[str], bool],
                         result: ContainerGCResult) -> None:
        sandboxes = [s for s in await self.runtime.list_pod_sandbox() if s.labels.get(L.MANAGED_BY) == self.node]
        holding = {c.pod_sandbox_id for c in await self.runtime.list_containers()}
        by_pod: dict[str, list[t.PodSandbox]] = {}
        for sandbox in sandboxes:
            by_pod.setdefault(sandbox.labels.get(L.POD_UID, sandbox.metadata.uid), []).append(sandbox)
        for uid, found in by_pod.items():
            if states.get(uid) in TERMINATING:
                continue
            found.sort(key=lambda s: s.created_at, reverse=True)
            doomed = found if removable(uid) else found[1:]
            for sandbox in doomed:
                if sandbox.state == t.PodSandboxState.SANDBOX_READY or sandbox.id in holding:
                    continue  # active: still ready, or still holds containers
                try:
                    await self.runtime.stop_pod_sandbox(sandbox.id)
                    await self.runtime.remove_pod_sandbox(sandbox.id)
                    result.sandboxes += 1
                except NotFound:
                    continue
                except CriError as exc:
                    result.errors.append(f"failed to remove sandbox {sandbox.id}: {exc}")

    # --- directories (in a thread) --------------------------------------------------------------

    def _old_enough(self, path: Path) -> bool:
        try:
            return self.now() - path.stat().st_mtime >= ORPHAN_MIN_AGE_SECONDS
        except OSError:
            return False

    def _log_dirs(self, states: dict[str, PodState], in_runtime: set[str], result: ContainerGCResult) -> None:
        """evictPodLogsDirectories: ``<ns>_<name>_<uid>`` of pods gone from the agent and the runtime."""
        try:
            entries = list(os.scandir(self.pod_logs_dir))
        except OSError:
            return
        for entry in entries:
            uid = entry.name.rsplit("_", 1)[-1]
            if not entry.is_dir(follow_symlinks=False) or uid in states or uid in in_runtime:
                continue
            if not self._old_enough(Path(entry.path)):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            result.log_dirs += 1

    async def _symlinks(self, result: ContainerGCResult) -> None:
        """Dangling /var/log/containers/*.log links whose container exited or is gone."""
        if self.symlink_dir is None:
            return
        try:
            links = [p for p in self.symlink_dir.glob("*.log") if p.is_symlink() and not p.exists()]
        except OSError:
            return
        for link in links:
            container_id = link.name[:-len(".log")].rsplit("-", 1)[-1]
            try:
                status = await self.runtime.container_status(container_id)
                if status is not None and status.state != t.ContainerState.CONTAINER_EXITED:
                    continue  # still running: its log may come back (rotation)
            except NotFound:
                pass
            except CriError:
                continue
            try:
                link.unlink()
            except OSError as exc:
                result.errors.append(f"failed to remove container log dead symlink {link}: {exc}")

    def _pod_dirs(self, states: dict[str, PodState], in_runtime: set[str], result: ContainerGCResult) -> None:
        """cleanupOrphanedPodDirs: pod directories of pods the agent does not know, unless
        something is still mounted in them."""
        base = self.root_dir / "pods"
        try:
            entries = [Path(e.path) for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        cleaned = errors = 0
        for pod_dir in entries:
            if pod_dir.name in states or pod_dir.name in in_runtime or not self._old_enough(pod_dir):
                continue
            mounted = mounts_under(pod_dir)
            if mounted:
                errors += 1
                log.warning("orphaned pod directory kept: still mounted in it", pod_dir=str(pod_dir),
                            mounts=[str(m) for m in mounted[:5]])
                continue
            shutil.rmtree(pod_dir, ignore_errors=True)
            cleaned += 1
            result.pod_dirs += 1
        self.cleaned_pod_dirs, self.pod_dir_errors = cleaned, errors


__all__ = ["ContainerGC", "ContainerGCResult"]
