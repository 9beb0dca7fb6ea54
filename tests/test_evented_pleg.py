"""Evented relisting (issue 15 §2): on a runtime that streams container events (containerd
2.x), a container's exit reaches the agent at once rather than at the next periodic relist; on
one that does not (containerd 1.6), periodic relisting carries on, said once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from cri import types as t
from nodeagent import labels as L
from tests.agent_helpers import BUSYBOX_IMAGE, CountingRuntime, pod_manifest, running_agent, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.containerd]


async def test_an_exit_is_seen_without_waiting_for_the_next_relist(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        relister = env.agent.relister
        if containerd.runtime.name == "containerd1.6":
            await anyio.sleep(2)
            assert not relister.evented, "containerd 1.6 streams no events: periodic relisting only"
            pytest.skip("containerd 1.6 has no GetContainerEvents (checked: the relister falls back)")
        # The safety net out of the way: only an event can make it look now.
        relister._period = relister._evented_period = 30.0
        env.write("brief.yaml", pod_manifest("brief", command="sleep 3; exit 7", restartPolicy="Never"))
        running = await env.wait_running("brief")

        async def exited() -> Any:
            record = relister.pod(env.uid_of("brief") or "").latest("main")
            return record if record is not None and record.exited else None

        record = await wait_for(exited, 20, "the exit in the agent's view, long before a 30 s relist")
        seen = time.time()
        assert record.id == running.id and record.exit_code == 7
        assert relister.evented and relister.events_seen > 0 and relister.period == 30.0
        assert seen - record.finished_at / 1e9 < 5.0, "seen within seconds of the exit, not at the next relist"


async def test_an_exit_among_many_pods_is_taken_from_its_event_without_a_listing(containerd: Any, tmp_path: Path) -> None:
    # The event path's cost must not grow with the node: an exit is taken from its own event
    # (the container's status it carries), with no listing of the pod nor of the node, and is
    # seen for what it is while the other pods keep running.
    if containerd.runtime.name == "containerd1.6":
        pytest.skip("containerd 1.6 has no GetContainerEvents: it is relisted periodically only")
    async with running_agent(containerd, tmp_path) as env:
        relister = env.agent.relister
        relister._period = relister._evented_period = 600.0  # no node-wide relist in the test's way
        others = [f"steady-{i}" for i in range(6)]
        for name in others:
            env.write(f"{name}.yaml", pod_manifest(name))
        # Exits when told (a file in its own /tmp), so that the exit comes after the counting began.
        env.write("brief.yaml", pod_manifest("brief", command="until [ -e /tmp/go ]; do sleep 0.2; done; exit 7",
                                             restartPolicy="Never"))
        for name in others:
            await env.wait_seen_running(name, 60)
        running = await env.wait_seen_running("brief", 60)
        uid = env.uid_of("brief") or ""
        before = {name: relister.pod(env.uid_of(name) or "") for name in others}
        counted = CountingRuntime(relister._runtime)
        relister._runtime = counted  # type: ignore[assignment]
        await env.client.exec_sync(running.id, ["touch", "/tmp/go"], timeout=30)

        async def exited() -> Any:
            record = relister.pod(uid).latest("main")
            return record if record is not None and record.exited else None

        record = await wait_for(exited, 30, "the exit in the agent's view")
        assert record.id == running.id and record.exit_code == 7
        listings = counted.named("list_pod_sandbox", "list_containers", "container_status")
        assert not listings, f"the exit was looked up in the runtime: {listings}"
        assert [e["exit_code"] for e in env.agent.trace.chain(uid) if e["kind"] == "ContainerExited"] == [7]
        for name in others:
            now = relister.pod(env.uid_of(name) or "")
            assert now is before[name], f"{name} was rebuilt for an exit in another pod"
            assert now.running()


async def test_a_start_is_taken_from_its_event_without_listing_the_pod_again(
        containerd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime stage's own creations and starts: on an evented runtime the sandbox's and the
    containers' events show the relister what a listing would have (the pod's record, its IP,
    its freshness for the stage's next plan, the ContainerStarted fact once), so the pod is not
    listed on its way to Running, but for an exit."""
    if containerd.runtime.name == "containerd1.6":
        pytest.skip("containerd 1.6 has no GetContainerEvents: every change is listed")
    from nodeagent import pleg

    # A lost event would relist after the grace; a generous one keeps a loaded machine's slow
    # event from passing for a lost one here (below the stage's own 10 s wait for a fresh view).
    monkeypatch.setattr(pleg, "EXPECT_GRACE_SECONDS", 5.0)
    async with running_agent(containerd, tmp_path) as env:
        relister = env.agent.relister
        relister._period = relister._evented_period = 600.0  # no node-wide relist in the test's way
        env.write("first.yaml", pod_manifest("first"))
        await env.wait_seen_running("first", 60)
        await wait_for(lambda: _true(relister.evented), 10, "the event stream up")
        counted = CountingRuntime(relister._runtime)
        relister._runtime = counted  # type: ignore[assignment]
        applied = relister.events_applied
        env.write("two.yaml", pod_manifest("two", initContainers=[
            {"name": "init", "image": BUSYBOX_IMAGE, "command": ["true"]}]))
        await env.wait_seen_running("two", 60)
        [running] = [c for c in await env.running_containers("two") if c.labels.get(L.CONTAINER_NAME) == "main"]
        uid = env.uid_of("two") or ""
        listings = [args[0] if args else kwargs.get("filter")
                    for _, args, kwargs in counted.named("list_containers")]
        # The new sandbox (its identity and IP), the init container's creation and start, the
        # main container's creation and start: no listing. The init container's exit is news,
        # not the stage's doing: it relists the pod, once.
        ours = [f for f in listings if f is not None and f.label_selector.get(L.POD_UID) == uid]
        assert len(ours) <= 1, listings
        inspected = counted.named("container_status")
        assert len(inspected) <= 1, inspected  # the init container's exit
        assert not counted.named("pod_sandbox_status"), "the sandbox's IP came with its event"
        assert relister.events_applied - applied >= 4, (applied, relister.events_applied)
        record = relister.pod(uid).latest("main")
        assert record is not None and record.id == running.id and record.running
        started = [e for e in env.agent.trace.chain(uid) if e["kind"] == "ContainerStarted"]
        assert sorted(e["container"] for e in started) == ["init", "main"], started


