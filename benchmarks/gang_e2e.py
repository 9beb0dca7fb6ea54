"""The 64-GPU gang end to end: figures (``python -m benchmarks.gang --nodes 8 --gpus 8 --runs 5``).

One control plane (this process starts it, gang scheduling on), ``--nodes`` nodes of ``--gpus``
fake GPUs each (benchmarks/gang_cluster.py: nodeagent processes, private containerds, the fake
GPU driver). First, before any agent runs, the *raw-CRI floor* of the start skew
(benchmarks/start_floor.py): one container created on each node's runtime and all started at one
instant, ``--runs`` times, what no agent can beat on this machine. Then each run, in order:

1. **gang**: a Workload/PodGroup (gang minCount = nodes) and ``nodes`` pods claiming ``gpus``
   GPUs each; the scheduler places them, one per node. Measured:
   - *created → all running*: the Workload created → the last member's container started (CRI);
   - *last bind → all started*: the last member seen bound (the harness's pod watch) → the last
     container started;
   - *release*: the last member's vote seen in the API (prepared: devices, sandbox, image) →
     every member's container started; the goal is one watch round trip (≤ 1 s);
   - *skew*: max − min of the members' container starts (CRI), goal ≤ 200 ms;
   - *the start window's CPU*: from the commit record seen here to every start seen, the CPU
     seconds the agents, the runtimes (with the runc their shims ran), the control plane and
     this process used, and the machine's busy cores (benchmarks/cpushare.py): where the skew
     goes when eight nodes share this machine's cores;
   then deleted, and *delete → released* (no sandbox, no prepared claim, no checkpoint entry).
2. **plain**: the same pods without Workload, PodGroup or schedulingGroup: created → all running,
   skew.
3. **abort**: the gang again, with the last node's driver failing NodePrepareResources and the
   coordinator (member 0) on the first node: it times the gang out (``--timeout``); *abort →
   released*: the coordinator's abort record seen in the API → no sandbox, prepared claim or
   checkpoint entry of the gang left on any healthy node; runtime evidence that no member ran.

The agents' CPU (utime + stime over the whole benchmark) and peak RSS (VmHWM) from /proc.
Every run checks the invariants from the runtimes (all or nothing, one claim per GPU, nothing
left); ``--chaos K`` adds K runs with a failure injected at random (a driver failing on a random
node, an image that cannot be pulled on a random node) and counts partial starts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from benchmarks import cpushare, start_floor
from benchmarks.gang_cluster import GangCluster, gang_cluster, private_runtimes, until
from benchmarks.pod_start import git_description, histogram, load_average, parse_metrics
from controlplane import ControlPlane
from devenv.images import BUSYBOX_IMAGE


async def _all(check: Any) -> bool:
    return bool(check())


def cpu_classes(c: GangCluster, shims: list[int]) -> dict[str, list[int]]:
    """The processes whose CPU the start window is split into (benchmarks/cpushare.py)."""
    return {"agents": [n.proc.pid for n in c.nodes if n.proc is not None],
            "runtimes": [pid for n in c.nodes if (pid := n.runtime.pid()) is not None] + shims,
            "control_plane": list(c.cp.pids().values()),
            "benchmark": [os.getpid()]}


async def gang_run(c: GangCluster, nodes: int, gang: bool) -> dict[str, float]:
    g = await c.create_gang(nodes, gang=gang)
    members = list(g.members)
    window: cpushare.Snapshot | None = None
    shims: list[int] = []
    if gang:
        # The CPU of the start window (the commit record → the last start): taken when this
        # process sees the record, which is when the agents see it (one watch, ±10 ms).
        await until(lambda: _all(lambda: any(c.pods[m].record.get("status") == "True" for m in members)), 180,
                    lambda: f"the commit record: {c.describe(members)}", interval=0.01)
        shims = cpushare.shims_of(n.runtime.endpoint for n in c.nodes)
        window = cpushare.snapshot(cpu_classes(c, shims), with_children=["runtimes"])
    await until(lambda: _all(lambda: len(c.started(members)) == nodes), 180,
                lambda: f"every member's container started: {c.describe(members)}; held: {c.held()}")
    cpu: dict[str, float] = {}
    if window is not None:
        after = cpushare.snapshot(cpu_classes(c, shims), with_children=["runtimes"])
        cpu = {f"window_{key}": value for key, value in cpushare.shares(window, after).items()}
    await anyio.sleep(0.3)
    seen = c.check_all_or_nothing(members, gang=gang)
    starts = [s.started_at / 1e9 for s in seen]
    last = max(starts)
    out = {"created_to_running": last - g.created, "skew": last - min(starts),
           "bind_to_started": last - max(c.pods[m].bound for m in members), **cpu}
    if gang:
        last_vote = max(c.pods[m].voted for m in members)
        out["release"] = last - last_vote
        # Where the release goes: the coordinator's share (it sees the last vote, writes its
        # record), then every node's (it sees the record and starts the containers it created
        # ahead while its member waited).
        recorded = [c.pods[m].record_seen for m in members if c.pods[m].record.get("status") == "True"]
        if recorded:
            out["vote_to_record"] = min(recorded) - last_vote
            out["record_to_started"] = last - min(recorded)
            out["created_ahead"] = float(sum(s.created_at / 1e9 < min(recorded) for s in seen))
        commits = commit_seen(c, g.name)
        if len(commits) == nodes:
            out["vote_to_commit_everywhere"] = max(commits) - last_vote
            out["commit_skew"] = max(commits) - min(commits)
    deleted = time.time()
    await c.delete_gang(g)
    await until(lambda: _all(lambda: c.quiet(members)), 120, lambda: f"the gang released: {c.held()}")
    out["delete_to_released"] = time.time() - deleted
    await until(lambda: _all(lambda: all(c.pods[m].deleted for m in members)), 60, "the pods gone from the API")
    return out


async def abort_run(c: GangCluster, nodes: int, broken: int, how: str = "driver") -> dict[str, float]:
    """A gang one node of which cannot prepare; returns abort → released, and checks that no
    member ran anywhere. ``how``: driver (NodePrepareResources fails) or image (not pullable)."""
    bad = c.nodes[broken]
    coordinator = c.nodes[0 if broken != 0 else 1]
    image = BUSYBOX_IMAGE
    if how == "driver":
        assert bad.driver is not None
        bad.driver.fail = "prepare"
    g = await c.create_gang(nodes, on={0: coordinator.name, **({} if how == "driver" else {1: bad.name})},
                            create=0)
    if how == "image":
        # Member 1 goes to the bad node with an image no registry has; the rest as usual.
        await c.add_members(g, [1], image="registry.invalid/nodeagent/missing:1", on={1: bad.name})
        await c.add_members(g, [0, *range(2, nodes)], image=image, on={0: coordinator.name})
    else:
        await c.add_members(g, range(nodes), on={0: coordinator.name})
    members = list(g.members)
    try:
        first = f"{g.name}-0"
        await until(lambda: _all(lambda: c.pods[first].record.get("status") == "False"), 120,
                    "the coordinator's abort record")
        decided = c.pods[first].record_seen
        healthy = [m for m in members if c.pods[m].node != bad.name]
        await until(lambda: _all(lambda: all(c.pods[m].failed for m in healthy) and c.quiet(healthy)), 120,
                    lambda: f"the healthy members released: {c.held()}")
        released = time.time()
        assert not c.started(members), f"a member of an aborted gang ran: {c.started(members)}"
    finally:
        if bad.driver is not None:
            bad.driver.fail = "none"
    await c.delete_gang(g)
    await until(lambda: _all(lambda: c.quiet(members)), 120, lambda: f"the aborted gang released: {c.held()}")
    assert not c.started(members), f"a member of an aborted gang ran: {c.started(members)}"
    return {"abort_to_released": released - decided}


def commit_seen(c: GangCluster, gang: str) -> list[float]:
    """When each node's agent followed the commit of ``gang`` (its "gang committed" log line):
    what the barrier itself controls, before each node's container start."""
    seen = []
    for node in c.nodes:
        try:
            lines = node.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if '"gang committed"' not in line or f"/{gang}#" not in line:
                continue
            try:
                stamp = json.loads(line)["timestamp"]
            except (ValueError, KeyError):
                continue
            seen.append(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
            break
    return seen


async def print_bus_depths(c: GangCluster) -> None:
    """Each agent's bus queues (nodeagent_bus_queue_depth): a subscriber that stopped consuming
    shows as a full queue, and holds back every publisher behind it."""
    for node in c.nodes:
        try:
            text = await node.metrics()
        except OSError as exc:
            print(f"  {node.name}: no metrics ({exc})", flush=True)
            continue
        depths = [f"{labels} {value:g}" for (name, labels), value in parse_metrics(text).items()
                  if name == "nodeagent_bus_queue_depth"]
        print(f"  {node.name}: bus queues {', '.join(depths) or '(none)'}", flush=True)


async def print_task_dumps(c: GangCluster) -> None:
    """Ask every agent where its tasks wait (SIGUSR1) and say where each wrote it."""
    before = {node.name: set(node.task_dumps()) for node in c.nodes}
    for node in c.nodes:
        node.dump_tasks()
    await anyio.sleep(2)
    for node in c.nodes:
        fresh = [str(p) for p in node.task_dumps() if p not in before[node.name]]
        print(f"  {node.name}: task dump {', '.join(fresh) or '(none written)'}", flush=True)


CRI_OPERATIONS = ("podsandbox_status", "image_status", "create_container", "start_container")


async def cri_means(c: GangCluster) -> dict[str, float]:
    """Mean seconds of the CRI calls on a member's start path, over every node and the whole
    run (the agents' kubelet_runtime_operations_duration_seconds): the runtime's share."""
    sums = dict.fromkeys(CRI_OPERATIONS, 0.0)
    counts = dict.fromkeys(CRI_OPERATIONS, 0.0)
    for node in c.nodes:
        try:
            samples = parse_metrics(await node.metrics())
        except OSError:
            continue  # an agent that is down has no figures
        for op in CRI_OPERATIONS:
            found = histogram(samples, "kubelet_runtime_operations_duration_seconds", f'operation_type="{op}"')
            sums[op] += found["sum"]
            counts[op] += found["count"]
    return {op: sums[op] / counts[op] for op in CRI_OPERATIONS if counts[op]}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def run(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="nagx-", dir="/tmp"))
    cp = ControlPlane(base / "cp")
    await anyio.to_thread.run_sync(cp.start)
    results: dict[str, list[float]] = {}
    extra: dict[str, Any] = {"partial_starts": 0, "chaos_runs": 0, "unresolved": 0, "device_violations": 0}
    try:
        async with private_runtimes(args.nodes, under=args.runtime_dir) as runtimes:
            # The floor first, while no agent runs on these runtimes (an agent would take the
            # floor's pods for orphans): all nodes' StartContainer at one instant, no barrier.
            endpoints = [r.endpoint for r in runtimes]
            for floor in await start_floor.measure(endpoints, base / "floor", args.runs):
                for key, value in floor.items():
                    results.setdefault(f"floor_{key}", []).append(value)
            # Again with the members' devices: what runc sets up for 8 GPUs is the members' too.
            for floor in await start_floor.measure(endpoints, base / "floor", args.runs,
                                                   cdi_dirs=[r.cdi_spec_dir for r in runtimes], gpus=args.gpus):
                for key, value in floor.items():
                    results.setdefault(f"floor_gpus_{key}", []).append(value)
            print("raw CRI floor: " + ", ".join(f"{k}={v[-1]:.3f}" for k, v in sorted(results.items())), flush=True)
            async with gang_cluster(cp, runtimes, args.gpus, base / "nodes", {"timeoutSeconds": args.timeout}) as c:
                await measure(c, args, results, extra)
    finally:
        await anyio.to_thread.run_sync(cp.stop)
        if args.keep:
            print(f"kept: {base} (each node's agent.log under nodes/n*/, the control plane's logs under cp/)",
                  flush=True)
        else:
            shutil.rmtree(base, ignore_errors=True)
    return results, extra


