"""README's main command: nodeagent on a private containerd, running the example pods.

Brings up the devenv containerd (installing packages and images when missing), starts
``nodeagent run`` on a copy of examples/pods, shows the pods as they come up, fetches the web
server's page through its pod IP and prints the job's log. With --seconds N it stops after N
seconds and tears the pods down; otherwise it runs until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import devenv

HERE = Path(__file__).resolve().parent
WORK = Path("/tmp/nodeagent-demo")
PORT = 10348


def nodeagent(*args: str) -> list[str]:
    return [sys.executable, "-m", "nodeagent", *args]


def pods() -> list[dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/pods", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until Ctrl-C)")
    args = parser.parse_args()

    env = devenv.up()  # the runtime $NODEAGENT_RUNTIME selects: containerd 2.x unless containerd1.6
    version = env.version()
    print(f"containerd: {env.runtime.name} ({version.get('runtime_name')} {version.get('runtime_version')}) "
          f"at {env.endpoint} (log {env.log_path})")
    manifests = WORK / "manifests"
    shutil.rmtree(manifests, ignore_errors=True)
    manifests.mkdir(parents=True)
    for f in sorted((HERE / "pods").glob("*.yaml")):
        shutil.copy(f, manifests / f.name)
    log = open(WORK / "agent.log", "w")
    agent = subprocess.Popen(
        nodeagent("run", "--static-pod-path", str(manifests), "--container-runtime-endpoint", env.endpoint,
                  "--node-name", "demo", "--root-dir", str(WORK / "root"), "--pod-logs-dir", str(WORK / "logs"),
                  "--healthz-port", str(PORT)),
        stdout=log, stderr=subprocess.STDOUT,
    )
    print(f"nodeagent started (pid {agent.pid}, log {WORK / 'agent.log'})")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = {r["name"]: r for r in pods()}
            if rows.get("web-demo", {}).get("phase") == "Running" and rows.get("job-demo", {}).get("phase") == "Succeeded" \
                    and rows.get("pair-demo", {}).get("phase") == "Running":
                break
            time.sleep(0.5)
        subprocess.run(nodeagent("pods", "--healthz-port", str(PORT)), check=False)
        web = next((r for r in pods() if r["name"] == "web-demo"), None)
        if web and web["podIP"]:
            with urllib.request.urlopen(f"http://{web['podIP']}:8080/", timeout=5) as r:
                print(f"\nGET http://{web['podIP']}:8080/ -> {r.read().decode().strip()!r}")
        for row in pods():
            if row["name"] == "job-demo":
                logdir = WORK / "logs" / f"default_job-demo_{row['uid']}" / "count"
                print(f"\njob log ({logdir}/0.log, CRI format):")
                print((logdir / "0.log").read_text(), end="")
        print(f"\nnodeagent trace web-demo --healthz-port {PORT}   # the causal chain of one pod")
        if args.seconds:
            time.sleep(args.seconds)
        else:
            print("running; Ctrl-C stops the agent and removes the pods")
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        for f in manifests.iterdir():
            f.unlink()
        deadline = time.monotonic() + 60
        while pods() and time.monotonic() < deadline:
            time.sleep(0.5)
        agent.terminate()
        agent.wait(10)
        print("pods removed, agent stopped (containerd keeps running: `make down` stops it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
