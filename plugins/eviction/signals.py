"""Eviction signals, thresholds and observations: the kubelet's pkg/kubelet/eviction/api and the
threshold half of its helpers.go.

A threshold says "evict when ``<signal>`` is below ``<value>``" (the only operator is
LessThan), the value a quantity or a percentage of the signal's capacity; a soft threshold has a
grace period the signal must stay below it for, a hard one none. ``minimumReclaim`` raises a
threshold once it was met, until the node is that far above it again (hysteresis).

Observations are built from a usage sample (nodeagent.stats) as the kubelet builds them from
its Summary: memory.available is the node's available memory (capacity = available + working
set), nodefs the filesystem of rootDir, imagefs / containerfs the runtime's image filesystem,
pid.available the process limit less the running tasks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from nodeagent import duration, quantity
from nodeagent.stats import Usage

MEMORY_AVAILABLE = "memory.available"
ALLOCATABLE_MEMORY_AVAILABLE = "allocatableMemory.available"
NODEFS_AVAILABLE = "nodefs.available"
NODEFS_INODES_FREE = "nodefs.inodesFree"
IMAGEFS_AVAILABLE = "imagefs.available"
IMAGEFS_INODES_FREE = "imagefs.inodesFree"
CONTAINERFS_AVAILABLE = "containerfs.available"
CONTAINERFS_INODES_FREE = "containerfs.inodesFree"
PID_AVAILABLE = "pid.available"

# The metric labels of the local-storage limit evictions (kubelet_evictions{eviction_signal}).
EMPTYDIR_FS_LIMIT = "emptydirfs.limit"
EPHEMERAL_POD_FS_LIMIT = "ephemeralpodfs.limit"
EPHEMERAL_CONTAINER_FS_LIMIT = "ephemeralcontainerfs.limit"

MEMORY, EPHEMERAL_STORAGE, INODES, PIDS = "memory", "ephemeral-storage", "inodes", "pids"

SIGNAL_RESOURCE: Mapping[str, str] = {
    MEMORY_AVAILABLE: MEMORY,
    ALLOCATABLE_MEMORY_AVAILABLE: MEMORY,
    IMAGEFS_AVAILABLE: EPHEMERAL_STORAGE,
    IMAGEFS_INODES_FREE: INODES,
    CONTAINERFS_AVAILABLE: EPHEMERAL_STORAGE,
    CONTAINERFS_INODES_FREE: INODES,
    NODEFS_AVAILABLE: EPHEMERAL_STORAGE,
    NODEFS_INODES_FREE: INODES,
    PID_AVAILABLE: PIDS,
}
"""Every signal the kubelet knows, and the resource a pod is ranked and named by for it."""

MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE = "MemoryPressure", "DiskPressure", "PIDPressure"
SIGNAL_CONDITION: Mapping[str, str] = {
    MEMORY_AVAILABLE: MEMORY_PRESSURE,
    ALLOCATABLE_MEMORY_AVAILABLE: MEMORY_PRESSURE,
    IMAGEFS_AVAILABLE: DISK_PRESSURE,
    CONTAINERFS_AVAILABLE: DISK_PRESSURE,
    NODEFS_AVAILABLE: DISK_PRESSURE,
    IMAGEFS_INODES_FREE: DISK_PRESSURE,
    NODEFS_INODES_FREE: DISK_PRESSURE,
    CONTAINERFS_INODES_FREE: DISK_PRESSURE,
    PID_AVAILABLE: PID_PRESSURE,
}

DEFAULT_EVICTION_HARD: Mapping[str, str] = {
    MEMORY_AVAILABLE: "100Mi",
    NODEFS_AVAILABLE: "10%",
    NODEFS_INODES_FREE: "5%",
    IMAGEFS_AVAILABLE: "15%",
    IMAGEFS_INODES_FREE: "5%",
}
"""The kubelet's Linux defaults (pkg/kubelet/eviction/defaults_linux.go)."""

_BINARY_SIGNALS = {MEMORY, EPHEMERAL_STORAGE}


@dataclass(frozen=True)
class Value:
    """A threshold value: a quantity in base units (bytes, inodes, processes) or a fraction of
    capacity. ``binary`` keeps how a quantity was written, for the kubelet's message."""

    quantity: int | None = None
    percentage: float = 0.0
    binary: bool = True

    def of(self, capacity: int) -> int:
        """GetThresholdQuantity: the quantity, or the fraction of ``capacity``."""
        if self.quantity is not None:
            return self.quantity
        return int(capacity * self.percentage)


