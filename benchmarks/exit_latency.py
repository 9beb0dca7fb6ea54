"""Container exit → pod status: how fast nodeagent sees a container die, on containerd 2.x (which
streams container events) and on containerd 1.6 (which does not: periodic relisting only); and
what the periodic relist costs at 110 pods, for the safety-net periods worth considering.

    python -m benchmarks.exit_latency                        # both runtimes, 30 exits each, cost at 110 pods
    python -m benchmarks.exit_latency --runtimes containerd2 --exits 10 --cost-periods ''   # quick
    python -m benchmarks.exit_latency --append benchmarks/RESULTS.md

**Exit latency.** K pods (busybox ``sleep 3600``, restartPolicy Never) run under a fresh
``python -m nodeagent run``; one at a time, after a random pause of 0–1.5 s (so that exits fall
anywhere in the relist period), the container's process is SIGKILLed from the host. Measured per
exit, in milliseconds:

* kill → seen: the kill, to the agent's ``ContainerExited`` fact (its trace, ``/trace/UID``);
* kill → status: the kill, to the write of the pod's status file that first shows the container
  terminated (the file's mtime; the file is polled every 5 ms only to find that version);
* kill → runtime event: the kill, to the runtime's CONTAINER_STOPPED event as a bare subscriber of
  the CRI stream in this process sees it (containerd 2.x): the runtime's own share, which no node
  agent can beat (containerd deletes the task before it reports the exit);
* runtime → seen: the runtime's own ``finishedAt`` to the fact.

**Relist cost.** 110 pods run; for each ``eventedRelistPeriod`` P the agent is restarted with it
(the pods keep running: a restarted agent adopts them), left to settle, and its CPU and
containerd's are read over a window. An exit is still seen at once through the event stream;
P is how long a lost event (a stream broken and not yet re-established) can go unseen, at worst.

Both use a private containerd per runtime (devenv, under /tmp), stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/exit_latency.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

import devenv
from benchmarks.pod_start import (
    AgentProcess,
    busy_cores,
    git_description,
    load_average,
    machine_cpu,
    pct,
    poll_running,
    proc_cpu,
    proc_mem,
    start_timeout,
)
from cri import RuntimeClient, Unimplemented
from cri import types as t
from devenv.runtime import selected
from nodeagent import labels as L

DEFAULT_EXITS = 30
DEFAULT_COST_PERIODS = (1.0, 5.0, 10.0, 30.0)
COST_PODS = 110
COST_SETTLE_SECONDS = 15.0
COST_WINDOW_SECONDS = 60.0
STATUS_POLL_SECONDS = 0.005
MAX_PAUSE_SECONDS = 1.5


def exit_manifest(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"exit-{index:03d}"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                 "containers": [{"name": "main", "image": devenv.BUSYBOX_IMAGE, "command": ["sleep", "3600"]}]},
    }


def write_config(agent: AgentProcess, period: float) -> None:
    """The agent reads its safety-net period from a configuration file (its flags stay)."""
    path = agent.dir / "config.yaml"
    path.write_text(f"eventedRelistPeriod: {period:g}s\n")
    if "--config" not in agent.argv:
        agent.argv += ["--config", str(path)]


def terminated_write(path: Path, deadline: float) -> float | None:
    """The wall time (file mtime) of the first version of the status file that shows the
    container terminated; None by the deadline. Blocking: run it in a thread."""
    while time.time() < deadline:
        try:
            stat = path.stat()
            status = json.loads(path.read_text())["status"]
        except (OSError, ValueError, KeyError):
            time.sleep(STATUS_POLL_SECONDS)
            continue
        states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
        if states and all("terminated" in s for s in states):
            return stat.st_mtime_ns / 1e9
        time.sleep(STATUS_POLL_SECONDS)
    return None


async def container_of(client: RuntimeClient, pod_name: str) -> tuple[str, int]:
    for c in await client.list_containers():
        if c.labels.get(L.POD_NAME) == pod_name:
            _, info = await client.container_status(c.id, verbose=True)
            return c.id, int(json.loads(info["info"])["pid"])
    raise RuntimeError(f"no container for pod {pod_name}")


async def follow_stops(endpoint: str, stopped: dict[str, float]) -> None:
    """When each container's CONTAINER_STOPPED event reaches a plain CRI subscriber."""
    async with RuntimeClient(endpoint) as client:
        try:
            async for event in client.container_events():
                if event.container_event_type == t.ContainerEventType.CONTAINER_STOPPED_EVENT:
                    stopped.setdefault(event.container_id, time.time())
        except Unimplemented:
            return  # containerd 1.6: no stream


