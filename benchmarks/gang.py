"""Gang start and abort on one node: the barrier's cost against the same pods without a gang.

    python -m benchmarks.gang                      # gangs of 2, 8 and 64 members, once each
    python -m benchmarks.gang --sizes 2,8 --repeat 3 --append benchmarks/RESULTS.md
    python -m benchmarks.gang --nodes 8 --gpus 8 --runs 5   # across nodes: benchmarks/gang_e2e.py

For each size N, in the same run, against the same private containerd (devenv), each scenario
with a fresh ``python -m nodeagent run`` subprocess (benchmarks.pod_start.AgentProcess):

1. **Start, gang**: N static pods of one gang (``gang.nodeagent.io/name``, min-member N) written
   at once; **start, plain**: the same N pods without the annotations.
   - *barrier release latency*: the last member prepared (its runtime stage's prepare phase
     completed: image, sandbox; the agent's trace) → every member's first container started
     (ContainerStatus.started_at from the CRI). For plain pods the same interval has no barrier in
     it: it is the cost of the start phase of the last pods alone.
   - *start skew*: max − min of the members' first container start (CRI).
   - *end to end*: first manifest written → every member's container started (CRI).
2. **Abort, gang**: N − 1 members prepared and waiting at the barrier, then an N-th member that
   cannot be admitted (``cpu: 1000``): the gang aborts at its admission. *Abort to release*: the
   abort decision (GangAborted fact on the member that did not fit) → no sandbox of the gang left
   in the runtime (polled every 50 ms). **Release, plain**: the same N − 1 pods without a gang,
   running, their manifests removed: the first kill seen (PodTerminating fact) → no sandbox left.
   The gang's members have no container to stop; the plain pods' containers exit on SIGTERM.

Times are wall-clock seconds on one machine (the agent's facts, containerd's timestamps and this
script share the clock). Percentiles are not taken: one number per run and size, the median
over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/gang.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

import devenv
from benchmarks.pod_start import AgentProcess, git_description, load_average
from cri import RuntimeClient
from cri import types as t
from nodeagent import labels as L

POLL_SECONDS = 0.05
GRACE_SECONDS = 2
COMMAND = "trap 'exit 0' TERM; while true; do sleep 1; done"  # exits at once on SIGTERM
DEFAULT_SIZES = (2, 8, 64)


def manifest(i: int, gang: str | None, min_member: int, cpu: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": devenv.images.BUSYBOX_IMAGE, "command": ["sh", "-c", COMMAND]}
    if cpu is not None:
        container["resources"] = {"requests": {"cpu": cpu}}
    metadata: dict[str, Any] = {"name": f"gb-{i:03d}"}
    if gang is not None:
        metadata["annotations"] = {"gang.nodeagent.io/name": gang, "gang.nodeagent.io/min-member": str(min_member),
                                   "gang.nodeagent.io/timeout-seconds": "600"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"terminationGracePeriodSeconds": GRACE_SECONDS, "containers": [container]}}


def write(agent: AgentProcess, docs: Sequence[dict[str, Any]]) -> None:
    for doc in docs:
        name = doc["metadata"]["name"]
        tmp = agent.manifests / f".{name}.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.rename(agent.manifests / f"{name}.json")


async def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await anyio.sleep(POLL_SECONDS)
    raise TimeoutError(f"{what}: not after {timeout:.0f}s")


async def first_starts(client: RuntimeClient, node: str, pods: int) -> dict[str, float] | None:
    """Pod name -> its container's start (wall seconds, from the runtime), once all run."""
    flt = t.ContainerFilter(state=t.ContainerState.CONTAINER_RUNNING, label_selector={L.MANAGED_BY: node})
    containers = await client.list_containers(flt)
    if len(containers) < pods:
        return None
    starts = {}
    for c in containers:
        status = await client.container_status(c.id)
        starts[c.labels.get(L.POD_NAME, "")] = status.started_at / 1e9
    return starts


async def sandboxes(client: RuntimeClient, node: str, ready: bool = False) -> int:
    found = [s for s in await client.list_pod_sandbox() if s.labels.get(L.MANAGED_BY) == node]
    return len([s for s in found if s.state == t.PodSandboxState.SANDBOX_READY] if ready else found)


