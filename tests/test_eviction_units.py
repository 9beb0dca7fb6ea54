"""The eviction stage's decisions without a runtime: thresholds as the kubelet parses them,
observations, ranking, the kubelet's messages, admission under pressure, and the manager's cycle
(grace periods, the pressure transition period, node-level reclaim before any eviction) against
a fake handle and fixed usage samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import pytest

from nodeagent.clock import ManualClock
from nodeagent.events import Event, PodRef
from nodeagent.lifecycle import PodState
from nodeagent.model import Pod
from nodeagent.stages import Condition, PodSnapshot
from nodeagent.stats.collector import (
    ContainerUsage,
    Fs,
    Memory,
    NodeUsage,
    PodUsage,
    Usage,
    VolumeUsage,
)
from plugins.eviction import signals as S
from plugins.eviction.config import EvictionConfig
from plugins.eviction.manager import EvictionManager
from plugins.eviction.ranking import is_critical, rank_disk, rank_memory, request

pytestmark = pytest.mark.anyio
MI = 2**20


def pod(name: str, *, memory_request: str | None = None, priority: int | None = None, volumes: Any = None,
        containers: Any = None, annotations: dict[str, str] | None = None, **spec: Any) -> Pod:
    resources = {"requests": {"memory": memory_request}} if memory_request else {}
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "annotations": {"kubernetes.io/config.source": "api", **(annotations or {})}},
        "spec": {"containers": containers or [{"name": "c", "image": "busybox", "resources": resources}],
                 "volumes": volumes or [], **spec},
    }
    if priority is not None:
        body["spec"]["priority"] = priority
    return Pod.model_validate(body)


def snap(p: Pod, state: PodState = PodState.RUNNING) -> PodSnapshot:
    return PodSnapshot(PodRef(uid=p.uid, name=p.metadata.name, namespace="default"), p, {}, state)


def stats(p: Pod, *, memory: int = 0, rootfs: int = 0, logs: int = 0, volumes: dict[str, int] | None = None,
          at: float = 1000.0) -> PodUsage:
    container = ContainerUsage(name=p.spec.containers[0].name, start_time=1.0, cpu=None,
                               memory=Memory(at, memory), rootfs=Fs(at, rootfs), logs=Fs(at, logs))
    vols = tuple(VolumeUsage(name, Fs(at, used)) for name, used in (volumes or {}).items())
    ephemeral = Fs(at, rootfs + logs + sum((volumes or {}).values()))
    return PodUsage(uid=p.uid, name=p.metadata.name, namespace="default", start_time=1.0, containers=(container,),
                    cpu=None, memory=Memory(at, memory), volumes=vols, ephemeral_storage=ephemeral)


def node(*, available_memory: int = 8 * 2**30, working_set: int = 2**30, fs_available: int = 50 * 2**30,
         fs_capacity: int = 100 * 2**30, at: float = 1000.0) -> NodeUsage:
    fs = Fs(at, fs_capacity - fs_available, capacity_bytes=fs_capacity, available_bytes=fs_available,
            inodes=10**6, inodes_free=9 * 10**5)
    return NodeUsage(time=at, start_time=None, cpu=None, memory=Memory(at, working_set, available_bytes=available_memory),
                     network=None, fs=fs, image_fs=fs, container_fs=fs, max_pid=4_000_000, processes=300,
                     dedicated_image_fs=False)


# --- thresholds ----------------------------------------------------------------------------


def test_thresholds_parse_as_the_kubelet_parses_them() -> None:
    thresholds = EvictionConfig().thresholds()
    assert {t.signal for t in thresholds} == set(S.DEFAULT_EVICTION_HARD)
    memory = next(t for t in thresholds if t.signal == S.MEMORY_AVAILABLE)
    assert memory.value.quantity == 100 * MI and memory.hard
    nodefs = next(t for t in thresholds if t.signal == S.NODEFS_AVAILABLE)
    assert nodefs.value.of(1000) == 100  # 10%, float32 like the kubelet's
    # Set: only these ("0%" switches one off), unless merged with the defaults.
    only = EvictionConfig(evictionHard={"memory.available": "1Gi", "nodefs.available": "0%"}).thresholds()
    assert [t.signal for t in only] == ["memory.available"]
    merged = EvictionConfig(evictionHard={"memory.available": "1Gi"}, mergeDefaultEvictionSettings=True).thresholds()
    assert len(merged) == 5 and next(t for t in merged if t.signal == S.MEMORY_AVAILABLE).value.quantity == 2**30
    soft = EvictionConfig(evictionSoft={"memory.available": "500Mi"}, evictionSoftGracePeriod={"memory.available": "1m30s"},
                          evictionMinimumReclaim={"memory.available": "0.5Gi"}).thresholds()
    found = next(t for t in soft if t.grace_period)
    assert found.grace_period == 90 and found.min_reclaim is not None and found.min_reclaim.quantity == 512 * MI


@pytest.mark.parametrize(("settings", "message"), [
    ({"evictionHard": {"memory.free": "1Gi"}}, "unsupported eviction signal memory.free"),
    ({"evictionSoft": {"memory.available": "1Gi"}},
     "grace period must be specified for the soft eviction threshold memory.available"),
    ({"evictionHard": {"memory.available": "0"}}, "eviction threshold memory.available must be positive"),
    ({"evictionHard": {"nodefs.available": "101%"}}, "must be <= 100%"),
    ({"evictionMinimumReclaim": {"nodefs.available": "0%"}}, "minimum reclaim nodefs.available must be positive"),
])
def test_thresholds_the_kubelet_refuses(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EvictionConfig.model_validate(settings)


def test_containerfs_thresholds_follow_nodefs_on_one_disk_and_imagefs_on_two() -> None:
    thresholds = EvictionConfig(evictionHard={"nodefs.available": "10%", "imagefs.available": "20%",
                                              "containerfs.available": "50%"}).thresholds()
    single = {t.signal: t.value.percentage for t in S.with_containerfs(thresholds, dedicated_image_fs=False)}
    assert single[S.CONTAINERFS_AVAILABLE] == pytest.approx(0.10)  # the user's 50% is ignored
    split = {t.signal: t.value.percentage for t in S.with_containerfs(thresholds, dedicated_image_fs=True)}
    assert split[S.CONTAINERFS_AVAILABLE] == pytest.approx(0.20)


def test_minimum_reclaim_keeps_a_met_threshold_until_it_is_cleared_by_that_much() -> None:
    [threshold] = EvictionConfig(evictionHard={"memory.available": "1Gi"},
                                 evictionMinimumReclaim={"memory.available": "500Mi"}).thresholds()
    observed = S.observe(Usage(node(available_memory=2**30 + 100 * MI), ()))
    assert S.met([threshold], observed, enforce_min_reclaim=False) == []
    assert S.met([threshold], observed, enforce_min_reclaim=True) == [threshold]


# --- ranking and messages -----------------------------------------------------------------------


def test_memory_ranking_puts_pods_over_their_request_first_then_priority_then_usage() -> None:
    best_effort = pod("besteffort")
    within = pod("within", memory_request="500Mi")
    big_low = pod("big", priority=-10)
    usage = {p.uid: stats(p, memory=m) for p, m in ((best_effort, 50 * MI), (within, 100 * MI), (big_low, 10 * MI))}
    ranked = rank_memory([snap(within), snap(best_effort), snap(big_low)], usage.get)
    assert [s.pod.metadata.name for s in ranked] == ["big", "besteffort", "within"]
    no_stats = pod("nostats")
    assert rank_memory([snap(within), snap(no_stats)], usage.get)[0].pod.metadata.name == "nostats"


def test_disk_ranking_counts_rootfs_logs_and_local_volumes() -> None:
    writer = pod("writer", volumes=[{"name": "scratch", "emptyDir": {}}])
    quiet = pod("quiet", volumes=[{"name": "mem", "emptyDir": {"medium": "Memory"}}],
                containers=[{"name": "c", "image": "busybox", "resources": {"requests": {"ephemeral-storage": "1Gi"}}}])
    usage = {writer.uid: stats(writer, volumes={"scratch": 300 * MI}),
             quiet.uid: stats(quiet, rootfs=20 * MI, volumes={"mem": 900 * MI})}
    rank = rank_disk(frozenset({"root", "logs", "localVolumeSource"}), S.EPHEMERAL_STORAGE)
    assert [s.pod.metadata.name for s in rank([snap(quiet), snap(writer)], usage.get)] == ["writer", "quiet"]
    assert request(quiet, "ephemeral-storage") == 2**30


def test_critical_pods() -> None:
    assert is_critical(pod("static", annotations={"kubernetes.io/config.source": "file"}))
    assert is_critical(pod("mirror", annotations={"kubernetes.io/config.mirror": "abc"}))
    assert is_critical(pod("system", priority=2_000_001_000))
    assert not is_critical(pod("normal", priority=1000))


@dataclass
class FakeHandle:
    clock: ManualClock = field(default_factory=lambda: ManualClock(start=1000.0))
    sample: Usage | None = None
    snapshots: list[PodSnapshot] = field(default_factory=list)
    evicted: list[tuple[str, str, str, int, Condition | None]] = field(default_factory=list)
    conditions: dict[str, Condition] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    published: list[Event] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    after_reclaim: Usage | None = None

    def usage(self) -> Usage | None:
        return self.sample

    async def usage_changed(self, timeout: float | None = None) -> None:
        await anyio.lowlevel.checkpoint()

    def request_usage(self) -> None:
        pass

    def pods(self) -> Sequence[PodSnapshot]:
        return self.snapshots

    def evict(self, uid: str, *, reason: str, message: str, grace_seconds: int,
              condition: Condition | None = None) -> anyio.Event | None:
        self.evicted.append((uid, reason, message, grace_seconds, condition))
        return anyio.Event()

    def set_node_condition(self, condition: Condition) -> None:
        self.conditions[condition.type] = condition

    def node_event(self, type: str, reason: str, message: str) -> None:
        self.events.append((type, reason, message))

    async def reclaim(self, kind: str) -> int | None:
        self.reclaimed.append(kind)
        if self.after_reclaim is not None:
            self.sample = self.after_reclaim
        return 0

    async def publish(self, event: Event) -> None:
        self.published.append(event)


def manager(handle: FakeHandle, **config: Any) -> EvictionManager:
    return EvictionManager(EvictionConfig.model_validate(config), handle)  # type: ignore[arg-type]


async def test_a_memory_eviction_with_the_kubelet_message_condition_and_grace() -> None:
    handle = FakeHandle()
    hog, kept = pod("hog"), pod("kept", memory_request="1Gi")
    handle.snapshots = [snap(kept), snap(hog)]
    handle.sample = Usage(node(available_memory=81420 * 1024),
                          (stats(hog, memory=600 * MI), stats(kept, memory=10 * MI)))
    m = manager(handle, evictionHard={"memory.available": "100Mi"})
    evicted = await m.synchronize()
    assert [e.pod.pod.metadata.name for e in evicted] == ["hog"]
    uid, reason, message, grace, condition = handle.evicted[0]
    assert (uid, reason, grace) == ("uid-hog", "Evicted", 1)
    assert message == ("The node was low on resource: memory. Threshold quantity: 100Mi, available: 81420Ki. "
                       "Container c was using 600Mi, request is 0, has larger consumption of memory. ")
    assert condition == Condition("DisruptionTarget", True, "TerminationByKubelet", message)
    assert handle.conditions["MemoryPressure"].status and handle.conditions["MemoryPressure"].reason == \
        "KubeletHasInsufficientMemory"
    assert not handle.conditions["DiskPressure"].status
    assert ("Warning", "EvictionThresholdMet", "Attempting to reclaim memory") in handle.events
    assert m.evictions == {"memory.available": 1}
    assert 'kubelet_evictions{eviction_signal="memory.available"} 1' in m.render_metrics()
    # Admission under MemoryPressure alone: BestEffort refused unless it tolerates the taint.
    assert m.admit(pod("new")) == (False, "The node had condition: [MemoryPressure]. ")
    assert m.admit(pod("burstable", memory_request="10Mi")) == (True, "")
    tolerant = pod("tolerant", tolerations=[{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists",
                                              "effect": "NoSchedule"}])
    assert m.admit(tolerant) == (True, "")
    assert m.admit(pod("static", annotations={"kubernetes.io/config.source": "file"})) == (True, "")


async def test_soft_thresholds_wait_their_grace_and_conditions_their_transition_period() -> None:
    handle = FakeHandle()
    hog = pod("hog", terminationGracePeriodSeconds=30)
    handle.snapshots = [snap(hog)]
    low = Usage(node(available_memory=50 * MI), (stats(hog, memory=600 * MI),))
    handle.sample = low
    m = manager(handle, evictionHard={"memory.available": "0%"}, evictionSoft={"memory.available": "100Mi"},
                evictionSoftGracePeriod={"memory.available": "30s"}, evictionMaxPodGracePeriod=20,
                evictionPressureTransitionPeriod="1m")
    assert await m.synchronize() == [] and handle.conditions["MemoryPressure"].status  # met, grace not over
    handle.clock.advance(31)
    handle.sample = replace(low, node=node(available_memory=50 * MI, at=1031.0))  # a newer observation
    await m.synchronize()
    assert handle.evicted[0][3] == 20  # soft: evictionMaxPodGracePeriod, under the pod's 30 s
    # Pressure gone: the condition stays until the transition period passed since last seen.
    handle.sample = Usage(node(available_memory=4 * 2**30, at=1100.0), ())
    handle.clock.advance(30)
    await m.synchronize()
    assert handle.conditions["MemoryPressure"].status
    handle.clock.advance(31)
    await m.synchronize()
    assert not handle.conditions["MemoryPressure"].status


async def test_disk_pressure_reclaims_at_node_level_before_evicting() -> None:
    handle = FakeHandle()
    writer = pod("writer", volumes=[{"name": "scratch", "emptyDir": {}}])
    handle.snapshots = [snap(writer)]
    handle.sample = Usage(node(fs_available=5 * 2**30), (stats(writer, volumes={"scratch": 2**30}),))
    handle.after_reclaim = Usage(node(fs_available=30 * 2**30, at=1001.0), handle.sample.pods)
    m = manager(handle, evictionHard={"nodefs.available": "10%"})
    assert await m.synchronize() == []
    assert handle.reclaimed == ["containers", "images"] and handle.evicted == []
    assert handle.conditions["DiskPressure"].status  # seen this cycle; stays for the transition period
    # Reclaim that does not help: the pod goes.
    handle.after_reclaim = None
    handle.sample = Usage(node(fs_available=5 * 2**30, at=1010.0), handle.sample.pods)
    evicted = await m.synchronize()
    assert [e.pod.pod.metadata.name for e in evicted] == ["writer"]
    # 10% in float32, as the kubelet computes it: a few bytes over 10Gi, so no binary suffix.
    assert handle.evicted[0][2].startswith("The node was low on resource: ephemeral-storage. Threshold quantity: "
                                           "10737418400, available: 5Gi. ")
    assert m.admit(pod("any", memory_request="1Mi"))[0] is False  # DiskPressure refuses every pod


async def test_local_storage_limits_evict_without_a_condition() -> None:
    handle = FakeHandle()
    over_dir = pod("overdir", volumes=[{"name": "cache", "emptyDir": {"sizeLimit": "10Mi"}}])
    over_container = pod("overcontainer", containers=[
        {"name": "c", "image": "busybox", "resources": {"limits": {"ephemeral-storage": "1Mi"}}}])
    within = pod("within", volumes=[{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}])
    handle.snapshots = [snap(over_dir), snap(over_container), snap(within)]
    handle.sample = Usage(node(), (stats(over_dir, volumes={"cache": 11 * MI}), stats(over_container, logs=2 * MI),
                                   stats(within, volumes={"cache": 11 * MI})))
    m = manager(handle)
    evicted = await m.synchronize()
    assert sorted(e.pod.pod.metadata.name for e in evicted) == ["overcontainer", "overdir"]
    messages = {uid: (message, grace, condition) for uid, _r, message, grace, condition in handle.evicted}
    assert messages["uid-overdir"] == ('Usage of EmptyDir volume "cache" exceeds the limit "10Mi". ', 1, None)
    assert messages["uid-overcontainer"][0] == (
        "Pod ephemeral local storage usage exceeds the total limit of containers 1Mi. ")
    assert not handle.conditions["DiskPressure"].status
    assert m.evictions == {"emptydirfs.limit": 1, "ephemeralpodfs.limit": 1}


async def test_critical_and_finished_pods_are_never_evicted() -> None:
    handle = FakeHandle()
    static = pod("static", annotations={"kubernetes.io/config.source": "file"})
    done = pod("done")
    handle.snapshots = [snap(static), snap(done, PodState.COMPLETED)]
    handle.sample = Usage(node(available_memory=10 * MI), (stats(static, memory=500 * MI),))
    assert await manager(handle).synchronize() == [] and handle.evicted == []


def test_pid_pressure_ranks_by_priority_then_processes() -> None:
    from plugins.eviction.ranking import rank_pids

    many, few, important = pod("many"), pod("few"), pod("important", priority=100)
    usage = {many.uid: replace(stats(many), process_count=50), few.uid: replace(stats(few), process_count=2),
             important.uid: replace(stats(important), process_count=500)}
    ranked = rank_pids([snap(important), snap(few), snap(many)], usage.get)
    assert [s.pod.metadata.name for s in ranked] == ["many", "few", "important"]
    observed = S.observe(Usage(replace(node(), max_pid=1000, processes=990), ()))
    [threshold] = EvictionConfig(evictionHard={"pid.available": "5%"}).thresholds()
    assert S.met([threshold], observed, enforce_min_reclaim=False) == [threshold]
    assert S.conditions([threshold]) == ["PIDPressure"]
