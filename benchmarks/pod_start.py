"""Pod start latency and throughput: nodeagent against a raw-CRI baseline and the upstream kubelet,
same run, same containerd.

    python -m benchmarks.pod_start                 # sizes 1, 30, 110 (+ the kubelet if it is built)
    python -m benchmarks.pod_start --peer none     # without the kubelet (about 2-4 minutes)
    python -m benchmarks.pod_start --peer kubelet  # build the kubelet if needed; 3 rounds (10-40 min)
    python -m benchmarks.pod_start --quick         # sizes 1, 10
    python -m benchmarks.pod_start --sizes 5,50 --append benchmarks/RESULTS.md

What happens, for each size N (one busybox container per pod, ``sleep 3600``):

1. **Baseline**: N pods started with exactly the calls nodeagent's runtime stage makes to start a
   pod (RunPodSandbox, CreateContainer, StartContainer), with the configs nodeagent would send
   (manifests parsed by ``nodeagent.sources.static.parse_manifest``, configs built by
   ``plugins.runtime.sandbox.sandbox_config`` and ``plugins.runtime.container.container_config``),
   at most ``--baseline-concurrency`` pods (default 16) in flight; nodeagent itself has no limit
   (one worker per pod, all at once), so a second baseline with all N pods in flight runs too.
   Teardown mirrors the agent's calls: StopContainer with the pod's grace period (issued for every
   pod at once, as the agent's workers do: waiting out a grace period is not runtime work; when
   ``sleep`` runs as its PID namespace's init it ignores SIGTERM and the grace is waited out), then
   StopPodSandbox, RemoveContainer, RemovePodSandbox under the in-flight limit. The configs are
   built with the same arguments the runtime stage passes today; if it starts passing more
   (settings, additions), pass them here too, or the two stop doing the same work.
2. **nodeagent**: a fresh ``python -m nodeagent run`` subprocess (its own node name, root and log
   dirs, a static pod dir, its local endpoint on a free loopback port); N manifests are written
   into the static pod dir, then removed.

3. **kubelet** (``--peer``; by default whenever ``python -m controlplane build kubelet`` has put it
   in the cache): the upstream kubelet, standalone with a static pod dir (benchmarks/kubelet_peer.py
   says how it is configured and kept from the shared host), the same N manifests; its teardown
   is polled to *stopped* and, separately, to *empty* (its container GC removes sandboxes once a
   minute), then whatever is left is removed through CRI. benchmarks/sidebyside.py computes the
   per-round nodeagent / kubelet ratios and issue 19's goals.

All are timed the same way: from the start (first manifest written / first call issued) until
every pod's containers are RUNNING as seen by a CRI ListContainers poll every 50 ms; teardown until
nothing runs (no running container, no ready sandbox: *stopped*) and until ListPodSandbox and
ListContainers are both empty. Per-pod latency is the poll time at which that
pod was first seen running, counted from the start (like density_test.go's create → Running).
nodeagent's own view comes from its trace (``/trace/UID``: PodStarted.seconds_since_observed and
the events before it) and its ``/metrics`` (relist and stage histograms). Memory and CPU are read
from ``/proc/PID/status`` (VmRSS, VmHWM) and ``/proc/PID/stat`` (utime + stime) of the agent
process; containerd's CPU from its own ``/proc/PID/stat``.

A private containerd (devenv) is started in a temp dir under /tmp and stopped at the end.
Percentiles use density_test.go's method (sorted list, element ceil(n*p/100) - 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/pod_start.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

import devenv
from benchmarks import kubelet_peer, sidebyside
from benchmarks.stats import merge, pct
from cri import RuntimeClient
from cri import types as t
from nodeagent import labels as L
from nodeagent.model import Pod
from nodeagent.sources.static import parse_manifest
from plugins.runtime import podcgroup
from plugins.runtime.container import container_config
from plugins.runtime.sandbox import log_directory, sandbox_config

REPO = Path(__file__).resolve().parent.parent
POLL_SECONDS = 0.05
DEFAULT_SIZES = (1, 30, 110)
QUICK_SIZES = (1, 10)
BASELINE_CONCURRENCY = 16
GRACE_SECONDS = 2  # the kubelet's (and nodeagent's) minimum; sleep as PID 1 waits it out
SETTLE_SECONDS = 5.0
"""Idle time after the agent (or the kubelet) is healthy, before the manifests: both do start-up
work for a few seconds after their health endpoint answers (the kubelet's first housekeeping and
cAdvisor's first stats, the agent's first relists), which the idle RSS should not catch."""
CLK_TCK = os.sysconf("SC_CLK_TCK")
MiB = 2**20


# --------------------------------------------------------------------------- small helpers


def proc_cpu(pid: int, tid: int | None = None, children: bool = False) -> float:
    """utime + stime of a whole process (all threads), or of one of its threads, in seconds;
    with ``children``, plus cutime + cstime (the children it has waited for: a mount, a helper)."""
    with open(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat") as f:
        return stat_cpu_ticks(f.read(), children) / CLK_TCK


def stat_cpu_ticks(text: str, children: bool = False) -> int:
    """utime + stime (+ cutime + cstime) in clock ticks from a /proc/PID/stat line (fields 14-17;
    the command name in parentheses may hold spaces and parentheses, so split after the last)."""
    fields = text[text.rfind(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks + (int(fields[13]) + int(fields[14]) if children else 0)


def proc_mem(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # without guest time, which is already in user
    return total - idle, total


def busy_cores(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Average cores busy on the whole machine between two machine_cpu() readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * (os.cpu_count() or 1) if total else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def manifest(index: int, grace: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"bench-{index:03d}", "labels": {"app": "pod-start-bench"}},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "main", "image": devenv.BUSYBOX_IMAGE, "command": ["sleep", "3600"]}],
        },
    }


def git_description() -> str:
    def run(*args: str) -> str:
        done = subprocess.run(["git", *args], check=False, cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = run("rev-parse", "--short", "HEAD") or "unknown"
    dirty = [line for line in run("status", "--porcelain").splitlines() if line.strip()]
    return f"{commit} + uncommitted changes ({len(dirty)} paths)" if dirty else commit


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# --------------------------------------------------------------------------- watching the runtime


async def poll_running(client: RuntimeClient, selector: dict[str, str], expected: dict[str, int], t0: float,
                       timeout: float) -> dict[str, float]:
    """Seconds after t0 at which each pod (by pod name label) first had all its containers
    RUNNING, polling ListContainers every POLL_SECONDS. ``selector`` narrows the listing to one
    system's containers ({} for the kubelet, whose containers carry no label of ours: the
    runtime holds one system's pods at a time)."""
    seen: dict[str, float] = {}
    tick = time.monotonic()
    flt = t.ContainerFilter(state=t.ContainerState.CONTAINER_RUNNING, label_selector=selector)
    while True:
        containers = await client.list_containers(flt)
        now = time.monotonic() - t0
        running: dict[str, int] = {}
        for c in containers:
            name = c.labels.get(L.POD_NAME, "")
            running[name] = running.get(name, 0) + 1
        for name, want in expected.items():
            if name not in seen and running.get(name, 0) >= want:
                seen[name] = now
        if len(seen) == len(expected):
            return seen
        if now > timeout:
            missing = sorted(set(expected) - set(seen))
            raise TimeoutError(f"{len(missing)} of {len(expected)} pods not running after {timeout:.0f}s "
                               f"(e.g. {missing[:3]})")
        tick += POLL_SECONDS
        await anyio.sleep(max(tick - time.monotonic(), 0))