async def measure(c: GangCluster, args: argparse.Namespace, results: dict[str, list[float]],
                  extra: dict[str, Any]) -> None:
    """The timed runs into ``results``, then the chaos runs, and the agents' costs into ``extra``."""
    for node in c.nodes:
        node.cpu_start = node.cpu_seconds()
    began = time.monotonic()
    for rep in range(args.runs):
        for gang in (True, False):
            mode = "gang" if gang else "plain"
            for key, value in (await gang_run(c, args.nodes, gang)).items():
                results.setdefault(f"{mode}_{key}", []).append(value)
            print(f"run {rep + 1} {mode}: " + ", ".join(
                f"{k}={v[-1]:.3f}" for k, v in sorted(results.items()) if k.startswith(mode)), flush=True)
        abort = await abort_run(c, args.nodes, args.nodes - 1)
        results.setdefault("abort_to_released", []).append(abort["abort_to_released"])
        print(f"run {rep + 1} abort: {abort['abort_to_released']:.3f}", flush=True)
    await chaos(c, args, extra)
    elapsed = time.monotonic() - began
    extra["cpu"] = [n.cpu_seconds() - n.cpu_start for n in c.nodes]
    extra["rss"] = [n.rss_mib()[1] for n in c.nodes]
    extra["elapsed"] = elapsed
    extra["device_violations"] = len(c.violations)
    extra["version"] = c.version
    extra["cri"] = await cri_means(c)


