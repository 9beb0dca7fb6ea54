"""A DRA driver that goes silent with a NodePrepareResources in flight (found by the gang end to
end, issue 20: one of eight agents stopped dead when its driver was slow).

The driver process is stopped (SIGSTOP: its sockets stay, nothing answers) before a pod with a
claim arrives: the prepare call hangs, two GetInfo health checks go unanswered, the driver is
deregistered and its channel closed under the call. grpc.aio cancels a call in flight on a closed
channel with asyncio.CancelledError; before plugins/dra/api.py turned that into the call's own
failure, the CancelledError ended the agent's task group quietly: the process stayed up, idle,
logging nothing, renewing no Lease and starting no pod. Real containerd, the fake GPU driver as a
process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from drivers.fakegpu import DRIVER_NAME
from tests.agent_helpers import pod_manifest, wait_for
from tests.test_dra import (  # noqa: F401 - dirs is a fixture
    Dirs,
    _true,
    claim_manifest,
    dirs,
    dra_agent,
    gpu_pod,
    manifests,
    registered,
)

pytestmark = pytest.mark.anyio


def start_driver(dirs: Dirs, tmp_path: Path) -> subprocess.Popen[bytes]:  # noqa: F811
    with (tmp_path / "driver.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "drivers.fakegpu", "--registry-dir", str(dirs.registry), "--plugin-dir",
             str(dirs.plugin), "--cdi-dir", str(dirs.cdi), "--claims-dir", str(manifests(tmp_path))],
            stdout=subprocess.DEVNULL, stderr=log)


async def test_a_driver_silent_mid_prepare_is_deregistered_and_the_agent_carries_on(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:  # noqa: F811
    async with dra_agent(containerd, tmp_path, dirs) as env:
        driver = start_driver(dirs, tmp_path)
        try:
            await wait_for(lambda: _true(registered(env) == [DRIVER_NAME]), 30, "the driver registered")
            driver.send_signal(signal.SIGSTOP)
            env.write("held.yaml", claim_manifest("held"), gpu_pod("held", "held"))
            await wait_for(lambda: _true(registered(env) == []), 30, "the silent driver deregistered")
            # The agent carries on: a pod without claims starts, the held one waits with the reason.
            env.write("plain.yaml", pod_manifest("plain"))
            await env.wait_running("plain", 60)

            async def held_waiting() -> bool:
                status = env.status_of("held")
                return (status.get("reason") == "FailedPrepareDynamicResources"
                        and f"DRA driver {DRIVER_NAME} is not registered" in status.get("message", ""))

            await wait_for(held_waiting, 30, "the held pod waiting for its driver, the reason in its status")
        finally:
            driver.send_signal(signal.SIGCONT)
            driver.kill()
            driver.wait(10)


async def test_a_pod_deleted_with_its_prepare_in_flight_leaves_the_agent_working(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:  # noqa: F811
    """The wedged agent of the gang's chaos runs: the pod is deleted while NodePrepareResources is
    in flight, so the deletion cancels the worker's setup around the call. grpc.aio answers with a
    bare CancelledError that the setup's cancel scope does not take for its own; before
    cri/grpcaio.py it went on up and cancelled the agent's task group without a word (no pod
    handled again). Now the scope stops it, the pod is torn down once the driver answers again,
    and other pods start meanwhile."""
    # No deregistration during the test: the call must still be in flight when the pod goes.
    async with dra_agent(containerd, tmp_path, dirs, healthCheckSeconds=600) as env:
        driver = start_driver(dirs, tmp_path)
        try:
            await wait_for(lambda: _true(registered(env) == [DRIVER_NAME]), 30, "the driver registered")
            driver.send_signal(signal.SIGSTOP)
            env.write("held.yaml", claim_manifest("held"), gpu_pod("held", "held"))
            dra = env.agent.pipeline.stages["dra"] if env.agent.pipeline else None

            def preparing() -> bool:
                uid = env.uid_of("held")
                return bool(uid) and uid in getattr(dra, "_active", set())

            await wait_for(lambda: _true(preparing()), 30, "the held pod's claims being prepared")
            await anyio.sleep(1.0)  # the call reaches the stopped driver and waits there
            env.remove("held.yaml")
            await anyio.sleep(0.5)
            env.write("plain.yaml", pod_manifest("plain"))
            await env.wait_running("plain", 60)
            assert registered(env) == [DRIVER_NAME]
            driver.send_signal(signal.SIGCONT)

            async def held_gone() -> bool:
                return env.uid_of("held") is None and not any(
                    c for c in await env.running_containers("held"))

            await wait_for(held_gone, 90, "the deleted pod torn down once the driver answers")
        finally:
            driver.send_signal(signal.SIGCONT)
            driver.kill()
            driver.wait(10)