@dataclass
class Teardown:
    """When a teardown reached its two ends, in seconds after its start: *stopped* (no running
    container, no ready sandbox: nothing of the pods runs) and *empty* (nothing left in the
    runtime). The kubelet stops a deleted pod at once but removes its sandbox only in its
    container GC, once a minute (kubelet.go ContainerGCPeriod); nodeagent removes it itself."""

    stopped: float
    empty: float | None  # None: not empty within the empty timeout (allowed for the kubelet)


async def poll_teardown(client: RuntimeClient, t0: float, timeout: float, *, empty_timeout: float | None = None,
                        at_stopped: Callable[[], None] | None = None) -> Teardown:
    """Poll until stopped and then empty (see Teardown). ``timeout`` bounds the stopped end and,
    without ``empty_timeout``, the empty end too (both raise); past ``empty_timeout`` the empty end
    is None instead. ``at_stopped`` runs at the poll that first sees the pods stopped (to read
    the process's CPU there)."""
    tick = time.monotonic()
    stopped: float | None = None
    while True:
        sandboxes = await client.list_pod_sandbox()
        containers = await client.list_containers()
        now = time.monotonic() - t0
        if stopped is None and is_stopped(sandboxes, containers):
            stopped = now
            if at_stopped is not None:
                at_stopped()
        if not sandboxes and not containers:
            assert stopped is not None
            return Teardown(stopped, now)
        if stopped is None and now > timeout:
            raise TimeoutError(f"pods not stopped after {timeout:.0f}s: {len(sandboxes)} sandboxes, "
                               f"{len(containers)} containers")
        if stopped is not None and now > (empty_timeout or timeout):
            if empty_timeout is None:
                raise TimeoutError(f"runtime not empty after {timeout:.0f}s: {len(sandboxes)} sandboxes, "
                                   f"{len(containers)} containers")
            return Teardown(stopped, None)
        tick += POLL_SECONDS
        await anyio.sleep(max(tick - time.monotonic(), 0))


def is_stopped(sandboxes: Sequence[t.PodSandbox], containers: Sequence[t.Container]) -> bool:
    """No container running and no sandbox ready (what is left may still be removed later)."""
    return (all(c.state != t.ContainerState.CONTAINER_RUNNING for c in containers)
            and all(s.state != t.PodSandboxState.SANDBOX_READY for s in sandboxes))


async def empty_runtime(client: RuntimeClient) -> int:
    """Stop and remove whatever is left in the runtime, through CRI (removing behind CRI's back
    leaves stale entries in containerd 1.6); returns how many sandboxes and containers there were.
    Run between systems: the next one would otherwise kill them as orphans, on its own time."""
    sandboxes = await client.list_pod_sandbox()
    containers = await client.list_containers()
    for c in containers:
        if c.state == t.ContainerState.CONTAINER_RUNNING:
            await client.stop_container(c.id, 0)
        await client.remove_container(c.id)
    for sb in sandboxes:
        await client.stop_pod_sandbox(sb.id)
        await client.remove_pod_sandbox(sb.id)
    if await client.list_pod_sandbox() or await client.list_containers():
        raise RuntimeError("the runtime is not empty after removing everything through CRI")
    return len(sandboxes) + len(containers)


def start_timeout(n: int) -> float:
    return 60.0 + 2.0 * n


# --------------------------------------------------------------------------- the raw-CRI baseline


@dataclass
class BaselinePod:
    pod: Pod
    sandbox_id: str = ""
    container_ids: list[str] = field(default_factory=list)
    began: float = 0.0  # seconds after t0 the pod's first call went out (after queueing)
    ended: float = 0.0  # seconds after t0 its last StartContainer returned