async def measure_exits(client: RuntimeClient, endpoint: str, workdir: Path, exits: int) -> dict[str, Any]:
    agent = AgentProcess(workdir, endpoint, max_pods=max(110, exits))
    samples: list[dict[str, float]] = []
    stopped: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(follow_stops, endpoint, stopped)
        try:
            await _exits(client, agent, exits, samples, stopped)
        finally:
            tg.cancel_scope.cancel()
    return {"samples": samples, "log": str(agent.log_path)}


async def _exits(client: RuntimeClient, agent: AgentProcess, exits: int, samples: list[dict[str, float]],
                 stopped: dict[str, float]) -> None:
    try:
        await anyio.to_thread.run_sync(agent.start)
        for i in range(exits):
            doc = exit_manifest(i)
            (agent.manifests / f"exit-{i:03d}.json").write_text(json.dumps(doc))
        expected = {f"exit-{i:03d}-{agent.node}": 1 for i in range(exits)}
        await poll_running(client, {L.MANAGED_BY: agent.node}, expected, time.monotonic(), start_timeout(exits))
        pods = {row["name"]: row["uid"] for row in agent.get_json("/pods") or []}
        status_dir = agent.dir / "root" / "pod-status"
        rng = random.Random(7)
        for name in sorted(expected):
            await anyio.sleep(rng.uniform(0, MAX_PAUSE_SECONDS))
            container_id, pid = await container_of(client, name)
            [status_file] = status_dir.glob(f"default_{name}_*.json")
            killed = time.time()
            os.kill(pid, signal.SIGKILL)
            written = await anyio.to_thread.run_sync(terminated_write, status_file, killed + 30)
            status = await client.container_status(container_id)
            chain = agent.get_json(f"/trace/{pods[name]}") or []
            seen = next((e["at"] for e in chain if e["kind"] == "ContainerExited"), None)
            if seen is None or written is None:
                raise RuntimeError(f"{name}: exit not seen (fact at {seen}, status written at {written})")
            sample = {"kill_to_seen": seen - killed, "kill_to_status": written - killed,
                      "runtime_to_seen": seen - status.finished_at / 1e9}
            if container_id in stopped:
                sample["kill_to_event"] = stopped[container_id] - killed
            samples.append(sample)
    finally:
        agent.stop()


async def measure_cost(client: RuntimeClient, endpoint: str, containerd_pid: int, workdir: Path,
                       periods: list[float], window: float) -> list[dict[str, Any]]:
    agent = AgentProcess(workdir, endpoint, max_pods=COST_PODS)
    rows = []
    try:
        write_config(agent, periods[0])
        await anyio.to_thread.run_sync(agent.start)
        agent.write_manifests(COST_PODS, 2)
        expected = {f"bench-{i:03d}-{agent.node}": 1 for i in range(COST_PODS)}
        await poll_running(client, {L.MANAGED_BY: agent.node}, expected, time.monotonic(),
                           start_timeout(COST_PODS))
        for k, period in enumerate(periods):
            if k > 0:
                agent.stop()
                write_config(agent, period)
                await anyio.to_thread.run_sync(agent.start)
            await anyio.sleep(COST_SETTLE_SECONDS)
            relists0 = _relists(agent)
            a0, c0, m0 = proc_cpu(agent.pid), proc_cpu(containerd_pid), machine_cpu()
            await anyio.sleep(window)
            a1, c1, m1 = proc_cpu(agent.pid), proc_cpu(containerd_pid), machine_cpu()
            relists1 = _relists(agent)
            rows.append({"period": period, "agent_cpu_per_s": (a1 - a0) / window,
                         "containerd_cpu_per_s": (c1 - c0) / window, "machine_busy": busy_cores(m0, m1),
                         "relists_per_s": (relists1 - relists0) / window, "rss": proc_mem(agent.pid)["VmRSS"]})
            print(f"period {period:g}s: agent {rows[-1]['agent_cpu_per_s'] * 1000:.1f} ms/s, containerd "
                  f"{rows[-1]['containerd_cpu_per_s'] * 1000:.1f} ms/s", file=sys.stderr, flush=True)
        agent.remove_manifests()
    finally:
        agent.stop()
    return rows


def _relists(agent: AgentProcess) -> float:
    for line in agent.metrics().splitlines():
        if line.startswith("kubelet_pleg_relist_duration_seconds_count"):
            return float(line.split()[-1])
    return 0.0