async def _true(value: bool) -> bool:
    return value


async def test_a_new_pods_start_asks_the_runtime_only_what_the_relister_cannot_tell(
        containerd: Any, tmp_path: Path) -> None:
    """The runtime stage's calls for a pod the agent never ran: no ListPodSandbox (the
    relister's node-wide listing showed no sandbox of it, and only the stage makes new ones) and
    no PodSandboxStatus (the sandbox's IPs come with its start event, or with the listing its
    expectation asks for on a runtime without events). What is left is RunPodSandbox,
    ImageStatus, CreateContainer and StartContainer. A pod the agent ran before is listed."""
    async with running_agent(containerd, tmp_path) as env:
        env.write("first.yaml", pod_manifest("first"))
        await env.wait_seen_running("first", 60)
        counted = CountingRuntime(env.agent.services.runtime)
        env.agent.services.runtime = counted  # type: ignore[assignment]  # workers made from now on
        env.write("two.yaml", pod_manifest("two"))
        await env.wait_seen_running("two", 60)
        uid = env.uid_of("two") or ""
        names = [name for name, _, _ in counted.calls]
        assert not counted.named("list_pod_sandbox", "pod_sandbox_status"), names
        assert {"run_pod_sandbox", "create_container", "start_container"} <= set(names), names
        status = env.status_of("two")
        assert status["podIP"] and status["podIPs"][0]["ip"] == status["podIP"]

        # Its sandbox gone under it (as a node's reboot leaves a pod): the stage makes a new
        # one, and having run one before, lists what the runtime holds of the pod first.
        (sandbox,) = [s for s in await env.client.list_pod_sandbox()
                      if s.metadata is not None and s.metadata.uid == uid]
        await env.client.stop_pod_sandbox(sandbox.id)

        async def replaced() -> bool:
            ready = [s for s in await env.client.list_pod_sandbox() if s.metadata is not None
                     and s.metadata.uid == uid and s.state == t.PodSandboxState.SANDBOX_READY]
            return bool(ready) and ready[0].id != sandbox.id

        await wait_for(replaced, 60, "a new sandbox for the pod")
        listed = [args[0] if args else kwargs.get("filter") for _, args, kwargs in counted.named("list_pod_sandbox")]
        assert any(f is not None and f.label_selector.get(L.POD_UID) == uid for f in listed), listed
