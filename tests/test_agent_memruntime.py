"""The agent on the in-memory CRI runtime: behaviours the contract suite found, tested directly,
and the cgroupsPerQOS knob that lets the agent run without root."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from conformance.harness import UNTIL_TERM, Harness, memory_runtime, open_harness
from devenv.images import BUSYBOX_IMAGE
from nodeagent import worker

pytestmark = pytest.mark.anyio


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with memory_runtime() as runtime, open_harness(runtime, tmp_path, "runtime") as h:
        await h.start_agent()
        yield h


def _container(name: str, command: list[str]) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX_IMAGE, "command": command}


async def test_a_pod_deleted_as_it_starts_is_torn_down_without_waiting_out_the_settle_bound(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the relister saw the containers stop before the worker settled, a later listing
    shows nothing new and wakes no status observer: the worker must not wait for one (it
    waited its whole bound, 3 s, for every such pod)."""
    monkeypatch.setattr(worker, "SETTLE_TIMEOUT_SECONDS", 60.0)
    for _ in range(3):
        pod = harness.pod(containers=[_container("a", UNTIL_TERM), _container("b", UNTIL_TERM)],
                          initContainers=[_container("init", ["sh", "-c", "exit 0"])])
        await harness.run(pod)
        await harness.settle(pod)
        await harness.delete(pod)  # while the sync loop starts a and b
        await harness.wait_gone(pod, timeout=5)  # it takes well under a second; the bug cost 3-10 s


async def test_a_completed_pod_gets_no_new_sandbox_from_a_restarted_agent(harness: Harness) -> None:
    """The kubelet's "do not recreate" rule: a pod that ran under restartPolicy Never and whose
    sandbox is gone (here: stopped when it completed, before the agent restarted) is not set up
    again; the new agent reports it completed as it was."""
    pod = harness.pod(containers=[_container("main", ["sh", "-c", "exit 3"])], restartPolicy="Never")
    await harness.run(pod)
    await harness.settle(pod, want="Completed")
    before = await harness.runtime_objects(pod.uid)
    await harness.stop_agent()
    await harness.start_agent()
    await harness.settle(pod, want="Completed")
    after = await harness.runtime_objects(pod.uid)
    assert after.ids() == before.ids(), f"before {before.describe()}; after {after.describe()}"
    assert harness.runtime.memory is not None
    assert len(harness.runtime.memory.calls("RunPodSandbox", pod=pod.uid)) == 1
    assert harness.agent is not None
    assert harness.agent.status.get(pod.uid)["phase"] == "Failed"
    await harness.delete(pod)
    await harness.wait_gone(pod)


# --- cgroupsPerQOS (its unit tests: tests/test_pod_cgroups.py) -----------------------------------


async def test_the_agent_runs_pods_without_cgroups_per_qos(harness: Harness) -> None:
    """The harness runs the agent on the memory runtime with cgroupsPerQOS false: the sandbox
    the runtime got names no cgroup parent."""
    assert harness.config.cgroups_per_qos is False
    pod = harness.pod()
    await harness.run(pod)
    assert await harness.settle(pod) == "Running"
    assert harness.runtime.memory is not None
    (sandbox,) = harness.runtime.memory.sandboxes(pod.uid)
    assert sandbox.config.linux.cgroup_parent == ""
    await harness.delete(pod)
    await harness.wait_gone(pod)
    with anyio.fail_after(1):
        assert await harness.leaks(pod.uid) == []
