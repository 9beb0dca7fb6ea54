"""Bidirectional mount propagation on the real runtime: a mount a privileged container makes in
an emptyDir reaches the host and the pod's other containers, as on a kubelet node (whose root
directory the kubelet makes rshared; these machines' mounts are all private)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent import mounttable
from tests.agent_helpers import BUSYBOX_IMAGE, running_agent, wait_for

pytestmark = pytest.mark.anyio


def _container(name: str, command: str, propagation: str, privileged: bool = False) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX_IMAGE, "command": ["sh", "-euxc", command],
            "securityContext": {"privileged": privileged},
            "volumeMounts": [{"name": "mnt", "mountPath": "/mnt", "mountPropagation": propagation}]}


async def test_a_bidirectional_mount_reaches_the_host_and_the_other_containers(containerd: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
        "initContainers": [
            _container("mount", "mkdir -p /mnt/t && mount -t tmpfs none /mnt/t && echo hi > /mnt/t/f",
                       "Bidirectional", privileged=True),
            # Another container sees the mount the first made (it came back through the host).
            _container("test", "grep -q hi /mnt/t/f", "HostToContainer"),
            _container("unmount", "umount /mnt/t", "Bidirectional", privileged=True)],
        "containers": [_container("main", "sleep 3600", "None")],
        "volumes": [{"name": "mnt", "emptyDir": {}}]}}
    try:
        async with running_agent(containerd, tmp_path) as env:
            assert not mounttable.is_shared(root)  # nothing asked for it yet
            env.write("p.yaml", pod)
            async def main_running() -> dict[str, Any] | None:
                status = env.status_of("p")
                if status.get("phase") == "Failed":
                    return status
                running = any("running" in c["state"] for c in status.get("containerStatuses", []))
                return status if running else None

            status = await wait_for(main_running, 60, "the main container running, or the pod failed")
            inits = {s["name"]: s["state"] for s in status["initContainerStatuses"]}
            assert all(state.get("terminated", {}).get("exitCode") == 0 for state in inits.values()), inits
            assert mounttable.is_shared(root)
    finally:
        if mounttable.is_mount_point(root):
            mounttable.detach(root)
