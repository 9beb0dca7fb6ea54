"""nodeagent against the upstream kubelet, from the same rounds of benchmarks.pod_start: the
per-round ratios, issue 19's goals, and the Markdown tables.

A ratio is nodeagent / kubelet measured in one round (the two ran minutes apart on the same
containerd, under the same background load); the tables show the median over the rounds of
those ratios, which drifting load on a shared machine moves less than a ratio of medians.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.stats import pct

MiB = 2**20


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def net_ms_per_pod(cpu: float, idle_cores: float | None, seconds: float | None, n: int) -> float | None:
    """CPU ms per pod of a phase, less the idle rate over the phase's wall time (not below 0)."""
    if idle_cores is None or seconds is None:
        return None
    return max(cpu - idle_cores * seconds, 0.0) * 1000 / n


def figures(rec: dict[str, Any], n: int) -> dict[str, float | None]:
    """One system's figures of one round (or of the merged rounds), in the units shown."""
    per_pod = rec["per_pod_seen"]
    steady = rec.get("steady") or {}
    idle = rec.get("cores_idle")
    return {
        "start": rec["start_seconds"],
        "per_pod_p50": pct(per_pod, 50),
        "per_pod_p95": pct(per_pod, 95),
        "per_pod_p99": pct(per_pod, 99),
        "stopped": rec["stopped_seconds"],
        "empty": rec["teardown_seconds"],
        "cpu_ms_per_start": 1000 * rec["cpu_start"] / n,
        "cpu_ms_per_stop": 1000 * rec["cpu_stop"] / n,
        # The same, less what the process burns idle over as long (its background work):
        # at N=1 that is most of the gross figure.
        "net_cpu_ms_per_start": net_ms_per_pod(rec["cpu_start"], idle, rec["start_seconds"], n),
        "net_cpu_ms_per_stop": net_ms_per_pod(rec["cpu_stop"], idle, rec["stopped_seconds"], n),
        "rss_idle": rec["rss_idle"] / MiB,
        "rss_at_n": rec["rss_running"] / MiB,
        "rss_peak": rec["hwm"] / MiB,
        "cores_idle": idle,
        "cores_at_n": steady["cpu"] / steady["seconds"] if steady.get("seconds") else None,
    }


def peer_ratios(agent: dict[str, Any], kubelet: dict[str, Any], n: int) -> dict[str, float | None]:
    """nodeagent / kubelet for every figure of one round."""
    a, k = figures(agent, n), figures(kubelet, n)
    return {key: ratio(a[key], k[key]) for key in a}


@dataclass(frozen=True)
class Goal:
    """One of issue 19's goals: the ratio ``metric`` at each of ``sizes`` is at most ``limit``."""

    text: str
    metric: str
    sizes: tuple[int, ...]
    limit: float


GOALS = (
    Goal("start p99 ≤ kubelet's, at 30 and 110 pods", "per_pod_p99", (30, 110), 1.0),
    Goal("RSS ≤ 1.0× the kubelet's at 110 pods", "rss_at_n", (110,), 1.0),
    Goal("CPU per pod start ≤ 1.0× the kubelet's", "cpu_ms_per_start", (1, 30, 110), 1.0),
    Goal("teardown (removed → nothing runs) ≤ 1.1× the kubelet's", "stopped", (1, 30, 110), 1.1),
)