class Baseline:
    """The CRI calls nodeagent's runtime stage makes for a pod, and nothing else."""

    def __init__(self, client: RuntimeClient, node: str, logs_dir: Path, image_ref: str,
                 concurrency: int, grace: int, cdi_devices: Sequence[str] = ()) -> None:
        self.client = client
        self.node = node
        self.logs_dir = logs_dir
        self.image_ref = image_ref
        self.concurrency = concurrency
        self.grace = grace
        self.cdi_devices = list(cdi_devices)
        """Fully qualified CDI device names every container gets (as DRA's claims give them)."""

    def pods(self, n: int) -> list[BaselinePod]:
        out = []
        for i in range(n):
            text = json.dumps(manifest(i, self.grace))
            for doc in parse_manifest(Path(f"/baseline/bench-{i:03d}.json"), text, self.node, time.time()):
                out.append(BaselinePod(Pod.model_validate(doc)))
        return out

    async def start(self, pods: Sequence[BaselinePod], t0: float) -> None:
        limit = anyio.Semaphore(self.concurrency)

        async def one(p: BaselinePod) -> None:
            async with limit:
                p.began = time.monotonic() - t0
                await self.create(p, start=True)
                p.ended = time.monotonic() - t0

        async with anyio.create_task_group() as tg:
            for p in pods:
                tg.start_soon(one, p)

    async def create(self, p: BaselinePod, *, start: bool) -> None:
        """The pod's sandbox and containers, each started as it is created when ``start``
        (the agent's order), else left CREATED for :meth:`start_created`."""
        sandbox = sandbox_config(p.pod, 0, self.logs_dir, self.node)
        log_directory(self.logs_dir, p.pod).mkdir(parents=True, exist_ok=True, mode=0o755)
        p.sandbox_id = await self.client.run_pod_sandbox(sandbox)
        for container in p.pod.spec.containers:
            config = container_config(p.pod, container, 0, self.image_ref, self.node)
            if self.cdi_devices:
                config = dataclasses.replace(config, cdi_devices=[t.CDIDevice(name=n) for n in self.cdi_devices])
            cid = await self.client.create_container(p.sandbox_id, config, sandbox)
            if start:
                await self.client.start_container(cid)
            p.container_ids.append(cid)

    async def start_created(self, p: BaselinePod) -> None:
        for cid in p.container_ids:
            await self.client.start_container(cid)

    async def teardown(self, pods: Sequence[BaselinePod]) -> None:
        limit = anyio.Semaphore(self.concurrency)

        async def one(p: BaselinePod) -> None:
            # Waiting out the grace period is not runtime work: like the agent's workers, every
            # pod waits at once; the runtime work below is under the in-flight limit.
            for cid in p.container_ids:
                await self.client.stop_container(cid, self.grace)
            async with limit:
                await self.client.stop_pod_sandbox(p.sandbox_id)
                for cid in p.container_ids:
                    await self.client.remove_container(cid)
                await self.client.remove_pod_sandbox(p.sandbox_id)
                # The pod cgroup runc made under the sandbox's cgroup_parent, as the kubelet's
                # pod cleanup (and the agent's) removes it: left, every benchmark run leaked N.
                await podcgroup.remove(p.pod, None)  # the default root, as sandbox_config

        async with anyio.create_task_group() as tg:
            for p in pods:
                tg.start_soon(one, p)
        shutil.rmtree(self.logs_dir, ignore_errors=True)


@dataclass(frozen=True)
class Runtime:
    """The run's private containerd, as the rounds need it."""

    client: RuntimeClient
    endpoint: str
    pid: int  # containerd's, for its CPU time
    image_ref: str  # the busybox image's id, as the agent's image step resolves it


async def run_baseline(rt: Runtime, workdir: Path, n: int, concurrency: int, grace: int) -> dict[str, Any]:
    client = rt.client
    node = f"base{uuid.uuid4().hex[:6]}"
    baseline = Baseline(client, node, workdir / f"baseline-logs-{n}", rt.image_ref, concurrency, grace)
    pods = baseline.pods(n)
    expected = {p.pod.metadata.name: len(p.pod.spec.containers) for p in pods}
    cd_pid = rt.pid
    cd0, m0 = proc_cpu(cd_pid), machine_cpu()
    t0 = time.monotonic()
    seen: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(baseline.start, pods, t0)
        seen = await poll_running(client, {L.MANAGED_BY: node}, expected, t0, start_timeout(n))
    all_calls_done = max(p.ended for p in pods)
    cd1, m1 = proc_cpu(cd_pid), machine_cpu()
    t1 = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(baseline.teardown, pods)
        ends = await poll_teardown(client, t1, start_timeout(n))
    cd2 = proc_cpu(cd_pid)
    return {
        "node": node,
        "start_seconds": max(seen.values()),
        "calls_done_seconds": all_calls_done,
        "per_pod_seen": list(seen.values()),
        "per_pod_exact": [p.ended for p in pods],
        "per_pod_own": [p.ended - p.began for p in pods],
        "teardown_seconds": ends.empty,
        "stopped_seconds": ends.stopped,
        "containerd_cpu_start": cd1 - cd0,
        "containerd_cpu_teardown": cd2 - cd1,
        "machine_busy_start": busy_cores(m0, m1),
    }


# --------------------------------------------------------------------------- static pod dirs


def write_manifests(directory: Path, node: str, n: int, grace: int) -> dict[str, float]:
    """Write N manifests (each atomically: the kubelet and nodeagent both skip dot files);
    returns static pod name (``<name>-<node>``, as both name them) -> wall time written."""
    written = {}
    for i in range(n):
        name = f"bench-{i:03d}.json"
        tmp = directory / f".{name}.tmp"
        tmp.write_text(json.dumps(manifest(i, grace)))
        tmp.rename(directory / name)
        written[f"bench-{i:03d}-{node}"] = time.time()
    return written