async def chaos(c: GangCluster, args: argparse.Namespace, extra: dict[str, Any]) -> None:
    """``args.chaos`` aborted gangs, a failure injected on a random node each: partial starts and
    runs that did not resolve are counted in ``extra``."""
    rng = random.Random(args.seed)
    for i in range(args.chaos):
        how = rng.choice(["driver", "image"])
        broken = rng.randrange(args.nodes)
        try:
            await abort_run(c, args.nodes, broken, how)
        except AssertionError as exc:
            extra["partial_starts"] += 1
            print(f"chaos {i + 1}: PARTIAL START {exc}", flush=True)
        except TimeoutError as exc:
            # A gang that did not resolve in time is a finding, not the end of the run:
            # counted and said; the run goes on once that gang is gone from every node.
            extra["unresolved"] += 1
            print(f"chaos {i + 1}/{args.chaos}: {how} on node {broken}: UNRESOLVED {exc}", flush=True)
            await print_bus_depths(c)
            await print_task_dumps(c)
            if c.started(c.gangs[-1].members):  # one node is broken: no member may ever have run
                extra["partial_starts"] += 1
                print(f"chaos {i + 1}: PARTIAL START {c.started(c.gangs[-1].members)}", flush=True)
            await c.delete_gang(c.gangs[-1])
            try:
                await until(lambda: _all(c.quiet), 180, lambda: f"the unresolved gang released: {c.held()}")
            except TimeoutError as stuck:
                # Something stays held (a wedged agent): later runs would measure that, so
                # the chaos ends here and the figures so far are rendered.
                print(f"chaos stopped after run {i + 1}: {stuck}", flush=True)
                break
            continue
        extra["chaos_runs"] += 1
        print(f"chaos {i + 1}/{args.chaos}: {how} on node {broken}: no partial start", flush=True)


