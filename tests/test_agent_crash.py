"""An agent killed with SIGKILL in the middle of starting pods, then restarted: every pod ends
with exactly one sandbox and one container; nothing is leaked or duplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from cri import RuntimeClient
from cri import types as t
from nodeagent import labels as L
from tests.agent_helpers import pod_manifest, runtime_objects, wait_for

pytestmark = pytest.mark.anyio

PODS = 20


def _start_agent(base: Path, endpoint: str, node: str) -> subprocess.Popen[bytes]:
    log = open(base / f"agent-{len(list(base.glob('agent-*.log')))}.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "nodeagent", "run", "--static-pod-path", str(base / "manifests"),
         "--container-runtime-endpoint", endpoint, "--node-name", node, "--root-dir", str(base / "root"),
         "--pod-logs-dir", str(base / "logs"), "--healthz-port", "0"],
        stdout=log, stderr=subprocess.STDOUT,
    )


async def test_sigkill_mid_start_then_restart_leaves_no_duplicates(containerd: Any, tmp_path: Path) -> None:
    node = f"crash{os.getpid() % 10000}"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for i in range(PODS):
        (manifests / f"p{i:02}.json").write_text(json.dumps(pod_manifest(f"p{i:02}")))

    async with RuntimeClient(containerd.endpoint) as client:
        agent = _start_agent(tmp_path, containerd.endpoint, node)
        try:
            async def some_sandboxes() -> bool:
                sandboxes, _ = await runtime_objects(client, node)
                return len(sandboxes) >= 3

            await wait_for(some_sandboxes, timeout=60, what="the agent to start creating sandboxes")
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
            sandboxes, containers = await runtime_objects(client, node)
            assert len(sandboxes) < PODS or len(containers) < PODS, "killed too late to test anything"

            agent = _start_agent(tmp_path, containerd.endpoint, node)

            async def all_running() -> bool:
                _, containers = await runtime_objects(client, node)
                return sum(c.state == t.ContainerState.CONTAINER_RUNNING for c in containers) >= PODS

            await wait_for(all_running, timeout=120, what=f"{PODS} running containers after the restart")
            await anyio.sleep(2)  # give a duplicate, if any, the time to appear
            sandboxes, containers = await runtime_objects(client, node)
            per_pod = Counter(s.metadata.uid for s in sandboxes if s.metadata)
            assert len(per_pod) == PODS and set(per_pod.values()) == {1}, per_pod
            per_container = Counter(c.labels[L.POD_UID] for c in containers)
            details = sorted((c.labels[L.POD_UID][:6], c.metadata.attempt if c.metadata else -1, c.state.name,
                              c.created_at) for c in containers)
            if set(per_container.values()) != {1}:
                dump = []
                for c in containers:
                    st = await client.container_status(c.id)
                    dump.append([c.labels[L.POD_UID][:6], st.metadata.attempt, st.state.name, st.exit_code, st.reason,
                                 st.message, st.created_at, st.started_at, st.finished_at])
                (tmp_path / "containers.json").write_text(json.dumps(sorted(dump), indent=1))
            assert len(per_container) == PODS and set(per_container.values()) == {1}, details
            assert all(c.state == t.ContainerState.CONTAINER_RUNNING for c in containers)
        finally:
            for f in manifests.iterdir():
                f.unlink()
            if agent.poll() is None:
                async def empty() -> bool:
                    sandboxes, containers = await runtime_objects(client, node)
                    return not sandboxes and not containers

                await wait_for(empty, timeout=120, what="teardown of every pod")
                agent.send_signal(signal.SIGTERM)
                agent.wait(10)