def remove_manifests(directory: Path) -> None:
    for path in directory.iterdir():
        path.unlink()


# --------------------------------------------------------------------------- nodeagent


class AgentProcess:
    """``python -m nodeagent run`` in its own process, with its own dirs under workdir."""

    def __init__(self, workdir: Path, endpoint: str, max_pods: int, profile: Path | None = None) -> None:
        self.node = f"bench{uuid.uuid4().hex[:6]}"
        self.dir = workdir / self.node
        self.manifests = self.dir / "manifests"
        self.manifests.mkdir(parents=True)
        self.port = free_port()
        self.log_path = self.dir / "agent.log"
        # With a profile, the agent runs under cProfile (stopped with SIGINT, it writes the file).
        python = [sys.executable, "-m", "cProfile", "-o", str(profile)] if profile else [sys.executable]
        self.argv = [
            *python, "-m", "nodeagent", "run",
            "--static-pod-path", str(self.manifests),
            "--container-runtime-endpoint", endpoint,
            "--node-name", self.node,
            "--root-dir", str(self.dir / "root"),
            "--pod-logs-dir", str(self.dir / "logs"),
            "--healthz-port", str(self.port),
            "--max-pods", str(max_pods),
            "--log-format", "json",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=REPO, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nodeagent exited with {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_tail())
            try:
                status, _ = http_get(self.url + "/healthz", timeout=1.0)
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"nodeagent not healthy after {timeout:.0f}s; log {self.log_path}:\n" + self.log_tail())

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # KeyboardInterrupt: a clean exit
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def write_manifests(self, n: int, grace: int) -> dict[str, float]:
        return write_manifests(self.manifests, self.node, n, grace)

    def remove_manifests(self) -> None:
        remove_manifests(self.manifests)

    def get_json(self, path: str) -> Any:
        status, body = http_get(self.url + path)
        return json.loads(body) if status == 200 else None

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")[1].decode()


_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$')


