"""Pod start in cluster mode, nodeagent beside the upstream kubelet: a Deployment's pods scheduled
to the one node, create → Running as the API shows it (issue 19 §1, cluster mode).

    python -m benchmarks.cluster_start                        # sizes 1, 30, 110; 3 rounds
    python -m benchmarks.cluster_start --sizes 1,10 --rounds 1
    python -m benchmarks.cluster_start --append benchmarks/RESULTS.md

One control plane (controlplane.ControlPlane: etcd, kube-apiserver, controller-manager, scheduler
v1.37.2) and one private containerd serve every round. A round runs, per size N and per system
(nodeagent and the kubelet, one at a time, the order alternated between rounds):

1. the node process starts and registers (``nodeagent run --kubeconfig``; the kubelet configured
   like a kubeadm node and confined as controlplane/confine.py says), and is waited for Ready;
2. a Deployment of N busybox pods (``sleep 3600``, grace 2 s, the node's hostname as the node
   selector) is created in a fresh namespace; a watch of that namespace (this process, lightkube)
   notes, per pod, when it was first seen (created), bound (``spec.nodeName``) and Running with
   every container running: **create → Running** per pod is the SIG Scalability pod-startup SLI
   (density_test.go measures it from the creationTimestamp, which has whole seconds; the watch's
   first sight is used here, ~ms after the creation), **bound → Running** the node's share;
3. the Deployment is deleted (foreground): *teardown* is that delete → every pod gone from the API;
4. per system and round: the node process's CPU per pod over the start (create → all Running)
   and the stop (delete → no container running, no sandbox ready: the kubelet removes them
   with its container GC a minute later), its RSS at N, and its API requests per pod over both
   (its own rest_client_requests_total through the API server's node proxy, before and after);
5. the node process stops, whatever it left in the runtime is removed through CRI, and its Node
   object is deleted.

The table prints per N the median over the rounds of each figure, and nodeagent / kubelet.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod
from lightkube.types import on_error_retry

import devenv
from benchmarks.kubelet_peer import stop_process
from benchmarks.pod_start import (
    GRACE_SECONDS,
    empty_runtime,
    free_port,
    git_description,
    is_stopped,
    load_average,
    parse_metrics,
    proc_cpu,
    proc_mem,
)
from benchmarks.stats import median, pct
from controlplane import ControlPlane, confine
from controlplane.kubeletconfig import kubelet_config
from cri import RuntimeClient

SYSTEMS = ("nodeagent", "kubelet")
REPO = Path(__file__).resolve().parents[1]


class NodeProcess:
    """One node of the cluster, nodeagent or the kubelet, with its own dirs under ``workdir``."""

    def __init__(self, system: str, cp: ControlPlane, endpoint: str, workdir: Path) -> None:
        self.system = system
        self.cp = cp
        self.name = f"{'na' if system == 'nodeagent' else 'kl'}-{uuid.uuid4().hex[:6]}"
        self.dir = workdir / self.name
        self.dir.mkdir(parents=True)
        self.log_path = self.dir / f"{system}.log"
        self.endpoint = endpoint
        self.cgroup_root = f"/bench-kubelet-{self.name}"
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        root = self.dir / "root"
        kubeconfig = str(self.cp.node_kubeconfig(self.name))
        if self.system == "nodeagent":
            return [sys.executable, "-m", "nodeagent", "run", "--kubeconfig", kubeconfig,
                    "--container-runtime-endpoint", self.endpoint, "--node-name", self.name,
                    "--root-dir", str(root), "--pod-logs-dir", str(self.dir / "pods")]
        config = kubelet_config(endpoint=self.endpoint, pod_logs_dir=self.dir / "pods", cgroup_root=self.cgroup_root,
                                port=free_port(), healthz_port=free_port(), client_ca=self.cp.ca_file)
        path = self.dir / "kubelet-config.json"
        path.write_text(json.dumps(config, indent=1) + "\n")
        from controlplane import build as cpbuild
        return [str(cpbuild.binary("kubelet")), f"--config={path}", f"--kubeconfig={kubeconfig}",
                f"--root-dir={root}", f"--cert-dir={root / 'pki'}", f"--hostname-override={self.name}"]

    def start(self) -> None:
        argv = self.argv()
        if self.system == "kubelet":
            argv = confine.confine(argv, self.dir, self.dir / "root", self.cgroup_root)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=REPO, start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def ready(self) -> bool:
        done = self.cp.kubectl("get", "node", self.name, "-o", "json", check=False)
        if done.returncode != 0:
            return False
        conditions = json.loads(done.stdout).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def api_requests(self) -> float:
        """The sum of the node's rest_client_requests_total, through the API server's node proxy."""
        done = self.cp.kubectl("get", "--raw", f"/api/v1/nodes/{self.name}/proxy/metrics", timeout=30)
        return sum(v for (name, _), v in parse_metrics(done.stdout).items() if name == "rest_client_requests_total")

    def stop(self) -> None:
        stop_process(self.proc)

    def release(self) -> None:
        """After stop() and once the runtime is empty: what the node left on the host."""
        self.cp.kubectl("delete", "node", self.name, "--wait=false", check=False)
        from devenv.hostclean import unmount_all
        unmount_all(self.dir)
        if self.system == "kubelet":
            confine.release(self.cgroup_root)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def deployment(name: str, node: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                "containers": [{"name": "main", "image": devenv.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"]}]}},
        },
    }


class PodWatch:
    """A namespace's pods as this process's watch sees them: per pod name, when first seen,
    bound, Running (every container running) and deleted (time.monotonic())."""

    def __init__(self, api: AsyncClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.deleted: dict[str, float] = {}

    async def run(self) -> None:
        async for op, pod in self.api.watch(Pod, namespace=self.namespace, on_error=on_error_retry):
            self._saw(op, pod)

    def _saw(self, op: str, pod: Pod) -> None:
        now = time.monotonic()
        assert pod.metadata is not None and pod.metadata.name is not None
        name = pod.metadata.name
        self.seen.setdefault(name, now)
        if op == "DELETED":
            self.deleted.setdefault(name, now)
            return
        if pod.spec is not None and pod.spec.nodeName:
            self.bound.setdefault(name, now)
        status = pod.status
        if (status is not None and status.phase == "Running" and status.containerStatuses
                and all(c.state is not None and c.state.running is not None for c in status.containerStatuses)):
            self.running.setdefault(name, now)


async def until(check: Any, timeout: float, what: str, node: NodeProcess | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout:.0f}s" + (f"; {node.system} log:\n{node.tail()}" if node else ""))
        await anyio.sleep(0.1)


async def one(system: str, n: int, cp: ControlPlane, api: AsyncClient, client: RuntimeClient, endpoint: str,
              workdir: Path) -> dict[str, Any]:
    """One system at one size: start its node, run the Deployment up and down, stop it."""
    node = NodeProcess(system, cp, endpoint, workdir)
    node.start()
    try:
        await until(node.ready, 120, f"{system} node {node.name} not Ready", node)
        # A node just Ready has its start-up work (registration, the first status) behind it: the
        # figures start from here.
        await anyio.sleep(2)
        namespace = f"bench-{node.name}-{n}"
        await anyio.to_thread.run_sync(lambda: cp.kubectl("create", "namespace", namespace))
        await anyio.to_thread.run_sync(lambda: cp.wait_namespace_ready(namespace))
        watch = PodWatch(api, namespace)
        requests0 = await anyio.to_thread.run_sync(node.api_requests)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run)
            await anyio.sleep(1)  # the watch connected: a pod is seen ms after its creation
            cpu0 = proc_cpu(node.pid)
            created = time.monotonic()
            await anyio.to_thread.run_sync(lambda: cp.kubectl(
                "-n", namespace, "apply", "-f", "-", input=json.dumps(deployment("bench", node.name, n))))
            await until(lambda: len(watch.running) >= n, 60 + 2 * n, f"{n} pods Running on {system}", node)
            start_seconds = time.monotonic() - created
            cpu1 = proc_cpu(node.pid)
            rss = proc_mem(node.pid)["VmRSS"]
            deleting = time.monotonic()
            await anyio.to_thread.run_sync(lambda: cp.kubectl(
                "-n", namespace, "delete", "deployment", "bench", "--cascade=foreground", "--wait=false"))
            await until(lambda: len(watch.deleted) >= n, 60 + 2 * n, f"{n} pods deleted on {system}", node)
            teardown_seconds = time.monotonic() - deleting
            # The stop's CPU up to "nothing runs" (no running container, no ready sandbox), not
            # to an empty runtime: the kubelet leaves removal to its container GC, a minute on.
            while not is_stopped(await client.list_pod_sandbox(), await client.list_containers()):
                if time.monotonic() - deleting > 60 + 2 * n:
                    raise TimeoutError(f"{system} left containers running after its pods were deleted")
                await anyio.sleep(0.05)
            cpu2 = proc_cpu(node.pid)
            tg.cancel_scope.cancel()
        requests1 = await anyio.to_thread.run_sync(node.api_requests)
        names = sorted(watch.running)
        return {
            "system": system, "n": n, "node": node.name,
            "start_seconds": start_seconds,
            "create_to_running": [watch.running[p] - watch.seen[p] for p in names],
            "bound_to_running": [watch.running[p] - watch.bound[p] for p in names if p in watch.bound],
            "teardown_seconds": teardown_seconds,
            "cpu_ms_per_start": (cpu1 - cpu0) * 1000 / n,
            "cpu_ms_per_stop": (cpu2 - cpu1) * 1000 / n,
            "rss_mib": rss / 2**20,
            "api_requests_per_pod": (requests1 - requests0) / n,
        }
    finally:
        node.stop()
        await empty_runtime(client)
        await anyio.to_thread.run_sync(node.release)


async def run(sizes: Sequence[int], rounds: int, systems: Sequence[str], keep: bool) -> list[dict[str, Any]]:
    devenv.ensure_packages()
    archives = devenv.build_images()
    workdir = Path(tempfile.mkdtemp(prefix="na-cbench-", dir="/tmp"))
    env = devenv.Containerd(workdir / "cd")
    cp = ControlPlane(workdir / "cp")
    results: list[dict[str, Any]] = []
    try:
        env.start()
        env.import_images(archives)
        await anyio.to_thread.run_sync(cp.start)
        api = AsyncClient(config=KubeConfig.from_file(str(cp.kubeconfig_admin)))
        async with RuntimeClient(env.endpoint) as client:
            for k in range(rounds):
                order = list(systems) if k % 2 == 0 else list(reversed(systems))
                for n in sizes:
                    for system in order:
                        rec = await one(system, n, cp, api, client, env.endpoint, workdir)
                        rec["round"] = k + 1
                        results.append(rec)
                        print(f"round {k + 1} N={n} {system}: start {rec['start_seconds']:.2f}s, "
                              f"create→Running p50 {pct(rec['create_to_running'], 50):.2f}s "
                              f"p99 {pct(rec['create_to_running'], 99):.2f}s, teardown {rec['teardown_seconds']:.2f}s, "
                              f"CPU/pod start {rec['cpu_ms_per_start']:.0f} ms stop {rec['cpu_ms_per_stop']:.0f} ms, "
                              f"API requests/pod {rec['api_requests_per_pod']:.1f}", file=sys.stderr, flush=True)
        await api.close()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(cp.stop)
            env.stop()
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                print(f"kept: {workdir}", file=sys.stderr)
    return results


FIGURES = (  # key, title, digits
    ("start_seconds", "all N Running s", 2),
    ("p50", "create → Running p50 s", 2),
    ("p99", "create → Running p99 s", 2),
    ("bound_p99", "bound → Running p99 s", 2),
    ("teardown_seconds", "delete → all gone s", 2),
    ("cpu_ms_per_start", "CPU ms / pod start", 0),
    ("cpu_ms_per_stop", "CPU ms / pod stop", 0),
    ("rss_mib", "RSS at N MiB", 0),
    ("api_requests_per_pod", "API requests / pod", 1),
)


def per_round(rec: dict[str, Any]) -> dict[str, float | None]:
    out = {key: rec.get(key) for key, _, _ in FIGURES}
    out["p50"] = pct(rec["create_to_running"], 50)
    out["p99"] = pct(rec["create_to_running"], 99)
    out["bound_p99"] = pct(rec["bound_to_running"], 99)
    return out


def render(results: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"### {meta['date']} — commit {meta['commit']}, cluster mode", "",
             (f"`{meta['command']}`: {meta['cores']} cores; load average before/after {meta['load_before']} / "
              f"{meta['load_after']}; {meta['rounds']} round(s), the order of the two systems alternated; whole run "
              f"{meta['seconds']:.0f} s. Medians over the rounds; the ratio column is the median of the per-round "
              "nodeagent / kubelet ratios."), ""]
    for n in sorted({r["n"] for r in results}):
        rows = {s: [per_round(r) for r in results if r["n"] == n and r["system"] == s] for s in SYSTEMS}
        lines += [f"**N = {n}**", "", "| figure | nodeagent | kubelet | ratio |", "|---|---:|---:|---:|"]
        for key, title, digits in FIGURES:
            a = median(r[key] for r in rows["nodeagent"])
            b = median(r[key] for r in rows["kubelet"])
            ratios = [x / y for x, y in ((r[key], q[key]) for r, q in zip(rows["nodeagent"], rows["kubelet"],
                                                                             strict=False))
                      if x is not None and y]
            ratio = median(ratios) if ratios else None
            lines.append(f"| {title} | {_f(a, digits)} | {_f(b, digits)} | {_f(ratio, 2)}{'×' if ratio else ''} |")
        lines.append("")
    return "\n".join(lines)


def _f(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster_start", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,30,110", help="comma-separated pod counts (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="default %(default)s")
    parser.add_argument("--append", type=Path, help="append the Markdown result block to this file")
    parser.add_argument("--json", type=Path, help="write every measurement as JSON to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (node and containerd logs)")
    args = parser.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    if "kubelet" in systems:
        from controlplane import build as cpbuild
        if not cpbuild.is_built("kubelet"):
            cpbuild.build(["kubelet"])
    load_before, began = load_average(), time.monotonic()
    results = anyio.run(run, [int(s) for s in args.sizes.split(",")], args.rounds, systems, args.keep)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": git_description(),
            "command": "python -m benchmarks.cluster_start " + " ".join(argv), "cores": os.cpu_count(),
            "load_before": load_before, "load_after": load_average(), "seconds": time.monotonic() - began,
            "rounds": args.rounds}
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    text = render(results, meta)
    print(text)
    if args.append:
        with args.append.open("a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
