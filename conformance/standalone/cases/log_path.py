"""test/e2e_node/log_path_test.go: ``[sig-node] ContainerLogPath [NodeConformance]``.

BeforeEach: pod ``log-pod-<uuid>`` with container ``logger`` echoing a known line
(restartPolicy Never) must succeed. Upstream then runs a checker pod that mounts the expected
host file (hostPath) and greps it; the port reads the host file directly. The directories are
the agent's ``podLogsDir`` and symlink directory, the kubelet's /var/log/pods and
/var/log/containers.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio

from conformance.standalone.framework import (
    BUSYBOX,
    POD_START,
    Framework,
    case,
    container_status,
)
from plugins.logs import LogsConfig

FILE = "test/e2e_node/log_path_test.go"
PREFIX = "[sig-node] ContainerLogPath [NodeConformance] Pod with a container printed log to stdout"
FRAMEWORK = "kubelet-container-log-path"
LOG_STRING = "This is the expected log content of this node e2e test"


async def create_log_pod(f: Framework) -> str:
    pod_name = f"log-pod-{uuid.uuid4()}"
    name = f.create({"metadata": {"name": pod_name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "logger", "image": BUSYBOX, "command": ["sh", "-c", f"echo {LOG_STRING}"]}],
    }})
    await f.wait_success(name)
    return name


async def expect_log_in(path: Path, timeout: float = POD_START) -> None:
    """The checker pod's loop: the file exists and contains the line."""
    with anyio.move_on_after(timeout):
        while True:
            try:
                if LOG_STRING in path.read_text(errors="replace"):
                    return
            except OSError:
                pass
            await anyio.sleep(1.0)
    raise AssertionError(f"{path} does not exist or does not contain {LOG_STRING!r} after {timeout:g}s")


@case(f"{PREFIX} should print log to correct cri log path",
      key="LP2", number="39", upstream=FILE, framework=FRAMEWORK, timeout=2 * POD_START + 60)
async def cri_log_path(f: Framework) -> None:
    """Mirrors "should print log to correct cri log path": the log must be in
    ``<podLogsDir>/<ns>_<pod>_<uid>/logger/0.log``. Port: the host file is read directly
    instead of through a checker pod."""
    name = await create_log_pod(f)
    path = (Path(f.node.config.kubelet.pod_logs_dir) / f"{f.namespace}_{f.pod_name(name)}_{f.uid(name)}" / "logger" / "0.log")
    await expect_log_in(path)


@case(f"{PREFIX} should print log to correct log path",
      key="LP1", number="39a", upstream=FILE, framework=FRAMEWORK, timeout=2 * POD_START + 60)
async def legacy_log_path(f: Framework) -> None:
    """Mirrors "should print log to correct log path": the log must be reachable at
    ``/var/log/containers/<pod>_<ns>_logger-<containerID>.log`` (the container ID from the status
    without ``containerd://``). Port: the agent's symlink directory stands for
    /var/log/containers; the host file is read directly instead of through a checker pod."""
    name = await create_log_pod(f)
    cs = container_status(f.get(name), "logger") or {}
    container_id = cs.get("containerID", "").removeprefix("containerd://")
    if not container_id:
        raise AssertionError(f"the logger container has no containerID: {cs}")
    links = LogsConfig.model_validate(f.node.config.plugins.get("logs", {})).container_logs_symlink_dir
    path = links / f"{f.pod_name(name)}_{f.namespace}_logger-{container_id}.log"
    await expect_log_in(path)