def parse_metrics(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[(m["name"], m["labels"] or "")] = float(m["value"])
    return out


def cri_calls(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> dict[str, int]:
    """CRI calls made between two scrapes, by operation (kubelet_runtime_operations_total)."""
    name = "kubelet_runtime_operations_total"
    calls = {lbl.split('"')[1]: int(v - before.get((metric, lbl), 0.0))
             for (metric, lbl), v in after.items() if metric == name and lbl.startswith('operation_type="')}
    return {op: n for op, n in sorted(calls.items(), key=lambda kv: -kv[1]) if n}


def histogram(samples: dict[tuple[str, str], float], name: str, labels: str = "") -> dict[str, Any]:
    """A histogram's count, sum and cumulative buckets (upper bound -> count)."""
    sep = "," if labels else ""
    buckets = {
        float(lbl.rsplit('le="', 1)[1].rstrip('"')): v
        for (metric, lbl), v in samples.items()
        if metric == f"{name}_bucket" and lbl.startswith(labels + sep + 'le="') and "+Inf" not in lbl
    }
    return {"count": samples.get((f"{name}_count", labels), 0.0), "sum": samples.get((f"{name}_sum", labels), 0.0),
            "buckets": buckets}


def hist_summary(after: dict[str, Any], before: dict[str, Any] | None = None) -> dict[str, Any]:
    """count, sum, mean, and the upper bounds of the buckets holding p99 and the max, of what was
    observed between ``before`` and ``after``."""
    zero: dict[str, Any] = {"count": 0.0, "sum": 0.0, "buckets": {}}
    before = before or zero
    count = int(after["count"] - before["count"])
    total = after["sum"] - before["sum"]
    buckets = sorted((le, v - before["buckets"].get(le, 0.0)) for le, v in after["buckets"].items())
    p99 = next((le for le, v in buckets if count and v >= 0.99 * count), None)
    top = next((le for le, v in buckets if count and v >= count), None)
    return {"count": count, "sum": total, "mean": total / count if count else None, "p99_le": p99, "max_le": top}


def breakdown(traces: dict[str, list[dict[str, Any]]], written: dict[str, float], t0_wall: float,
              seen: dict[str, float], removed_wall: float) -> dict[str, list[float]]:
    """Per-pod intervals from the agent's trace, in seconds."""
    parts: dict[str, list[float]] = {}

    def add(key: str, value: float | None) -> None:
        if value is not None:
            parts.setdefault(key, []).append(value)

    for name, chain in traces.items():
        first: dict[str, dict[str, Any]] = {}
        stages: dict[str, float] = {}
        for e in chain:
            first.setdefault(e["kind"], e)
            if e["kind"] == "StageCompleted":
                stages[e["phase"]] = stages.get(e["phase"], 0.0) + e["duration_seconds"]

        def at(kind: str, first: dict[str, dict[str, Any]] = first) -> float | None:
            return first[kind]["at"] if kind in first else None

        observed, admitted, started = at("PodSpecObserved"), at("PodAdmitted"), at("PodStarted")
        if observed is not None and name in written:
            add("manifest→observed", observed - written[name])
        if observed is not None and admitted is not None:
            add("observed→admitted", admitted - observed)
        add("prepare stage", stages.get("prepare"))
        add("start stage", stages.get("start"))
        if "PodStarted" in first:
            add("observed→PodStarted", first["PodStarted"]["seconds_since_observed"])
        if started is not None and at("ContainerStarted") is not None:
            add("PodStarted→PLEG saw it", at("ContainerStarted") - started)  # type: ignore[operator]
        if started is not None and name in seen:
            add("PodStarted→poll saw it", t0_wall + seen[name] - started)
        deletion = at("PodDeletionRequested")
        if deletion is not None:
            add("removed→deletion seen", deletion - removed_wall)
        if at("PodTerminating") is not None and at("PodTerminated") is not None:
            add("terminating→terminated", at("PodTerminated") - at("PodTerminating"))  # type: ignore[operator]
        add("stop stage", stages.get("stop"))
        add("unprepare stage", stages.get("unprepare"))
        add("cleanup stage", stages.get("cleanup"))
    return parts


STEADY_SECONDS = 0.0
PEER_STEADY_SECONDS = 10.0  # --steady's default when the kubelet runs side by side
"""--steady: how long to hold the N running pods, measuring the agent's CPU and RSS meanwhile
(what stats collection, eviction and GC cost in steady state); 0: not measured."""


IDLE_SAMPLE_SECONDS = 3.0


async def settle(pid: int) -> float:
    """Wait SETTLE_SECONDS after the process is healthy; returns its cores busy over the last
    IDLE_SAMPLE_SECONDS of that wait (its own background work with no pod: housekeeping, relists)."""
    await anyio.sleep(SETTLE_SECONDS - IDLE_SAMPLE_SECONDS)
    c0 = proc_cpu(pid, children=True)
    await anyio.sleep(IDLE_SAMPLE_SECONDS)
    return (proc_cpu(pid, children=True) - c0) / IDLE_SAMPLE_SECONDS


async def hold_steady(pid: int, cd_pid: int) -> dict[str, float]:
    """With STEADY_SECONDS: let the last pods' start settle, then hold the N running pods that
    long, reading the process's (agent's or kubelet's) CPU and RSS and containerd's CPU."""
    if STEADY_SECONDS <= 0:
        return {}
    await anyio.sleep(5.0)  # the last pods' start settles
    c0, d0 = proc_cpu(pid, children=True), proc_cpu(cd_pid)
    await anyio.sleep(STEADY_SECONDS)
    return {"seconds": STEADY_SECONDS, "cpu": proc_cpu(pid, children=True) - c0,
            "containerd_cpu": proc_cpu(cd_pid) - d0, "rss": proc_mem(pid)["VmRSS"]}


async def run_agent(rt: Runtime, workdir: Path, n: int, grace: int, profile: Path | None = None) -> dict[str, Any]:
    client = rt.client
    agent = AgentProcess(workdir, rt.endpoint, max_pods=max(110, n), profile=profile)
    try:
        await anyio.to_thread.run_sync(agent.start)
        pid, cd_pid = agent.pid, rt.pid
        cores_idle = await settle(pid)
        mem_idle = proc_mem(pid)
        before = parse_metrics(agent.metrics())
        cpu0, cd0, m0 = proc_cpu(pid, children=True), proc_cpu(cd_pid), machine_cpu()
        loop0 = proc_cpu(pid, pid)  # the main thread runs the event loop
        expected = {f"bench-{i:03d}-{agent.node}": 1 for i in range(n)}

        t0_wall, t0 = time.time(), time.monotonic()
        written = agent.write_manifests(n, grace)
        seen = await poll_running(client, {L.MANAGED_BY: agent.node}, expected, t0, start_timeout(n))
        cpu1, cd1, m1 = proc_cpu(pid, children=True), proc_cpu(cd_pid), machine_cpu()
        loop1 = proc_cpu(pid, pid)
        mem_running = proc_mem(pid)
        steady = await hold_steady(pid, cd_pid)

        after_start = parse_metrics(agent.metrics())
        pods = agent.get_json("/pods") or []
        uids = {row["name"]: row["uid"] for row in pods}

        removed_wall, t1 = time.time(), time.monotonic()
        cpu_at_stopped: list[float] = []
        agent.remove_manifests()
        ends = await poll_teardown(client, t1, start_timeout(n),
                                   at_stopped=lambda: cpu_at_stopped.append(proc_cpu(pid, children=True)))
        cpu2, cd2 = proc_cpu(pid, children=True), proc_cpu(cd_pid)
        mem_end = proc_mem(pid)
        after_teardown = parse_metrics(agent.metrics())
        traces = {name: agent.get_json(f"/trace/{uid}") or [] for name, uid in uids.items()}
    finally:
        agent.stop()

    relist = "kubelet_pleg_relist_duration_seconds"
    started_since_observed = [e["seconds_since_observed"] for chain in traces.values() for e in chain
                              if e["kind"] == "PodStarted"]
    return {
        "node": agent.node,
        "pid_log": str(agent.log_path),
        "start_seconds": max(seen.values()),
        "per_pod_seen": list(seen.values()),
        "per_pod_observed_to_started": started_since_observed,
        "teardown_seconds": ends.empty,
        "stopped_seconds": ends.stopped,
        "rss_idle": mem_idle["VmRSS"],
        "cores_idle": cores_idle,
        "rss_running": mem_running["VmRSS"],
        "rss_end": mem_end["VmRSS"],
        "hwm": mem_end["VmHWM"],
        "cpu_start": cpu1 - cpu0,
        "cpu_start_loop": loop1 - loop0,
        "cpu_teardown": cpu2 - cpu1,
        "cpu_stop": cpu_at_stopped[0] - cpu1,
        "containerd_cpu_start": cd1 - cd0,
        "containerd_cpu_teardown": cd2 - cd1,
        "machine_busy_start": busy_cores(m0, m1),
        "relist_start": hist_summary(histogram(after_start, relist), histogram(before, relist)),
        "relist_teardown": hist_summary(histogram(after_teardown, relist), histogram(after_start, relist)),
        "pod_start_hist": hist_summary(histogram(after_start, "kubelet_pod_start_duration_seconds")),
        "cri_calls_start": cri_calls(after_start, before),
        "cri_calls_teardown": cri_calls(after_teardown, after_start),
        "stage_sums": {lbl: v for (metric, lbl), v in after_teardown.items()
                       if metric == "nodeagent_stage_duration_seconds_sum"},
        "breakdown": breakdown(traces, written, t0_wall, seen, removed_wall),
        "steady": steady,
    }


# --------------------------------------------------------------------------- the kubelet (peer)


def kubelet_empty_timeout(n: int) -> float:
    """How long to wait for the kubelet's runtime to be empty after its pods stopped: its
    container GC removes the sandboxes of deleted pods once a minute, so a minute and a bit."""
    return 75.0 + start_timeout(n)


async def run_kubelet(rt: Runtime, workdir: Path, n: int, grace: int) -> dict[str, Any]:
    """The same N manifests through the upstream kubelet, measured as run_agent measures nodeagent
    (same poll, same /proc readings), then the runtime emptied through CRI for whoever is next."""
    binary = kubelet_peer.binary_path()
    if binary is None:
        raise RuntimeError("the kubelet is not built: python -m controlplane build kubelet")
    client = rt.client
    kubelet = kubelet_peer.KubeletProcess(workdir, binary, rt.endpoint, max_pods=max(110, n))
    try:
        await anyio.to_thread.run_sync(kubelet.start)
        pid, cd_pid = kubelet.pid, rt.pid
        cores_idle = await settle(pid)
        mem_idle = proc_mem(pid)
        cpu0, cd0, m0 = proc_cpu(pid, children=True), proc_cpu(cd_pid), machine_cpu()
        expected = {f"bench-{i:03d}-{kubelet.node}": 1 for i in range(n)}

        t0 = time.monotonic()
        write_manifests(kubelet.manifests, kubelet.node, n, grace)
        seen = await poll_running(client, {}, expected, t0, start_timeout(n))
        cpu1, cd1, m1 = proc_cpu(pid, children=True), proc_cpu(cd_pid), machine_cpu()
        mem_running = proc_mem(pid)
        steady = await hold_steady(pid, cd_pid)

        t1 = time.monotonic()
        cpu_at_stopped: list[float] = []
        remove_manifests(kubelet.manifests)
        ends = await poll_teardown(client, t1, start_timeout(n), empty_timeout=kubelet_empty_timeout(n),
                                   at_stopped=lambda: cpu_at_stopped.append(proc_cpu(pid, children=True)))
        cpu2, cd2 = proc_cpu(pid, children=True), proc_cpu(cd_pid)
        mem_end = proc_mem(pid)
        tunables = kubelet.tunables_written()
    finally:
        kubelet.stop()
        left = await empty_runtime(client)
        cgroups_left = kubelet.cleanup()
    return {
        "node": kubelet.node,
        "pid_log": str(kubelet.log_path),
        "start_seconds": max(seen.values()),
        "per_pod_seen": list(seen.values()),
        "teardown_seconds": ends.empty,
        "stopped_seconds": ends.stopped,
        "left_in_runtime": left,  # removed by us after the kubelet stopped (its GC had not yet)
        "cgroups_left": [str(p) for p in cgroups_left],
        "tunables_written": tunables,
        "rss_idle": mem_idle["VmRSS"],
        "cores_idle": cores_idle,
        "rss_running": mem_running["VmRSS"],
        "rss_end": mem_end["VmRSS"],
        "hwm": mem_end["VmHWM"],
        "cpu_start": cpu1 - cpu0,
        "cpu_teardown": cpu2 - cpu1,
        "cpu_stop": cpu_at_stopped[0] - cpu1,
        "containerd_cpu_start": cd1 - cd0,
        "containerd_cpu_teardown": cd2 - cd1,
        "machine_busy_start": busy_cores(m0, m1),
        "steady": steady,
    }


# --------------------------------------------------------------------------- the run

def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def p50_95(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{fmt(pct(values, 50))} / {fmt(pct(values, 95))}"


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    c = meta["baseline_concurrency"]
    reps = meta["repeat"]
    lines = [
        f"### {meta['date']} — commit {meta['commit']}",
        "",
        f"`{meta['command']}`: {meta['cores']} cores; load average before/after {meta['load_before']} / "
        f"{meta['load_after']}; {meta['runtime']}; baseline in flight: {c}; grace {meta['grace']} s; "
        + (f"{reps} repetitions per size (medians; per-pod figures pooled); " if reps > 1 else "")
        + ("**agent profiled with cProfile (slower)**; " if meta.get("profiled") else "")
        + (f"peer: {meta['peer']}; " if meta.get("peer") else "")
        + f"whole run {meta['wall']:.0f} s.",
        "",
        ("**Start** (first manifest written / first call issued → every pod's container RUNNING in ListContainers, "
         "polled every 50 ms). Per-pod = when that pod was first seen running, from the start. "
         "Machine busy = average cores busy on the whole machine during the start phase (2.0 = saturated; "
         "well above the runtime's and agent's own use means other load)."),
        "",
        ("| N | baseline s | nodeagent s | ratio | baseline pods/s | nodeagent pods/s "
         "| baseline per-pod p50 / p95 s | nodeagent per-pod p50 / p95 s | nodeagent observed→PodStarted p50 / p95 s "
         "| machine busy: baseline / nodeagent |"),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        b, a, n = r["baseline"], r["agent"], r["n"]
        lines.append(
            f"| {n} | {fmt(b['start_seconds'])} | {fmt(a['start_seconds'])} | "
            f"{fmt(a['start_seconds'] / b['start_seconds'])} | {fmt(n / b['start_seconds'], 1)} | "
            f"{fmt(n / a['start_seconds'], 1)} | {p50_95(b['per_pod_seen'])} | {p50_95(a['per_pod_seen'])} | "
            f"{p50_95(a['per_pod_observed_to_started'])} | "
            f"{fmt(b['machine_busy_start'], 1)} / {fmt(a['machine_busy_start'], 1)} |"
        )
    unbounded = [r for r in results if "baseline_all" in r]
    if unbounded:
        lines += [
            "",
            (f"**Baseline with all N pods in flight** (nodeagent has no in-flight limit: one worker per pod, all at "
             f"once), next to the baseline with {c} in flight."),
            "",
            (f"| N | baseline ({c}) s | baseline (N) s | nodeagent s | nodeagent / baseline (N) "
             f"| baseline ({c}) per-pod p50 / p95 s | baseline (N) per-pod p50 / p95 s | nodeagent per-pod p50 / p95 s "
             f"| teardown: baseline ({c}) / baseline (N) / nodeagent s |"),
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in unbounded:
            b, u, a = r["baseline"], r["baseline_all"], r["agent"]
            lines.append(
                f"| {r['n']} | {fmt(b['start_seconds'])} | {fmt(u['start_seconds'])} | {fmt(a['start_seconds'])} | "
                f"{fmt(a['start_seconds'] / u['start_seconds'])} | {p50_95(b['per_pod_seen'])} | "
                f"{p50_95(u['per_pod_seen'])} | {p50_95(a['per_pod_seen'])} | {fmt(b['teardown_seconds'])} / "
                f"{fmt(u['teardown_seconds'])} / {fmt(a['teardown_seconds'])} |"
            )
    lines += [
        "",
        "**Teardown** (manifests removed / teardown begun → no sandbox and no container left).",
        "",
        "| N | baseline s | nodeagent s | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for r in results:
        b, a = r["baseline"], r["agent"]
        lines.append(f"| {r['n']} | {fmt(b['teardown_seconds'])} | {fmt(a['teardown_seconds'])} | "
                     f"{fmt(a['teardown_seconds'] / b['teardown_seconds'])} |")

    def relists(h: dict[str, Any]) -> str:
        mean = 1000 * h["mean"] if h["mean"] is not None else None
        if not h["count"]:
            return "0"
        top = h["max_le"] if h["max_le"] is not None else "+Inf"
        return f"{h['count']}, {fmt(mean, 0)}, ≤{top}, {fmt(h['sum'], 1)}"

    lines += [
        "",
        ("**nodeagent process** (a `python -m nodeagent run` subprocess per size and repetition, read from "
         "/proc/PID/status and /proc/PID/stat), containerd's CPU during the start phase, and the agent's relists "
         "(kubelet_pleg_relist_duration_seconds: count, mean ms, max bucket s, total s)."),
        "",
        ("| N | RSS idle MiB | RSS N running MiB | VmHWM MiB | CPU s start (event-loop thread) | CPU ms/pod start "
         "| CPU s teardown | containerd CPU s start: baseline / nodeagent | relists during start "
         "| relists during teardown |"),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        b, a, n = r["baseline"], r["agent"], r["n"]
        lines.append(
            f"| {n} | {fmt(a['rss_idle'] / MiB, 1)} | {fmt(a['rss_running'] / MiB, 1)} | {fmt(a['hwm'] / MiB, 1)} | "
            f"{fmt(a['cpu_start'])} ({fmt(a['cpu_start_loop'])}) | {fmt(1000 * a['cpu_start'] / n, 1)} | "
            f"{fmt(a['cpu_teardown'])} | "
            f"{fmt(b['containerd_cpu_start'])} / {fmt(a['containerd_cpu_start'])} | "
            f"{relists(a['relist_start'])} | {relists(a['relist_teardown'])} |"
        )
    keys: list[str] = []
    for r in results:
        for k in r["agent"]["breakdown"]:
            if k not in keys:
                keys.append(k)
    lines += [
        "",
        "**Where nodeagent's time goes** (per pod, from its trace; p50 / p95 seconds).",
        "",
        "| interval | " + " | ".join(f"N={r['n']}" for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(p50_95(r["agent"]["breakdown"].get(k, [])) for r in results) + " |")
    lines += sidebyside.render(results)
    return "\n".join(lines) + "\n"


async def run(sizes: Sequence[int], concurrency: int, grace: int, repeat: int, keep: bool,
              profile: Path | None, unbounded: bool,
              peer: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    devenv.ensure_packages()
    archives = devenv.build_images()
    workdir = Path(tempfile.mkdtemp(prefix="na-bench-", dir="/tmp"))
    env = devenv.Containerd(workdir / "cd")
    results: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"load_before": load_average(), "cores": os.cpu_count(), "baseline_concurrency": concurrency,
                            "grace": grace, "repeat": repeat, "profiled": profile is not None,
                            "peer": "kubelet v1.37.2" if peer else None}
    began = time.monotonic()
    try:
        env.start()
        env.import_images(archives)
        print(f"containerd {env.endpoint} (log {env.log_path}); work dir {workdir}", file=sys.stderr)
        async with RuntimeClient(env.endpoint) as client:
            info = client.runtime_version
            meta["runtime"] = (f"{env.runtime.name}: {info.runtime_name} {info.runtime_version}" if info
                               else env.runtime.name)
            image = await client.image_status(devenv.BUSYBOX_IMAGE)
            if image is None:
                raise RuntimeError(f"{devenv.BUSYBOX_IMAGE} is not in the runtime")
            rt = Runtime(client, env.endpoint, env.pid() or 0, image.id)
            # Warm-up (untimed): the first sandbox pays for first-use costs in containerd and the CNI.
            await run_baseline(rt, workdir, 1, concurrency, grace)
            for n in sizes:
                reps = []
                for k in range(repeat):
                    tag = f"N={n}" + (f" #{k + 1}" if repeat > 1 else "")
                    prof = profile.with_name(f"{profile.stem}-{n}-{k + 1}{profile.suffix}") if profile else None
                    rec: dict[str, Any] = {"n": n}
                    # Alternate who goes first, so that drifting background load hits both alike
                    # (with the kubelet last in even rounds and first in odd ones, nodeagent and the
                    # kubelet swap order every round). One system at a time: each leaves the runtime
                    # empty (run_kubelet empties it through CRI after its own teardown).
                    order = ["baseline", "agent"] + (["baseline_all"] if unbounded and n > concurrency else [])
                    order += ["kubelet"] if peer else []
                    for who in (order if k % 2 == 0 else order[::-1]):
                        if who == "baseline":
                            rec[who] = await run_baseline(rt, workdir, n, concurrency, grace)
                        elif who == "baseline_all":
                            rec[who] = await run_baseline(rt, workdir, n, n, grace)
                        elif who == "kubelet":
                            rec[who] = await run_kubelet(rt, workdir, n, grace)
                        else:
                            rec[who] = await run_agent(rt, workdir, n, grace, prof)
                        print(f"{tag}: {who} start {rec[who]['start_seconds']:.2f}s "
                              f"stopped {rec[who]['stopped_seconds']:.2f}s "
                              f"empty {fmt(rec[who]['teardown_seconds'])}s (load {load_average()})",
                              file=sys.stderr, flush=True)
                    if peer:
                        rec["vs_kubelet"] = sidebyside.peer_ratios(rec["agent"], rec["kubelet"], n)
                    rec["load_average"] = load_average()
                    reps.append(rec)
                    with (workdir / "rounds.jsonl").open("a") as f:  # kept if a later round fails
                        f.write(json.dumps(rec, default=str) + "\n")
                merged = merge(reps)
                merged["rounds"] = reps
                results.append(merged)
    except BaseException:
        keep = True  # the agent's and containerd's logs are what explains a failure
        print(f"failed; logs kept in {workdir}", file=sys.stderr)
        raise
    finally:
        env.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    meta["wall"] = time.monotonic() - began
    meta["load_after"] = load_average()
    return results, meta


def print_profiles(pattern: Path, top: int = 30) -> None:
    import pstats

    for path in sorted(pattern.parent.glob(f"{pattern.stem}-*{pattern.suffix}")):
        print(f"\n--- {path}: top {top} by own time ---", file=sys.stderr)
        pstats.Stats(str(path), stream=sys.stderr).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pod_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="comma-separated pod counts (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help=f"sizes {','.join(map(str, QUICK_SIZES))}")
    parser.add_argument("--repeat", type=int, default=None,
                        help="repetitions (rounds) per size; medians are reported (default 3 with a peer, else 1)")
    parser.add_argument("--peer", choices=("auto", "kubelet", "none"), default="auto",
                        help="run the upstream kubelet side by side (auto: when its binary is in the cache; "
                             "kubelet: build it first if it is not)")
    parser.add_argument("--baseline-concurrency", type=int, default=BASELINE_CONCURRENCY,
                        help="pods in flight in the raw-CRI baseline (default %(default)s)")
    parser.add_argument("--no-unbounded-baseline", action="store_true",
                        help="skip the second baseline that has all N pods in flight (as nodeagent has)")
    parser.add_argument("--grace", type=int, default=GRACE_SECONDS,
                        help="terminationGracePeriodSeconds of the pods (default %(default)s)")
    parser.add_argument("--runtime", choices=devenv.RUNTIMES, default=None,
                        help=f"the containerd to measure on (default ${devenv.RUNTIME_ENV}, else containerd2)")
    parser.add_argument("--steady", type=float, default=0.0, metavar="SECONDS",
                        help="hold the N running pods this long, measuring the agent's CPU and RSS")
    parser.add_argument("--append", type=Path, help="append the Markdown result block to this file")
    parser.add_argument("--json", type=Path, help="write every measurement as JSON to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (agent and containerd logs)")
    parser.add_argument("--profile", type=Path, metavar="FILE.pstats",
                        help="run the agent under cProfile; writes FILE-N-REP.pstats and prints the top functions "
                             "(timings are then inflated: do not append them as results)")
    args = parser.parse_args(argv)
    if args.peer == "kubelet" and kubelet_peer.binary_path() is None:
        from controlplane import build as cpbuild

        cpbuild.build(["kubelet"])
    peer = args.peer == "kubelet" or (args.peer == "auto" and kubelet_peer.binary_path() is not None)
    if args.repeat is None:
        args.repeat = 3 if peer else 1
    if peer and args.steady == 0.0:
        args.steady = PEER_STEADY_SECONDS  # the idle cores at N of both
    if args.runtime:  # devenv.Containerd reads it
        os.environ[devenv.RUNTIME_ENV] = args.runtime
    global STEADY_SECONDS
    STEADY_SECONDS = args.steady
    sizes = QUICK_SIZES if args.quick else tuple(int(s) for s in args.sizes.split(",") if s.strip())
    if not sizes or min(sizes) < 1 or args.repeat < 1:
        parser.error("--sizes and --repeat take positive integers")
    if os.geteuid() != 0:
        parser.error("needs root (containerd, runc, CNI)")
    profile = args.profile.absolute() if args.profile else None
    if profile:
        profile.parent.mkdir(parents=True, exist_ok=True)

    results, meta = anyio.run(run, sizes, args.baseline_concurrency, args.grace, args.repeat, args.keep, profile,
                              not args.no_unbounded_baseline, peer, backend="asyncio")
    meta["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    meta["commit"] = git_description()
    meta["command"] = "python -m benchmarks.pod_start " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(results, meta)
    print(text)
    if profile:
        print_profiles(profile)
    if args.append:
        with args.append.open("a") as f:
            f.write("\n" + text)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