async def run_runtime(name: str, exits: int, periods: list[float], window: float, keep: bool) -> dict[str, Any]:
    archives = devenv.build_images()
    workdir = Path(tempfile.mkdtemp(prefix=f"na-exit-{name}-", dir="/tmp"))
    env = devenv.Containerd(workdir / "cd", runtime=selected(name))
    out: dict[str, Any] = {"runtime": name}
    try:
        env.start()
        env.import_images(archives)
        async with RuntimeClient(env.endpoint) as client:
            info = client.runtime_version
            out["version"] = f"{info.runtime_name} {info.runtime_version}" if info else name
            if exits:
                out["exits"] = await measure_exits(client, env.endpoint, workdir, exits)
            if periods:
                out["cost"] = await measure_cost(client, env.endpoint, env.pid() or 0, workdir, periods, window)
    except BaseException:
        keep = True
        print(f"failed; logs kept in {workdir}", file=sys.stderr)
        raise
    finally:
        env.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"### {meta['date']} — commit {meta['commit']}", "",
             f"`{meta['command']}`: {os.cpu_count()} cores; load average before/after {meta['load_before']} / "
             f"{meta['load_after']}; whole run {meta['wall']:.0f} s.", ""]
    if any("exits" in r for r in results):
        lines += ["**Exit → status** (ms; SIGKILL of the container's process from the host, one pod at a "
                  "time after a random 0–1.5 s pause).", "",
                  "| runtime | exits | kill → runtime event p50 / p99 | kill → seen p50 / p99 | "
                  "kill → status written p50 / p99 | runtime finishedAt → seen p50 / p99 | max kill → status |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in results:
            if "exits" not in r:
                continue
            s = r["exits"]["samples"]

            def col(key: str, s: list[dict[str, float]] = s) -> str:
                values = [x[key] for x in s if key in x]
                return f"{ms(pct(values, 50))} / {ms(pct(values, 99))}" if values else "-"

            lines.append(f"| {r['version']} | {len(s)} | {col('kill_to_event')} | {col('kill_to_seen')} | "
                         f"{col('kill_to_status')} | "
                         f"{col('runtime_to_seen')} | {ms(max(x['kill_to_status'] for x in s))} |")
        lines.append("")
    if any("cost" in r for r in results):
        lines += [f"**Relist cost at {COST_PODS} running pods** (a {meta['window']:g} s window after "
                  f"{COST_SETTLE_SECONDS:g} s of settling, per eventedRelistPeriod; containerd 1.6 relists "
                  "every second whatever the setting).", "",
                  "| runtime | period s | relists/s | agent CPU ms/s | containerd CPU ms/s | agent RSS MiB | "
                  "machine busy |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in results:
            for row in r.get("cost", []):
                lines.append(f"| {r['version']} | {row['period']:g} | {row['relists_per_s']:.2f} | "
                             f"{row['agent_cpu_per_s'] * 1000:.1f} | {row['containerd_cpu_per_s'] * 1000:.1f} | "
                             f"{row['rss'] / 2**20:.0f} | {row['machine_busy']:.1f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exit_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtimes", default=",".join(devenv.RUNTIMES),
                        help="comma-separated runtimes (default %(default)s)")
    parser.add_argument("--exits", type=int, default=DEFAULT_EXITS, help="exits measured per runtime")
    parser.add_argument("--cost-periods", default=",".join(f"{p:g}" for p in DEFAULT_COST_PERIODS),
                        help="eventedRelistPeriod values (s) whose cost is measured at 110 pods on the runtimes "
                             "that stream events ('' for none; default %(default)s)")
    parser.add_argument("--cost-window", type=float, default=COST_WINDOW_SECONDS, help="seconds per cost reading")
    parser.add_argument("--append", type=Path, help="append the Markdown result block to this file")
    parser.add_argument("--json", type=Path, help="write every measurement as JSON to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work dirs (agent and containerd logs)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds as an exit does, so that the private containerd and its 110 pods are
    # stopped by the cleanup rather than left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    runtimes = [r for r in args.runtimes.split(",") if r]
    periods = [float(p) for p in args.cost_periods.split(",") if p.strip()]
    devenv.ensure_packages()
    meta: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                            "commit": git_description(), "load_before": load_average(), "window": args.cost_window,
                            "command": "python -m benchmarks.exit_latency " + " ".join(argv or sys.argv[1:])}
    began = time.monotonic()
    results = []
    for name in runtimes:
        # The cost of relisting every second is the same whatever the setting on 1.6: once, at 1 s.
        cost = periods if selected(name).name != "containerd1.6" else ([1.0] if periods else [])
        results.append(anyio.run(run_runtime, name, args.exits, cost, args.cost_window, args.keep))
    meta["wall"] = time.monotonic() - began
    meta["load_after"] = load_average()
    text = render(results, meta)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if args.append:
        with args.append.open("a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