def goal_verdicts(results: Sequence[dict[str, Any]]) -> list[tuple[Goal, list[tuple[int, float | None]], bool | None]]:
    """Per goal: (size, median ratio) for the sizes measured, and whether every one is within the
    limit (None: none of its sizes was measured)."""
    by_n = {r["n"]: r for r in results if "vs_kubelet" in r}
    out = []
    for goal in GOALS:
        values = [(n, by_n[n]["vs_kubelet"].get(goal.metric)) for n in goal.sizes if n in by_n]
        known = [v for _, v in values if v is not None]
        met = None if not known else all(v <= goal.limit for v in known)
        out.append((goal, values, met))
    return out


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(results: Sequence[dict[str, Any]]) -> list[str]:
    """The side-by-side tables (Markdown lines); [] when no result has the kubelet."""
    rows = [r for r in results if "kubelet" in r and "vs_kubelet" in r]
    if not rows:
        return []
    lines = [
        "",
        ("**Side by side with the upstream kubelet** (v1.37.2, standalone, static pods, on the same containerd; "
         "one system at a time, the runtime emptied in between; order alternated between rounds). "
         "k = kubelet, na = nodeagent; figures are medians over the rounds (per-pod percentiles pooled), "
         "ratios are the median of each round's nodeagent / kubelet."),
        "",
        ("| N | start s: k / na | ratio | per-pod p50 s: k / na | per-pod p95 s: k / na | per-pod p99 s: k / na "
         "| p99 ratio | removed → stopped s: k / na | ratio | removed → empty s: k / na | ratio |"),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n = r["n"]
        k, a, q = figures(r["kubelet"], n), figures(r["agent"], n), r["vs_kubelet"]
        lines.append(
            f"| {n} | {_f(k['start'])} / {_f(a['start'])} | {_f(q['start'])} | "
            f"{_f(k['per_pod_p50'])} / {_f(a['per_pod_p50'])} | {_f(k['per_pod_p95'])} / {_f(a['per_pod_p95'])} | "
            f"{_f(k['per_pod_p99'])} / {_f(a['per_pod_p99'])} | {_f(q['per_pod_p99'])} | "
            f"{_f(k['stopped'])} / {_f(a['stopped'])} | {_f(q['stopped'])} | "
            f"{_f(k['empty'])} / {_f(a['empty'])} | {_f(q['empty'])} |"
        )
    lines += [
        "",
        ("**Cost, kubelet vs nodeagent** (each process's own /proc/PID/stat utime + stime, with waited-for children, "
         "and /proc/PID/status VmRSS / VmHWM). CPU per start = written → all running, per stop = removed → "
         "stopped, divided by N; net = less the process's idle rate (cores idle, sampled over 3 s before the "
         "manifests) over the phase's wall time; cores at N = CPU while holding the N running pods, after a 5 s "
         "settle."),
        "",
        ("| N | CPU ms/pod start: k / na | ratio | net: k / na | ratio | CPU ms/pod stop: k / na | ratio "
         "| net: k / na | ratio | RSS idle MiB: k / na | RSS at N MiB: k / na | ratio | RSS peak MiB: k / na "
         "| ratio | cores idle: k / na | cores at N: k / na |"),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n = r["n"]
        k, a, q = figures(r["kubelet"], n), figures(r["agent"], n), r["vs_kubelet"]
        lines.append(
            f"| {n} | {_f(k['cpu_ms_per_start'], 1)} / {_f(a['cpu_ms_per_start'], 1)} | {_f(q['cpu_ms_per_start'])} | "
            f"{_f(k['net_cpu_ms_per_start'], 1)} / {_f(a['net_cpu_ms_per_start'], 1)} | "
            f"{_f(q['net_cpu_ms_per_start'])} | "
            f"{_f(k['cpu_ms_per_stop'], 1)} / {_f(a['cpu_ms_per_stop'], 1)} | {_f(q['cpu_ms_per_stop'])} | "
            f"{_f(k['net_cpu_ms_per_stop'], 1)} / {_f(a['net_cpu_ms_per_stop'], 1)} | "
            f"{_f(q['net_cpu_ms_per_stop'])} | "
            f"{_f(k['rss_idle'], 1)} / {_f(a['rss_idle'], 1)} | "
            f"{_f(k['rss_at_n'], 1)} / {_f(a['rss_at_n'], 1)} | {_f(q['rss_at_n'])} | "
            f"{_f(k['rss_peak'], 1)} / {_f(a['rss_peak'], 1)} | {_f(q['rss_peak'])} | "
            f"{_f(k['cores_idle'], 3)} / {_f(a['cores_idle'], 3)} | "
            f"{_f(k['cores_at_n'], 3)} / {_f(a['cores_at_n'], 3)} |"
        )
    lines += ["", "**Issue 19's goals** (median per-round ratio nodeagent / kubelet).", "",
              "| goal | ratio by N | met |", "|---|---|---|"]
    for goal, values, met in goal_verdicts(rows):
        shown = ", ".join(f"{n}: {_f(v)}" for n, v in values) or "not measured"
        lines.append(f"| {goal.text} | {shown} | {'-' if met is None else ('yes' if met else 'no')} |")
    return lines