@dataclass(frozen=True)
class Threshold:
    signal: str
    value: Value
    grace_period: float = 0.0
    """Seconds the signal must stay met before it evicts; 0: a hard threshold."""
    min_reclaim: Value | None = None

    @property
    def hard(self) -> bool:
        return self.grace_period == 0

    @property
    def resource(self) -> str:
        return SIGNAL_RESOURCE[self.signal]

    def key(self) -> tuple[str, float, Value]:
        """What makes two thresholds the same (hasThreshold: signal, grace, value)."""
        return (self.signal, self.grace_period, self.value)


@dataclass(frozen=True)
class Observation:
    available: int
    capacity: int
    time: float | None


class ThresholdError(ValueError):
    """A threshold configuration the kubelet refuses (its messages)."""


def _signal(signal: str) -> str:
    if signal not in SIGNAL_RESOURCE:
        raise ThresholdError(f"unsupported eviction signal {signal}")
    return signal


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _percentage(text: str) -> float:
    """parsePercentage: float32 arithmetic, as the kubelet's (so that "10%" of a capacity is
    the kubelet's number of bytes, to the byte)."""
    try:
        return _float32(_float32(float(text.rstrip("%"))) / 100)
    except ValueError:
        raise ThresholdError(f'strconv.ParseFloat: parsing "{text.rstrip("%")}": invalid syntax') from None


def parse_statement(signal: str, text: str) -> Threshold | None:
    """One ``signal: value`` of evictionHard / evictionSoft; None for "0%" and "100%" (no
    threshold, the kubelet's way to switch a default off)."""
    _signal(signal)
    text = str(text).strip()
    if text.endswith("%"):
        if text in ("0%", "100%"):
            return None
        fraction = _percentage(text)
        if fraction < 0:
            raise ThresholdError(f"eviction percentage threshold {signal} must be >= 0%: {text}")
        if fraction > 1:
            raise ThresholdError(f"eviction percentage threshold {signal} must be <= 100%: {text}")
        return Threshold(signal, Value(percentage=fraction))
    try:
        amount = quantity.bytes_(text)
    except ValueError:
        raise ThresholdError(f"quantities must match the regular expression for {signal}: {text!r}") from None
    if amount <= 0:
        raise ThresholdError(f"eviction threshold {signal} must be positive: {text}")
    return Threshold(signal, Value(quantity=amount, binary=quantity.is_binary(text)))


def parse_min_reclaim(signal: str, text: str) -> Value:
    _signal(signal)
    text = str(text).strip()
    if text.endswith("%"):
        fraction = _percentage(text)
        if fraction <= 0:
            raise ThresholdError(f"eviction percentage minimum reclaim {signal} must be positive: {text}")
        return Value(percentage=fraction)
    try:
        amount = quantity.bytes_(text)
    except ValueError:
        raise ThresholdError(f"quantities must match the regular expression for {signal}: {text!r}") from None
    if amount < 0:
        raise ThresholdError(f"negative eviction minimum reclaim specified for {signal}")
    return Value(quantity=amount, binary=quantity.is_binary(text))


def parse_thresholds(hard: Mapping[str, str], soft: Mapping[str, str], soft_grace: Mapping[str, str],
                     min_reclaim: Mapping[str, str]) -> list[Threshold]:
    """ParseThresholdConfig: hard, then soft thresholds (each with its grace period), each with
    its minimum reclaim."""
    graces: dict[str, float] = {}
    for signal, text in soft_grace.items():
        _signal(signal)
        seconds = duration.parse(str(text))
        if seconds < 0:
            raise ThresholdError(f"invalid eviction grace period specified: {text}, must be a positive value")
        graces[signal] = seconds
    reclaims = {signal: parse_min_reclaim(signal, text) for signal, text in min_reclaim.items()}
    out: list[Threshold] = []
    for signal, text in hard.items():
        parsed = parse_statement(signal, text)
        if parsed is not None:
            out.append(parsed)
    for signal, text in soft.items():
        parsed = parse_statement(signal, text)
        if parsed is None:
            continue
        if signal not in graces:
            raise ThresholdError(f"grace period must be specified for the soft eviction threshold {signal}")
        out.append(replace(parsed, grace_period=graces[signal]))
    return [replace(t, min_reclaim=reclaims.get(t.signal)) for t in out]