def traces(agent: AgentProcess) -> dict[str, list[dict[str, Any]]]:
    return {row["name"]: agent.get_json(f"/trace/{row['uid']}") or [] for row in agent.get_json("/pods") or []}


def fact(chain: list[dict[str, Any]], kind: str, **match: Any) -> float | None:
    for event in chain:
        if event["kind"] == kind and all(event.get(k) == v for k, v in match.items()):
            return float(event["at"])
    return None


async def start_scenario(workdir: Path, endpoint: str, client: RuntimeClient, n: int, gang: bool) -> dict[str, float]:
    agent = AgentProcess(workdir, endpoint, max_pods=max(110, n + 10))
    agent.start()
    try:
        await anyio.sleep(1.0)  # let the agent settle (first relists) before the burst
        begin = time.time()
        write(agent, [manifest(i, f"bench{n}" if gang else None, n) for i in range(n)])
        starts = await until(lambda: first_starts(client, agent.node, n), 60 + 2 * n, f"{n} pods running")
        chains = traces(agent)
        prepared = [fact(c, "StageCompleted", phase="prepare", source="runtime") for c in chains.values()]
        last_prepared = max(p for p in prepared if p is not None)
        committed = [fact(c, "GangCommitted") for c in chains.values()]
        result = {
            "release": max(starts.values()) - last_prepared,
            "skew": max(starts.values()) - min(starts.values()),
            "end_to_end": max(starts.values()) - begin,
        }
        if gang:
            result["commit_to_last_start"] = max(starts.values()) - min(c for c in committed if c is not None)
        agent.remove_manifests()
        await until(lambda: _empty(client, agent.node), 60 + 2 * n, "teardown")
        return result
    finally:
        agent.stop()


async def _empty(client: RuntimeClient, node: str) -> bool:
    return await sandboxes(client, node) == 0


async def abort_scenario(workdir: Path, endpoint: str, client: RuntimeClient, n: int, gang: bool) -> float:
    """Gang: abort decision → released. Plain: first kill seen → released (the same N-1 pods)."""
    agent = AgentProcess(workdir, endpoint, max_pods=max(110, n + 10))
    agent.start()
    try:
        await anyio.sleep(1.0)
        waiting = n - 1
        write(agent, [manifest(i, f"abort{n}" if gang else None, n) for i in range(waiting)])
        if gang:
            await until(lambda: _all_waiting(agent, waiting), 60 + 2 * n, f"{waiting} members at the barrier")
            write(agent, [manifest(waiting, f"abort{n}", n, cpu="1000")])
        else:
            await until(lambda: first_starts(client, agent.node, waiting), 60 + 2 * n, f"{waiting} pods running")
            uids = [row["uid"] for row in agent.get_json("/pods") or []]  # forgotten pods leave /pods
            agent.remove_manifests()
        await until(lambda: _empty(client, agent.node), 60 + 2 * n, "release")
        released = time.time()
        if gang:
            decided = [fact(c, "GangAborted", reason="GangLocalAdmissionFailed") for c in traces(agent).values()]
        else:
            decided = [fact(agent.get_json(f"/trace/{uid}") or [], "PodTerminating") for uid in uids]
        agent.remove_manifests()
        return released - min(d for d in decided if d is not None)
    finally:
        agent.stop()


