"""The eviction manager's cycle: the kubelet's ``managerImpl.synchronize``
(pkg/kubelet/eviction/eviction_manager.go), run every ``evictionMonitoringPeriod``.

1. observe every signal in the latest usage sample;
2. the thresholds met now, plus those met before that are not yet resolved by their minimum
   reclaim; when each was first met; the node conditions they stand for, each kept True until
   ``evictionPressureTransitionPeriod`` passed since it was last met;
3. only thresholds whose grace period elapsed, and whose observation is newer than the last
   cycle's, act;
4. local ephemeral storage first: a pod over an emptyDir sizeLimit, its pod-level or a
   container's ephemeral-storage limit is evicted (grace 1 s, no condition) and the cycle ends;
5. the first threshold by eviction priority (memory first): Warning EvictionThresholdMet on
   the Node, then node-level reclaim (dead containers, unused images) where the layout says it
   helps; if every threshold is resolved by it, nothing is evicted;
6. else the pods are ranked for the threshold's signal and the first one that is not critical
   is evicted: phase Failed, reason Evicted, the kubelet's message, condition DisruptionTarget;
   grace 1 s for a hard threshold, else evictionMaxPodGracePeriod capped by the pod's own.

At most one pod per cycle; the next cycle waits (up to 30 s) until its resources are released.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import structlog

from nodeagent import quantity
from nodeagent.metrics import Histogram
from nodeagent.model import Container, Pod
from nodeagent.stages import AgentHandle, Condition, PodSnapshot, ReclaimKind
from nodeagent.stats import Usage
from nodeagent.stats.collector import PodUsage
from nodeagent.status import qos_class
from plugins.eviction import ranking as R
from plugins.eviction import signals as S
from plugins.eviction.config import EvictionConfig
from plugins.eviction.events import PodEvicted

log = structlog.get_logger("nodeagent.eviction")

REASON = "Evicted"
DISRUPTION_TARGET = "DisruptionTarget"
TERMINATION_BY_KUBELET = "TerminationByKubelet"
IMMEDIATE_GRACE_SECONDS = 1
"""immediateEvictionGracePeriodSeconds: hard thresholds and local storage limits."""
POD_CLEANUP_TIMEOUT_SECONDS = 30.0
USAGE_WAIT_SECONDS = 15.0

NODE_LOW = "The node was low on resource: {}. "
THRESHOLD_MET = "Threshold quantity: {}, available: {}. "
CONTAINER_USING = "Container {} was using {}, request is {}, has larger consumption of {}. "
POD_USING = "Pod {} was using {}, request is {}, has larger consumption of {}. "
NODE_CONDITION = "The node had condition: [{}]. "
EMPTY_DIR_LIMIT = 'Usage of EmptyDir volume "{}" exceeds the limit "{}". '
POD_EPHEMERAL_LIMIT = "Pod ephemeral local storage usage exceeds the total limit of containers {}. "
CONTAINER_EPHEMERAL_LIMIT = 'Container {} exceeded its local ephemeral storage limit "{}". '

# The kubelet's node status setters: (reason, message) when False, when True.
CONDITION_TEXT: Mapping[str, tuple[tuple[str, str], tuple[str, str]]] = {
    S.MEMORY_PRESSURE: (("KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                        ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available")),
    S.DISK_PRESSURE: (("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                      ("KubeletHasDiskPressure", "kubelet has disk pressure")),
    S.PID_PRESSURE: (("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                     ("KubeletHasInsufficientPID", "kubelet has insufficient PID available")),
}

RECLAIM_ALL: tuple[ReclaimKind, ...] = ("containers", "images")


@dataclass(frozen=True)
class Evicted:
    pod: PodSnapshot
    released: anyio.Event


class EvictionManager:
    def __init__(self, config: EvictionConfig, handle: AgentHandle) -> None:
        self.config = config
        self.handle = handle
        self.thresholds = config.thresholds()
        self.node_conditions: list[str] = []
        """The pressure conditions reported now (admission reads them)."""
        self._met: list[S.Threshold] = []
        self._first_met: dict[tuple[Any, ...], float] = {}
        self._condition_seen: dict[str, float] = {}
        self._last_observations: dict[str, S.Observation] = {}
        self._dedicated: bool | None = None
        self._rank: Mapping[str, R.Rank] = {}
        self._reclaim: Mapping[str, tuple[ReclaimKind, ...]] = {}
        self.evictions: Counter[str] = Counter()
        self.history: list[tuple[str, str]] = []
        """(pod UID, signal) of every eviction, in order."""
        self.evicted_at: list[float] = []
        """When each of ``history`` happened (wall time)."""
        self.stats_age = Histogram("kubelet_eviction_stats_age_seconds",
                                   "Time between when stats are collected, and when pod is evicted based on those "
                                   "stats by eviction signal", ("eviction_signal",))
        self.cycles = 0

    # --- the loop ------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.publish_conditions()  # sufficient until a cycle says otherwise
        task_status.started()
        while True:
            evicted: list[Evicted] = []
            try:
                evicted = await self.synchronize()
            except Exception:  # one bad cycle (a stats gap, a bug) must not stop eviction
                log.exception("eviction cycle failed")
            if evicted:
                await self._wait_released(evicted)
            else:
                await self.handle.clock.sleep(self.config.eviction_monitoring_period)

    async def _wait_released(self, evicted: Sequence[Evicted]) -> None:
        """waitForPodsCleanup: the next cycle only once the evicted pods' resources are back (or
        podCleanupTimeout passed), so one eviction is not followed by another for the same
        pressure before the first one could help."""
        with anyio.move_on_after(POD_CLEANUP_TIMEOUT_SECONDS):
            for one in evicted:
                await one.released.wait()
        self.handle.request_usage()

    async def _fresh_usage(self) -> Usage | None:
        """A sample no older than a monitoring period (the kubelet asks for updated stats)."""
        usage = self.handle.usage()
        if usage is None or self.handle.clock.now() - usage.node.time > self.config.eviction_monitoring_period:
            self.handle.request_usage()
            await self.handle.usage_changed(timeout=USAGE_WAIT_SECONDS)
            usage = self.handle.usage()
        return usage

    # --- one cycle -------------------------------------------------------------------------

    async def synchronize(self) -> list[Evicted]:
        self.cycles += 1
        if not self.thresholds and not self.config.local_storage_capacity_isolation:
            return []
        usage = await self._fresh_usage()
        if usage is None:
            return []
        if self._dedicated is None:
            self._learn_layout(usage)
        active = [p for p in self.handle.pods() if p.active]
        observations = S.observe(usage)
        now = self.handle.clock.monotonic()

        thresholds = S.met(self.thresholds, observations, enforce_min_reclaim=False)
        if self._met:
            thresholds = S.merge(thresholds, S.met(self._met, observations, enforce_min_reclaim=True))
        first_met = {t.key(): self._first_met.get(t.key(), now) for t in thresholds}
        for kind in S.conditions(thresholds):
            self._condition_seen[kind] = now
        period = self.config.eviction_pressure_transition_period
        self.node_conditions = [c for c in (S.MEMORY_PRESSURE, S.DISK_PRESSURE, S.PID_PRESSURE)
                                if c in self._condition_seen and now - self._condition_seen[c] < period]
        self.publish_conditions()
        thresholds = [t for t in thresholds if now - first_met[t.key()] >= t.grace_period]
        self._first_met, self._met = first_met, thresholds
        thresholds = [t for t in thresholds if self._updated(t, observations)]
        self._last_observations = observations

        by_uid = {p.uid: p for p in usage.pods}
        stats: R.Stats = by_uid.get
        if self.config.local_storage_capacity_isolation:
            evicted = await self._local_storage_eviction(active, stats)
            if evicted:
                return evicted
        if not thresholds:
            return []
        ordered = S.by_eviction_priority(thresholds)
        target = next((t for t in ordered if t.signal in S.SIGNAL_RESOURCE), None)
        if target is None:
            return []
        resource = target.resource
        log.info("attempting to reclaim", resource=resource, signal=target.signal)
        self.handle.node_event("Warning", "EvictionThresholdMet", f"Attempting to reclaim {resource}")
        if await self._reclaim_node_level(target.signal):
            log.info("pressure reduced without evicting pods", resource=resource)
            return []
        rank = self._rank.get(target.signal)
        if rank is None or not active:
            log.warning("thresholds met but no pod to evict", signal=target.signal, active=len(active))
            return []
        ranked = rank(active, stats)
        log.info("pods ranked for eviction", signal=target.signal, pods=[str(p.ref) for p in ranked])
        for t in thresholds:
            observed = observations.get(t.signal)
            if observed is not None and observed.time is not None:
                self.stats_age.observe(max(self.handle.clock.now() - observed.time, 0.0), t.signal)
        for snapshot in ranked:
            grace = IMMEDIATE_GRACE_SECONDS
            if not target.hard:
                grace = min(self.config.eviction_max_pod_grace_period,
                            snapshot.pod.spec.termination_grace_period_seconds)
            message = self.message(resource, snapshot, stats(snapshot.ref.uid), ordered, observations)
            condition = Condition(DISRUPTION_TARGET, True, TERMINATION_BY_KUBELET, message)
            released = await self._evict(snapshot, grace, message, condition, target.signal)
            if released is not None:
                return [Evicted(snapshot, released)]
        log.warning("unable to evict any pod from the node", signal=target.signal)
        return []

    def _learn_layout(self, usage: Usage) -> None:
        """First cycle: one disk for everything, or images and writable layers on their own
        filesystem; that decides containerfs thresholds, rankings and reclaims."""
        dedicated = bool(usage.node.dedicated_image_fs)
        self._dedicated = dedicated
        self.thresholds = S.with_containerfs(self.thresholds, dedicated)
        self._rank = R.rank_functions(dedicated)
        reclaim: dict[str, tuple[ReclaimKind, ...]] = {}
        for prefix in ("nodefs", "imagefs", "containerfs"):
            helps = not (dedicated and prefix == "nodefs")  # buildSignalToNodeReclaimFuncs
            for suffix in ("available", "inodesFree"):
                reclaim[f"{prefix}.{suffix}"] = RECLAIM_ALL if helps else ()
        self._reclaim = reclaim
        log.info("eviction thresholds", dedicated_image_fs=dedicated,
                 thresholds=[f"{t.signal}<{t.value.quantity if t.value.quantity is not None else t.value.percentage}"
                             + (f" for {t.grace_period:g}s" if t.grace_period else "") for t in self.thresholds])

    def _updated(self, threshold: S.Threshold, observations: Mapping[str, S.Observation]) -> bool:
        """thresholdsUpdatedStats: act only on a signal observed anew since the last cycle."""
        observed = observations.get(threshold.signal)
        if observed is None:
            return False
        last = self._last_observations.get(threshold.signal)
        return last is None or observed.time is None or last.time is None or observed.time > last.time

    async def _reclaim_node_level(self, signal: str) -> bool:
        kinds = self._reclaim.get(signal, ())
        for kind in kinds:
            try:
                freed = await self.handle.reclaim(kind)
                log.info("node-level reclaim", kind=kind, freed_bytes=freed)
            except Exception as exc:  # noqa: BLE001 - the kubelet logs it and goes on to evict
                log.warning("node-level reclaim failed", kind=kind, error=str(exc))
        if not kinds:
            return False
        self.handle.request_usage()
        await self.handle.usage_changed(timeout=USAGE_WAIT_SECONDS)
        usage = self.handle.usage()
        if usage is None:
            return False
        return not S.met(self.thresholds, S.observe(usage), enforce_min_reclaim=True)

    # --- conditions and admission ------------------------------------------------------------

    def publish_conditions(self) -> None:
        for kind, (sufficient, insufficient) in CONDITION_TEXT.items():
            pressure = kind in self.node_conditions
            reason, message = insufficient if pressure else sufficient
            self.handle.set_node_condition(Condition(kind, pressure, reason, message))

    def admit(self, pod: Pod) -> tuple[bool, str]:
        """managerImpl.Admit: (admitted, message)."""
        conditions = list(self.node_conditions)
        if not conditions or R.is_critical(pod):
            return True, ""
        if conditions == [S.MEMORY_PRESSURE]:
            if qos_class(pod) != "BestEffort":
                return True, ""
            taint = {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}
            if any(_tolerates(t, taint) for t in pod.spec.tolerations):
                return True, ""
        return False, NODE_CONDITION.format(" ".join(conditions))

    # --- the message ---------------------------------------------------------------------------

    def message(self, resource: str, snapshot: PodSnapshot, stats: PodUsage | None,
                thresholds: Sequence[S.Threshold], observations: Mapping[str, S.Observation]) -> str:
        """evictionMessage: the resource, the threshold and what was available, and each
        container using more than it requested."""
        out = NODE_LOW.format(resource)
        for t in thresholds:
            observed = observations.get(t.signal)
            if t.resource == resource and observed is not None:
                out += THRESHOLD_MET.format(_amount(t.value.of(observed.capacity), t.value.binary),
                                            S.format_amount(resource, observed.available))
                break
        if stats is None:
            return out
        pod = snapshot.pod
        level = pod.spec.resources
        if resource == S.MEMORY and level is not None and S.MEMORY in level.requests and stats.memory is not None:
            request = str(level.requests[S.MEMORY])
            out += POD_USING.format(pod.metadata.name, _amount(R.memory_usage(stats), True),
                                    _canonical(request), resource)
        containers: dict[str, Container] = {c.name: c for c in (*pod.spec.containers, *pod.spec.init_containers)}
        for usage in stats.containers:
            container = containers.get(usage.name)
            if container is None:
                continue
            used: int | None = None
            if resource == S.EPHEMERAL_STORAGE:
                if usage.rootfs is not None and usage.rootfs.used_bytes is not None and usage.logs is not None \
                        and usage.logs.used_bytes is not None:
                    used = usage.rootfs.used_bytes + usage.logs.used_bytes
            elif resource == S.MEMORY and usage.memory is not None and usage.memory.working_set_bytes is not None:
                used = usage.memory.working_set_bytes
            raw = container.resources.requests.get(resource)
            requested = quantity.bytes_(raw) if raw is not None else 0
            if used is not None and used > requested:
                out += CONTAINER_USING.format(container.name, _amount(used, True),
                                              _canonical(str(raw)) if raw is not None else "0", resource)
        return out

    # --- evicting ------------------------------------------------------------------------------

    async def _evict(self, snapshot: PodSnapshot, grace: int, message: str, condition: Condition | None,
                     signal: str) -> anyio.Event | None:
        """evictPod: never a critical pod; the Event, then the kill through the pod's worker."""
        if R.is_critical(snapshot.pod):
            log.error("cannot evict a critical pod", pod=str(snapshot.ref))
            return None
        released = self.handle.evict(snapshot.ref.uid, reason=REASON, message=message, grace_seconds=grace,
                                     condition=condition)
        if released is None:
            return None  # finished or killed meanwhile: the next one
        log.warning("evicting pod", pod=str(snapshot.ref), uid=snapshot.ref.uid, signal=signal,
                    grace_period_seconds=grace, message=message)
        self.evictions[signal] += 1
        self.history.append((snapshot.ref.uid, signal))
        self.evicted_at.append(time.time())
        await self.handle.publish(PodEvicted(pod=snapshot.ref, source="eviction", signal=signal, message=message,
                                             grace_period_seconds=grace))
        return released

    async def _local_storage_eviction(self, pods: Sequence[PodSnapshot], stats: R.Stats) -> list[Evicted]:
        """localStorageEviction: every pod over one of its local storage limits, evicted."""
        out = []
        for snapshot in pods:
            usage = stats(snapshot.ref.uid)
            if usage is None:
                continue
            verdict = self._over_local_limit(snapshot.pod, usage)
            if verdict is None:
                continue
            signal, message = verdict
            released = await self._evict(snapshot, IMMEDIATE_GRACE_SECONDS, message, None, signal)
            if released is not None:
                out.append(Evicted(snapshot, released))
        return out

    def _over_local_limit(self, pod: Pod, usage: PodUsage) -> tuple[str, str] | None:
        """(signal, message) of the first local storage limit the pod is over."""
        used = {v.name: v.fs.used_bytes for v in usage.volumes if v.fs.used_bytes is not None}
        for volume in pod.spec.volumes:
            source = volume.empty_dir
            if source is None or source.size_limit is None:
                continue
            limit = quantity.bytes_(source.size_limit)
            if volume.name in used and limit > 0 and used[volume.name] > limit:
                return S.EMPTYDIR_FS_LIMIT, EMPTY_DIR_LIMIT.format(volume.name, _canonical(str(source.size_limit)))
        limit_total, binary = _pod_ephemeral_limit(pod)
        if limit_total is not None:
            total = usage.ephemeral_storage.used_bytes if usage.ephemeral_storage is not None else 0
            if (total or 0) > limit_total:
                return S.EPHEMERAL_POD_FS_LIMIT, POD_EPHEMERAL_LIMIT.format(_amount(limit_total, binary))
        limits: dict[str, str] = {}
        for c in pod.spec.containers:
            raw = c.resources.limits.get(S.EPHEMERAL_STORAGE)
            if raw is not None and quantity.bytes_(raw) != 0:
                limits[c.name] = str(raw)
        for c in pod.spec.init_containers:
            raw = c.resources.limits.get(S.EPHEMERAL_STORAGE)
            if c.restart_policy == "Always" and raw is not None and quantity.bytes_(raw) != 0:
                limits[c.name] = str(raw)
        for stat in usage.containers:
            if stat.name not in limits:
                continue
            used_bytes = (stat.logs.used_bytes or 0) if stat.logs is not None else 0
            if not self._dedicated:
                used_bytes += (stat.rootfs.used_bytes or 0) if stat.rootfs is not None else 0
            if quantity.bytes_(limits[stat.name]) < used_bytes:
                return S.EPHEMERAL_CONTAINER_FS_LIMIT, CONTAINER_EPHEMERAL_LIMIT.format(
                    stat.name, _canonical(limits[stat.name]))
        return None

    # --- metrics ---------------------------------------------------------------------------------

    def render_metrics(self) -> str:
        lines = ["# HELP kubelet_evictions [ALPHA] Cumulative number of pod evictions by eviction signal",
                 "# TYPE kubelet_evictions counter"]
        for signal, count in sorted(self.evictions.items()):
            lines.append(f'kubelet_evictions{{eviction_signal="{signal}"}} {count}')
        lines += self.stats_age.render()
        return "\n".join(lines) + "\n"