def with_containerfs(thresholds: Sequence[Threshold], dedicated_image_fs: bool) -> list[Threshold]:
    """UpdateContainerFsThresholds (no split container filesystem): containerfs.* thresholds
    a user set are replaced, and missing ones added, from nodefs.* on a single disk and from
    imagefs.* when images and writable layers have a filesystem of their own."""
    source_fs = "imagefs" if dedicated_image_fs else "nodefs"
    kept = [t for t in thresholds if not t.signal.startswith("containerfs.")]
    derived = []
    for suffix in ("available", "inodesFree"):
        for hard in (True, False):
            found = next((t for t in thresholds if t.signal == f"{source_fs}.{suffix}" and t.hard == hard), None)
            if found is not None:
                derived.append(replace(found, signal=f"containerfs.{suffix}"))
    return kept + derived


def observe(usage: Usage) -> dict[str, Observation]:
    """makeSignalObservations: what each signal shows in ``usage``."""
    node = usage.node
    out: dict[str, Observation] = {}
    memory = node.memory
    if memory is not None and memory.available_bytes is not None and memory.working_set_bytes is not None:
        out[MEMORY_AVAILABLE] = Observation(memory.available_bytes, memory.available_bytes + memory.working_set_bytes,
                                            memory.time)
    for prefix, fs in (("nodefs", node.fs), ("imagefs", node.image_fs), ("containerfs", node.container_fs)):
        if fs is None:
            continue
        if fs.available_bytes is not None and fs.capacity_bytes is not None:
            out[f"{prefix}.available"] = Observation(fs.available_bytes, fs.capacity_bytes, fs.time)
        if fs.inodes_free is not None and fs.inodes is not None:
            out[f"{prefix}.inodesFree"] = Observation(fs.inodes_free, fs.inodes, fs.time)
    if node.max_pid is not None:
        out[PID_AVAILABLE] = Observation(node.max_pid - node.processes, node.max_pid, node.time)
    return out


def met(thresholds: Iterable[Threshold], observations: Mapping[str, Observation], *,
        enforce_min_reclaim: bool) -> list[Threshold]:
    """thresholdsMet: those whose signal shows less available than the threshold (raised by
    its minimum reclaim when asked); a signal without an observation meets nothing."""
    out = []
    for threshold in thresholds:
        observed = observations.get(threshold.signal)
        if observed is None:
            continue
        needed = threshold.value.of(observed.capacity)
        if enforce_min_reclaim and threshold.min_reclaim is not None:
            needed += threshold.min_reclaim.of(observed.capacity)
        if needed > observed.available:
            out.append(threshold)
    return out


def merge(a: Sequence[Threshold], b: Iterable[Threshold]) -> list[Threshold]:
    out = list(a)
    keys = {t.key() for t in out}
    for threshold in b:
        if threshold.key() not in keys:
            out.append(threshold)
            keys.add(threshold.key())
    return out


def by_eviction_priority(thresholds: Iterable[Threshold]) -> list[Threshold]:
    """Memory signals first, signals without a reclaimable resource last (byEvictionPriority;
    a stable order otherwise)."""
    def rank(t: Threshold) -> int:
        if t.signal in (MEMORY_AVAILABLE, ALLOCATABLE_MEMORY_AVAILABLE):
            return 0
        return 1 if t.signal in SIGNAL_RESOURCE else 2
    return sorted(thresholds, key=rank)


def conditions(thresholds: Iterable[Threshold]) -> list[str]:
    """The node conditions the thresholds stand for, each once, in order."""
    out: list[str] = []
    for threshold in thresholds:
        condition = SIGNAL_CONDITION.get(threshold.signal)
        if condition is not None and condition not in out:
            out.append(condition)
    return out


def format_amount(resource: str, value: int, binary: bool | None = None) -> str:
    """A quantity as the kubelet's messages show it (bytes in binary units, counts decimal)."""
    return quantity.format_int(value, resource in _BINARY_SIGNALS if binary is None else binary)


__all__ = [
    "DEFAULT_EVICTION_HARD",
    "SIGNAL_CONDITION",
    "SIGNAL_RESOURCE",
    "Observation",
    "Threshold",
    "ThresholdError",
    "Value",
    "by_eviction_priority",
    "conditions",
    "format_amount",
    "merge",
    "met",
    "observe",
    "parse_thresholds",
    "with_containerfs",
]