async def _all_waiting(agent: AgentProcess, count: int) -> bool:
    rows = agent.get_json("/pods") or []
    waiting = [r for r in rows if any(cs.get("state", {}).get("waiting", {}).get("reason") == "WaitingForGang"
                                      for cs in r["status"].get("containerStatuses", []))]
    return len(waiting) == count


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def render(results: dict[int, dict[str, list[float]]], meta: dict[str, Any]) -> str:
    lines = [f"### {meta['date']} — commit {meta['commit']}", "",
             (f"`{meta['command']}`: {meta['cores']} cores; load average before/after {meta['load_before']} / "
             f"{meta['load_after']}; containerd {meta['containerd']}; repeat {meta['repeat']} (medians); "
             f"whole run {meta['seconds']:.0f} s."), "",
             ("**Start** (one node, standalone; all N manifests written at once). Release = last member prepared "
             "(runtime prepare done, agent trace) → every member's container started (CRI). Skew = max − min "
             "container start across members (CRI). End to end = first manifest written → all started."), "",
             ("| N | release s: gang / plain | ratio | skew s: gang / plain | ratio | end to end s: gang / plain "
             "| ratio | gang: commit → last start s |"),
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, r in sorted(results.items()):
        g_rel, p_rel = median(r["gang_release"]), median(r["plain_release"])
        g_skew, p_skew = median(r["gang_skew"]), median(r["plain_skew"])
        g_e2e, p_e2e = median(r["gang_end_to_end"]), median(r["plain_end_to_end"])
        lines.append(f"| {n} | {g_rel:.3f} / {p_rel:.3f} | {_ratio(g_rel, p_rel)} | {g_skew:.3f} / {p_skew:.3f} "
                     f"| {_ratio(g_skew, p_skew)} | {g_e2e:.2f} / {p_e2e:.2f} | {_ratio(g_e2e, p_e2e)} "
                     f"| {median(r['gang_commit_to_last_start']):.3f} |")
    lines += ["", ("**Abort** (N − 1 members prepared and waiting, then a member that cannot be admitted). Gang: "
              "abort decision → no sandbox left. Plain: the same N − 1 pods running, manifests removed: first "
              "kill seen → no sandbox left."), "",
              "| N | members released | abort → released s (gang) | kill → released s (plain) | ratio |",
              "|---:|---:|---:|---:|---:|"]
    for n, r in sorted(results.items()):
        g, p = median(r["gang_abort"]), median(r["plain_abort"])
        lines.append(f"| {n} | {n - 1} | {g:.2f} | {p:.2f} | {_ratio(g, p)} |")
    return "\n".join(lines) + "\n"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "–"


async def run(sizes: Sequence[int], repeat: int) -> tuple[dict[int, dict[str, list[float]]], str]:
    devenv.ensure_packages()
    archives = devenv.build_images()
    workdir = Path(tempfile.mkdtemp(prefix="nagb-", dir="/tmp"))
    runtime = devenv.Containerd(workdir / "ctd")
    runtime.start()
    try:
        runtime.import_images(archives)
        version = f"{runtime.version().get('runtime_version', '?')} ({runtime.runtime.name})"
        results: dict[int, dict[str, list[float]]] = {}
        async with RuntimeClient(runtime.endpoint) as client:
            for n in sizes:
                r = results.setdefault(n, {})
                for rep in range(repeat):
                    for gang in (True, False):
                        mode = "gang" if gang else "plain"
                        started = await start_scenario(workdir, runtime.endpoint, client, n, gang)
                        for key, value in started.items():
                            r.setdefault(f"{mode}_{key}", []).append(value)
                        r.setdefault(f"{mode}_abort", []).append(
                            await abort_scenario(workdir, runtime.endpoint, client, n, gang))
                        print(f"N={n} rep={rep + 1} {mode}: " + ", ".join(
                            f"{k}={v[-1]:.3f}" for k, v in sorted(r.items()) if k.startswith(mode)), flush=True)
        return results, version
    finally:
        runtime.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--nodes" or a.startswith("--nodes=") for a in argv):
        # Across nodes, with the real scheduler and DRA devices (issue 20): benchmarks/gang_e2e.py.
        from benchmarks import gang_e2e
        return gang_e2e.main(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--runtime", choices=devenv.RUNTIMES, default=None,
                        help=f"the containerd to measure on (default ${devenv.RUNTIME_ENV}, else containerd2)")
    parser.add_argument("--append", type=Path, help="append the tables to this Markdown file")
    args = parser.parse_args(argv)
    import os

    if args.runtime:  # devenv.Containerd reads it (so does every containerd this run starts)
        os.environ[devenv.RUNTIME_ENV] = args.runtime
    sizes = [int(s) for s in args.sizes.split(",") if s]
    load_before, begin = load_average(), time.monotonic()
    results, version = anyio.run(run, sizes, args.repeat)

    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": git_description(),
            "command": "python -m benchmarks.gang " + " ".join(argv),
            "cores": os.cpu_count(), "load_before": load_before, "load_after": load_average(),
            "containerd": version, "repeat": args.repeat, "seconds": time.monotonic() - begin}
    text = render(results, meta)
    print(text)
    if args.append:
        with args.append.open("a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
