"""Secrets stay private (issue 13 §5): after a run with secrets — in env (secretKeyRef, envFrom,
an inline value), in a secret volume and a projected token — none of their values is in the
agent's logs, the Events, the pods' statuses, the trace (in memory and its file), the local
endpoint's /pods or the status files; and no other user of the host can read the files that
hold them: rootDir, its pods directory and the pod's directory are 0750, the secret volume's
tmpfs is mounted with mode 0755 (not tmpfs's world-writable 1777).

Against the real control plane and containerd, through the production path (tests/test_apivolumes).
"""

from __future__ import annotations

import base64
import json
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from tests.agent_helpers import BUSYBOX_IMAGE
from tests.test_apivolumes import cluster_node

pytestmark = pytest.mark.anyio


def _as_nobody(*command: str) -> subprocess.CompletedProcess[str]:
    """``command`` as uid/gid 65534 (nobody), no supplementary groups: any other user of the host."""
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command],
                          capture_output=True, text=True, check=False)


async def test_secret_values_reach_only_the_pod(containerd: Any, control_plane: Any, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    secret_value, inline_value = f"s3cr3t-{marker}", f"inline-{marker}"
    with structlog.testing.capture_logs() as logs:
        async with cluster_node(containerd, control_plane, tmp_path, ) as node:
            await node.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"creds-{marker[:8]}"},
                               "data": {"password": base64.b64encode(secret_value.encode()).decode()}})
            secret = f"creds-{marker[:8]}"
            pod = await node.run_pod(
                "private", {
                    "name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                    "env": [{"name": "INLINE", "value": inline_value},
                            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}}],
                    "envFrom": [{"prefix": "ALL_", "secretRef": {"name": secret}}],
                    "volumeMounts": [{"name": "creds", "mountPath": "/creds"},
                                     {"name": "token", "mountPath": "/token"}]},
                volumes=[{"name": "creds", "secret": {"secretName": secret}},
                         {"name": "token", "projected": {"sources": [
                             {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]}}])
            uid = pod["metadata"]["uid"]
            # The pod gets them.
            assert await node.output(uid, "main", "cat", "/creds/password") == secret_value
            env = await node.output(uid, "main", "env")
            assert f"FROM_SECRET={secret_value}" in env and f"ALL_password={secret_value}" in env
            assert f"INLINE={inline_value}" in env
            token = await node.output(uid, "main", "cat", "/token/token")
            assert token.count(".") == 2

            agent = node.env.agent
            root = node.env.config.root_dir
            pod_dir = root / "pods" / uid
            secret_dir = pod_dir / "volumes" / "kubernetes.io~secret" / "creds"
            # No other user of the host reaches them.
            for directory in (root, root / "pods", pod_dir):
                mode = stat.S_IMODE(directory.stat().st_mode)
                assert mode & 0o007 == 0, f"{directory} is {oct(mode)}: other users can reach into it"
            for path in (secret_dir / "password", pod_dir / "volumes" / "kubernetes.io~projected" / "token" / "token"):
                assert path.read_text() in (secret_value, token)
                denied = await anyio.to_thread.run_sync(_as_nobody, "cat", str(path))
                assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
            mount = next(line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                         if f" {secret_dir} " in line)
            assert "mode=755" in mount, mount

            # What the agent and the API show about the pod names nothing of them.
            status = json.loads(await node.kubectl("get", "pod", "private", "-o", "json"))["status"]
            events = await node.kubectl("get", "events", "-A", "-o", "json")
            shown = {
                "status": json.dumps(status),
                "events": events,
                "trace": json.dumps(agent.trace.chain(uid)),
                "local /pods": json.dumps(agent.pods_table()),
                "status files": "".join(p.read_text() for p in (root / "pod-status").glob("*.json")),
            }
            assert "PodSpecObserved" in shown["trace"], "the trace has the pod's story"

    shown["logs"] = "\n".join(json.dumps(entry, default=str) for entry in logs)
    assert len(logs) > 20, "the agent's logs were captured"
    for where, text in shown.items():
        for value in (secret_value, inline_value, token, base64.b64encode(secret_value.encode()).decode()):
            assert value not in text, f"a secret value is in the {where}"