def render(results: dict[str, list[float]], extra: dict[str, Any], meta: dict[str, Any]) -> str:
    runs = meta["runs"]
    lines = [f"### {meta['date']} — commit {meta['commit']}", "",
             (f"`{meta['command']}`: {meta['cores']} cores; load average before/after {meta['load_before']} / "
              f"{meta['load_after']}; {meta['nodes']} nodes × {meta['gpus']} fake GPUs "
              f"({meta['nodes'] * meta['gpus']} GPUs), each node a nodeagent process with its own containerd "
              f"and the fake GPU driver; one control plane (scheduling.k8s.io/{extra.get('version')}, "
              f"GangScheduling); {runs} run(s); whole run {meta['seconds']:.0f} s. "
              "p50 / p99 over the runs (with fewer than 100 runs p99 is the interpolated top)."), "",
             "| measure | gang p50 / p99 s | plain p50 / p99 s | goal |", "|---|---:|---:|---|"]

    def cell(key: str) -> str:
        values = results.get(key)
        return f"{pct(values, 0.5):.3f} / {pct(values, 0.99):.3f}" if values else "–"

    rows = [("Workload created → all containers running", "created_to_running", ""),
            ("scheduler's bind of the last member → all started", "bind_to_started", ""),
            ("last member prepared (vote in the API) → all started", "release", "≤ 1 s"),
            ("· of which: last vote → the commit record seen in the API", "vote_to_record", ""),
            ("· last vote → every node's agent followed the commit (its log)", "vote_to_commit_everywhere", ""),
            ("· then: the record → the last member's container started", "record_to_started", ""),
            ("· members whose container was created before the record (count)", "created_ahead", ""),
            ("start skew across nodes", "skew", "≤ 0.2 s"),
            ("· skew of the agents following the commit (the barrier's own share)", "commit_skew", ""),
            ("gang deleted → nothing held on any node", "delete_to_released", ""),
            ("start window (the record seen → all seen started), seconds", "window_window", ""),
            ("· CPU seconds in it: the agents", "window_agents", ""),
            ("· the runtimes (containerd, shims, the runc they ran)", "window_runtimes", ""),
            ("· the control plane", "window_control_plane", ""),
            ("· this benchmark (its watch and CRI polls)", "window_benchmark", ""),
            ("· cores busy on the whole machine", "window_machine_cores", f"of {os.cpu_count()}")]
    for title, key, goal in rows:
        lines.append(f"| {title} | {cell('gang_' + key)} | {cell('plain_' + key)} | {goal} |")
    lines.append(f"| abort decision (record in the API) → every healthy node released | {cell('abort_to_released')} "
                 f"| – | ≤ 2 s + grace |")
    if results.get("floor_skew"):
        lines.append(f"| raw-CRI floor, no agent: every node's StartContainer sent at one instant → start skew "
                     f"| {cell('floor_skew')} | – | |")
        lines.append(f"| · that floor's StartContainer calls, mean | {cell('floor_call_mean')} | – | |")
    if results.get("floor_gpus_skew"):
        lines.append(f"| the same floor, each container given {meta['gpus']} fake GPUs through CDI as a member is → "
                     f"start skew | {cell('floor_gpus_skew')} | – | |")
        lines.append(f"| · its StartContainer calls, mean | {cell('floor_gpus_call_mean')} | – | |")
    cpu, rss = extra["cpu"], extra["rss"]
    lines += ["", (f"Agents over the whole run ({extra['elapsed']:.0f} s): CPU {statistics.median(cpu):.1f} s median, "
                   f"{max(cpu):.1f} s max per agent; peak RSS {statistics.median(rss):.0f} MiB median, "
                   f"{max(rss):.0f} MiB max. Device invariant violations (a GPU prepared for two claims at once): "
                   f"{extra['device_violations']}. Chaos: {extra['chaos_runs']} runs with a failure injected "
                   f"(driver or image pull, random node), partial starts: {extra['partial_starts']}"
                   + (f"; {extra['unresolved']} more runs did not resolve in time (counted, not in the figures)"
                      if extra.get("unresolved") else "") + ".")]
    if extra.get("cri"):
        lines += ["", "CRI calls on a member's start path, mean over every node and run: " + ", ".join(
            f"{op} {seconds * 1000:.0f} ms" for op, seconds in extra["cri"].items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gang", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--chaos", type=int, default=0)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="the gang stage's timeoutSeconds (how long the abort runs hold the healthy members)")
    parser.add_argument("--append", type=Path, help="append the table to this Markdown file")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (the agents' logs)")
    parser.add_argument("--runtime-dir", type=Path, default=Path("/tmp"),
                        help="where the containerds keep their root and state (default /tmp: the machine's one "
                             "disk, which all of them share; /dev/shm takes that sharing out, as separate hosts "
                             "would have a disk each)")
    args = parser.parse_args(argv)
    load_before, begin = load_average(), time.monotonic()
    results, extra = anyio.run(run, args)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": git_description(),
            "command": "python -m benchmarks.gang " + " ".join(argv), "cores": os.cpu_count(),
            "load_before": load_before, "load_after": load_average(), "seconds": time.monotonic() - begin,
            "runs": args.runs, "nodes": args.nodes, "gpus": args.gpus}
    text = render(results, extra, meta)
    print(text)
    if args.append:
        with args.append.open("a") as f:
            f.write("\n" + text)
    return 0 if extra["partial_starts"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