def _pod_ephemeral_limit(pod: Pod) -> tuple[int | None, bool]:
    """PodLimits' ephemeral-storage: the containers' limits summed, or the largest init
    container's when larger; None when no container limits it."""
    found, total, binary = False, 0, True
    for c in pod.spec.containers:
        raw = c.resources.limits.get(S.EPHEMERAL_STORAGE)
        if raw is not None:
            if not found:
                binary = quantity.is_binary(str(raw))
            found, total = True, total + quantity.bytes_(raw)
    for c in pod.spec.init_containers:
        raw = c.resources.limits.get(S.EPHEMERAL_STORAGE)
        if raw is not None:
            if not found:
                binary = quantity.is_binary(str(raw))
            found, total = True, max(total, quantity.bytes_(raw))
    return (total if found else None), binary


def _amount(value: int, binary: bool) -> str:
    return quantity.format_int(value, binary)


def _canonical(text: str) -> str:
    """A quantity from a pod spec as Go's Quantity.String() writes it back ("1024Mi" → "1Gi")."""
    try:
        return quantity.format_int(quantity.bytes_(text), quantity.is_binary(text))
    except ValueError:
        return text


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    """ToleratesTaint for a taint without a value."""
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint["effect"]:
        return False
    if key and key != taint["key"]:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return bool(key) and not (toleration.get("value") or "")


__all__ = ["CONDITION_TEXT", "REASON", "EvictionManager"]
