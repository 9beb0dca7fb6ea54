"""DRA end to end on the real containerd: the dra stage, plugin registration and the fake GPU
driver (drivers/fakegpu), with ResourceClaim manifests beside the pods (standalone). On
containerd 2.x the runtime applies the CDI specs (resolveCdi auto); on 1.6, which has no CDI
support of its own, nodeagent does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from cri import RuntimeClient
from cri import types as t
from devenv import Containerd
from drivers.fakegpu import DRIVER_NAME, FakeGpuDriver
from plugins.dra.state import ClaimCache, ClaimEntry
from tests.agent_helpers import AgentEnv, pod_manifest, running_agent, runtime_objects, wait_for

pytestmark = pytest.mark.anyio

PREPARE = "NodePrepareResources"
UNPREPARE = "NodeUnprepareResources"
DRA_TUNING = {"pollSeconds": 0.2, "healthCheckSeconds": 1.0}


@dataclass
class Dirs:
    registry: Path
    plugin: Path
    cdi: Path


@pytest.fixture
def dirs(containerd: Containerd) -> Iterator[Dirs]:
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    # CDI specs go where the runtime reads them (containerd 2.x resolves CDI itself);
    # the session's tests share that directory one at a time, so each leaves it empty.
    cdi = containerd.cdi_spec_dir
    try:
        yield Dirs(base / "registry", base / "plugin", cdi)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for spec in cdi.iterdir():
            spec.unlink()


def claim_manifest(name: str, *devices: str, driver: str = DRIVER_NAME,
                   reserved_for: list[dict[str, str]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": "node", "device": d} for d in devices or ("gpu0",)]}}}
    if reserved_for is not None:
        status["reservedFor"] = reserved_for
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}},
            "status": status}


def gpu_pod(name: str, claim: str, command: str = "sleep 3600", **spec: Any) -> dict[str, Any]:
    container = {"resources": {"claims": [{"name": "gpu"}]}, **spec.pop("container", {})}
    return pod_manifest(name, command, resourceClaims=[{"name": "gpu", "resourceClaimName": claim}],
                        container=container, **spec)


def driver_for(dirs: Dirs, claims_dir: Path, **kw: Any) -> FakeGpuDriver:
    return FakeGpuDriver(registry_dir=dirs.registry, plugin_dir=dirs.plugin, cdi_dir=dirs.cdi, claims_dir=claims_dir,
                         **kw)


@asynccontextmanager
async def serving(driver: FakeGpuDriver) -> AsyncIterator[FakeGpuDriver]:
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        yield driver
        tg.cancel_scope.cancel()


@asynccontextmanager
async def dra_agent(containerd: Any, tmp_path: Path, dirs: Dirs, **dra: Any) -> AsyncIterator[AgentEnv]:
    async with running_agent(containerd, tmp_path, plugins_registry_dir=dirs.registry, cdi_spec_dirs=[dirs.cdi],
                             plugins={"dra": {**DRA_TUNING, **dra}}) as env:
        yield env


def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "manifests"
    path.mkdir(exist_ok=True)
    return path


def registered(env: AgentEnv) -> list[str]:
    return [d["name"] for d in env.agent.plugins_info()["stages"]["dra"]["drivers"]]


def checkpoint(env: AgentEnv) -> ClaimCache:
    cache = ClaimCache(env.config.root_dir / "dra_manager_state")
    cache.load()
    return cache


async def exec_in(env: AgentEnv, pod: str, script: str) -> str:
    container = await env.wait_running(pod)
    result = await env.client.exec_sync(container.id, ["sh", "-c", script], timeout=10)
    assert result.exit_code == 0, result
    return result.stdout.decode()


async def calls(driver: FakeGpuDriver, method: str, at_least: int, uid: str | None = None) -> None:
    await wait_for(lambda: _true(driver.count(method, uid) >= at_least), 30, f"{at_least} {method} call(s)")


async def _true(value: bool) -> bool:
    return value


async def _len_is(items: Awaitable[list[Any]], n: int) -> bool:
    return len(await items) == n


# --- the device reaches the container -----------------------------------------------------


async def test_claimed_device_mount_and_env_are_visible_inside_the_container(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    async with serving(driver_for(dirs, manifests(tmp_path))) as driver, \
            dra_agent(containerd, tmp_path, dirs) as env:
        await wait_for(lambda: _true(registered(env) == [DRIVER_NAME] and bool(driver.registrations)), 10,
                       "the driver registered and told so")
        assert driver.registrations == [(True, "")]
        env.write("gpu.yaml", claim_manifest("gpu-claim", "gpu1"), gpu_pod("gpu", "gpu-claim"))
        out = await exec_in(env, "gpu", "test -c /dev/fakegpu1 && echo data > /dev/fakegpu1 && "
                                        "cat /var/run/fakegpu/gpu1/info && echo \"$GPU_DEVICE_1 $FAKE_GPU_CLAIM\" && "
                                        "! touch /var/run/fakegpu/gpu1/x 2>/dev/null")
        assert "device=gpu1\nclaim=default/gpu-claim\n" in out
        assert out.endswith("gpu1 default/gpu-claim\n")
        [uid] = driver.prepared()
        [entry] = checkpoint(env).entries.values()
        assert (entry.uid, entry.prepared, entry.pod_uids) == (uid, True, {env.uid_of("gpu")})
        assert [d.cdi_device_ids for d in entry.devices()] == [(f"nodeagent.example/gpu={uid}-gpu1",)]
        assert env.status_of("gpu").get("reason") is None
        # resolveCdi auto: containerd 2.x is given the CDI device names and applies the spec
        # itself; on 1.6 the agent applied it, and the config names no CDI device.
        container = await env.wait_running("gpu")
        _, info = await env.client.container_status(container.id, verbose=True)
        config = json.loads(info["info"])["config"]
        named = [d.get("name") for d in config.get("CDI_devices") or []]
        version = env.client.runtime_version
        assert version is not None
        if int(version.runtime_version.lstrip("v").split(".")[0]) >= 2:
            assert named == [f"nodeagent.example/gpu={uid}-gpu1"], config
            assert not config.get("devices"), config  # none of the agent's own
        else:
            assert named == [] and config.get("devices"), config

        env.remove("gpu.yaml")
        await calls(driver, UNPREPARE, 1)
        await env.wait_empty()
        assert driver.prepared() == [] and checkpoint(env).entries == {}
        assert driver.count(PREPARE) == 1


async def test_shared_claim_is_prepared_once_and_unprepared_after_its_last_pod(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    async with serving(driver_for(dirs, manifests(tmp_path))) as driver, \
            dra_agent(containerd, tmp_path, dirs) as env:
        await wait_for(lambda: _true(registered(env) == [DRIVER_NAME]), 10, "the driver registered")
        env.write("claim.yaml", claim_manifest("shared"))
        env.write("a.yaml", gpu_pod("a", "shared"))
        env.write("b.yaml", gpu_pod("b", "shared"))
        for pod in ("a", "b"):
            assert "gpu0" in await exec_in(env, pod, "cat /var/run/fakegpu/gpu0/info")
        [uid] = driver.prepared()
        assert driver.count(PREPARE, uid) == 1
        assert checkpoint(env).entries[uid].pod_uids == {env.uid_of("a"), env.uid_of("b")}

        env.remove("a.yaml")
        await wait_for(lambda: _true(env.uid_of("a") is None), 30, "pod a gone")
        assert driver.count(UNPREPARE) == 0, "unprepared while pod b still uses the claim"
        assert "gpu0" in await exec_in(env, "b", "cat /var/run/fakegpu/gpu0/info")
        assert checkpoint(env).entries[uid].pod_uids == {env.uid_of("b")}

        env.remove("b.yaml")
        await calls(driver, UNPREPARE, 1, uid)
        # The checkpoint is written once the driver's answer is back: a moment after the call.
        await wait_for(lambda: _true(checkpoint(env).entries == {}), 10, "the claim gone from the checkpoint")
        assert driver.prepared() == []


async def test_unprepare_waits_until_every_container_of_the_pod_stopped(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    seen: list[list[str]] = []
    driver = driver_for(dirs, manifests(tmp_path))
    async with serving(driver), dra_agent(containerd, tmp_path, dirs) as env:
        async def check(uids: list[str]) -> None:
            _, containers = await runtime_objects(env.client, env.node)
            seen.append([c.metadata.name for c in containers if c.metadata
                         and c.state == t.ContainerState.CONTAINER_RUNNING])

        driver.on_unprepare = check
        # Both containers ignore SIGTERM (PID 1 without a handler): they run for the whole
        # grace period, then are killed. Devices go only after both stopped.
        pod = gpu_pod("stubborn", "c", command="trap '' TERM; while true; do sleep 0.2; done",
                      terminationGracePeriodSeconds=3)
        pod["spec"]["containers"].append({"name": "other", "image": pod["spec"]["containers"][0]["image"],
                                          "command": ["sleep", "3600"], "resources": {"claims": [{"name": "gpu"}]}})
        env.write("stubborn.yaml", claim_manifest("c"), pod)
        await wait_for(lambda: _len_is(env.running_containers("stubborn"), 2), 30, "both containers running")
        assert len(driver.prepared()) == 1
        env.remove("stubborn.yaml")
        await calls(driver, UNPREPARE, 1)

        async def checked() -> bool:  # the driver records the call before its check has listed
            return bool(seen)

        await wait_for(checked, 30, "the driver's look at the runtime when asked to unprepare")
        assert seen == [[]], f"containers still running when the claim was unprepared: {seen}"


# --- drivers that are missing, failing, restarting ----------------------------------------


async def test_pod_waits_for_an_unregistered_driver_then_starts(containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    async with dra_agent(containerd, tmp_path, dirs) as env:
        env.write("late.yaml", claim_manifest("late-claim"), gpu_pod("late", "late-claim"))

        async def waiting_reason() -> bool:
            status = env.status_of("late")
            return status.get("reason") == "FailedPrepareDynamicResources" and \
                f"DRA driver {DRIVER_NAME} is not registered" in status.get("message", "")

        await wait_for(waiting_reason, 30, "the pod waiting for the driver, with the kubelet's reason")
        assert env.status_of("late")["phase"] == "Pending"
        env.write("plain.yaml", pod_manifest("plain"))  # nothing else on the node waits for the driver
        await env.wait_running("plain")
        assert await env.running_containers("late") == []
        async with serving(driver_for(dirs, manifests(tmp_path))) as driver:
            await env.wait_running("late", timeout=60)
            assert driver.count(PREPARE) == 1
            await wait_for(lambda: _true("reason" not in env.status_of("late")), 10, "the reason cleared")
            env.remove("late.yaml")
            await calls(driver, UNPREPARE, 1)


async def test_failing_driver_shows_its_error_retries_and_leaks_nothing(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    driver = driver_for(dirs, manifests(tmp_path), fail="prepare")
    async with serving(driver), dra_agent(containerd, tmp_path, dirs) as env:
        env.write("bad.yaml", claim_manifest("bad-claim"), gpu_pod("bad", "bad-claim"))
        await calls(driver, PREPARE, 2)  # retried with back-off
        message = env.status_of("bad").get("message", "")
        assert env.status_of("bad")["reason"] == "FailedPrepareDynamicResources"
        assert "NodePrepareResources failed for ResourceClaim default/bad-claim: fake failure" in message
        [entry] = checkpoint(env).entries.values()
        assert not entry.prepared and await env.running_containers("bad") == []
        # Deleted while failing: the driver is still told to unprepare (it may have half-done
        # something), and nothing stays recorded.
        env.remove("bad.yaml")
        await calls(driver, UNPREPARE, 1, entry.uid)
        await env.wait_empty()
        assert checkpoint(env).entries == {} and driver.prepared() == []

        # A whole-call failure, then the driver recovers: the pod starts.
        driver.fail = "prepare-rpc"
        env.write("flaky.yaml", claim_manifest("flaky-claim"), gpu_pod("flaky", "flaky-claim"))
        await wait_for(lambda: _true("NodePrepareResources: INTERNAL" in env.status_of("flaky").get("message", "")),
                       30, "the driver's gRPC error in the pod's status")
        driver.fail = "none"
        assert "gpu0" in await exec_in(env, "flaky", "cat /var/run/fakegpu/gpu0/info")


async def test_driver_killed_and_restarted_registers_again_and_pods_keep_working(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    log = tmp_path / "calls.jsonl"

    def start_driver() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "drivers.fakegpu", "--registry-dir", str(dirs.registry), "--plugin-dir",
             str(dirs.plugin), "--cdi-dir", str(dirs.cdi), "--claims-dir", str(manifests(tmp_path)),
             "--call-log", str(log)],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "driver.log", "ab"))

    def logged(method: str) -> int:
        """How many claims the driver got ``method`` for (one call may carry several)."""
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return sum(len(c["uids"]) for c in calls if c["method"] == method)

    async with dra_agent(containerd, tmp_path, dirs) as env:
        driver = start_driver()
        try:
            await wait_for(lambda: _true(registered(env) == [DRIVER_NAME]), 30, "the driver registered")
            env.write("one.yaml", claim_manifest("one"), gpu_pod("one", "one"))
            await exec_in(env, "one", "test -c /dev/fakegpu0")
            driver.send_signal(signal.SIGKILL)  # no clean-up: its sockets stay behind, dead
            driver.wait(10)
            await wait_for(lambda: _true(registered(env) == []), 30, "the dead driver deregistered")
            await exec_in(env, "one", "test -c /dev/fakegpu0 && cat /var/run/fakegpu/gpu0/info")

            driver = start_driver()
            await wait_for(lambda: _true(registered(env) == [DRIVER_NAME]), 30, "the driver registered again")
            env.write("two.yaml", claim_manifest("two", "gpu2"), gpu_pod("two", "two"))
            await exec_in(env, "two", "test -c /dev/fakegpu2")
            await exec_in(env, "one", "test -c /dev/fakegpu0")
            assert logged(PREPARE) == 2
            env.remove("one.yaml")
            env.remove("two.yaml")
            await wait_for(lambda: _true(logged(UNPREPARE) == 2), 30, "both claims unprepared")
        finally:
            driver.send_signal(signal.SIGTERM)
            driver.wait(10)


async def test_agent_killed_and_restarted_neither_prepares_twice_nor_forgets_to_unprepare(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    node = f"dra{os.getpid() % 10000}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "nodeName": node, "staticPodPath": str(manifests(tmp_path)), "containerRuntimeEndpoint": containerd.endpoint,
        "rootDir": str(tmp_path / "root"), "podLogsDir": str(tmp_path / "logs"),
        "containerLogsSymlinkDir": str(tmp_path / "containers"), "healthzPort": port,
        "pluginsRegistryDir": str(dirs.registry), "cdiSpecDirs": [str(dirs.cdi)], "plugins": {"dra": DRA_TUNING}}))

    def start_agent() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "nodeagent", "run", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "ab"))

    def pod_row() -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/pods", timeout=2) as resp:
                rows = json.loads(resp.read())
        except OSError:
            return {}
        return next((r for r in rows if r["name"] == f"keep-{node}"), {})

    def pod_state() -> str:
        return str(pod_row().get("state", ""))

    def pod_reason() -> str:
        return str(pod_row().get("reason", ""))

    async def state_is(wanted: str) -> bool:
        return await anyio.to_thread.run_sync(pod_state) == wanted

    first = driver_for(dirs, manifests(tmp_path))
    async with RuntimeClient(containerd.endpoint) as client:
        (manifests(tmp_path) / "keep.yaml").write_text(
            yaml.safe_dump_all([claim_manifest("keep-claim"), gpu_pod("keep", "keep-claim")]))
        agent = start_agent()
        try:
            async with serving(first):
                await wait_for(lambda: state_is("Running"), 60, "the pod running")
                [uid] = first.prepared()
                agent.send_signal(signal.SIGKILL)
                agent.wait(10)
            # The driver is down too when the agent comes back: the running pod's claim is
            # adopted from the checkpoint, without a driver call, hence without the driver.
            agent = start_agent()
            await wait_for(lambda: state_is("Running"), 60, "the pod adopted by the restarted agent")
            await anyio.sleep(1)  # the adopted pod's setup ran; a second prepare would show now
            assert await anyio.to_thread.run_sync(pod_reason) == ""
            sandboxes, _ = await runtime_objects(client, node)
            assert len(sandboxes) == 1
            async with serving(driver_for(dirs, manifests(tmp_path))) as second:
                await wait_for(lambda: _true(bool(second.registrations)), 30, "the driver registered")
                assert first.count(PREPARE) + second.count(PREPARE) == 1, "the restarted agent prepared again"
                listing = await anyio.run_process([sys.executable, "-m", "nodeagent", "plugins", "--config",
                                                   str(config)])
                assert f'"name": "{DRIVER_NAME}"' in listing.stdout.decode(), "`nodeagent plugins` lists the driver"

                (manifests(tmp_path) / "keep.yaml").unlink()
                await calls(second, UNPREPARE, 1, uid)

                async def empty() -> bool:
                    sandboxes, containers = await runtime_objects(client, node)
                    return not sandboxes and not containers

                await wait_for(empty, 60, "the pod torn down")
                assert second.prepared() == [] and first.count(UNPREPARE) + second.count(UNPREPARE) == 1
        finally:
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
            for sandbox in (await runtime_objects(client, node))[0]:
                await client.stop_pod_sandbox(sandbox.id)
                await client.remove_pod_sandbox(sandbox.id)


async def test_claims_left_by_pods_gone_while_the_agent_was_down_are_unprepared(
        containerd: Any, tmp_path: Path, dirs: Dirs) -> None:
    # What a previous agent checkpointed for a pod that is gone from the runtime and from the
    # manifests: only the reconcile loop can find it.
    left = ClaimCache(tmp_path / "root" / "dra_manager_state")
    left.entries["old-uid"] = ClaimEntry("old-uid", "old", "default", {"vanished-pod"}, {DRIVER_NAME: []},
                                         prepared=True)
    left.save()
    async with serving(driver_for(dirs, manifests(tmp_path))) as driver, \
            dra_agent(containerd, tmp_path, dirs, reconcilePeriodSeconds=0.5) as env:
        await calls(driver, UNPREPARE, 1, "old-uid")
        await wait_for(lambda: _true(checkpoint(env).entries == {}), 10, "the checkpoint emptied")


# --- the stage contract ----------------------------------------------------------------------


# The stage contract for dra runs in tests/test_contract.py (TestDraContract), with this fake driver.
