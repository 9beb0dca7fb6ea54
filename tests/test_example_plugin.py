"""The out-of-tree example stage (examples/required-label), installed as a separate package:
its contract, its configuration, and a real agent that runs it against containerd."""

from __future__ import annotations

import importlib.metadata
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from conformance.harness import eventually, objects_with, remove_objects
from cri import RuntimeClient
from cri import types as t
from devenv.images import BUSYBOX_IMAGE
from nodeagent import labels as L
from nodeagent.agent import Agent
from nodeagent.config import AgentConfig
from nodeagent.lifecycle import PodState

ENTRY_POINT = "requiredlabel = required_label:plugin"
INSTALL = "python -m pip install -e examples/required-label"
TIMEOUT = 30.0


@pytest.fixture(autouse=True)
def example_installed() -> None:
    """Fail (never skip) when the example package is not installed: .ci/run installs it."""
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="nodeagent.plugins")}
    if found.get("requiredlabel") != "required_label:plugin":
        pytest.fail(
            f"the example plugin is not installed: entry-point group nodeagent.plugins lacks "
            f"{ENTRY_POINT!r} (it has {found}). Install it with `{INSTALL}`.",
            pytrace=False,
        )


# The contract suite for the example runs in tests/test_contract.py (TestRequiredLabelContract) and
# in the example's own tests (examples/required-label/tests).


def test_configuration_is_validated() -> None:
    from required_label import plugin

    assert plugin({"label": "team"}, handle=None).config.label == "team"  # type: ignore[arg-type]
    for bad in ({}, {"label": ""}, {"label": "team", "extra": 1}):
        with pytest.raises(ValidationError):
            plugin(bad, handle=None)  # type: ignore[arg-type]


# --- a real agent ------------------------------------------------------------------------

PROFILE = {
    "admit": ["noderesources", "requiredlabel"],
    "prepare": ["runtime"],
    "start": ["runtime"],
    "observe": ["status", "runtime"],
    "cleanup": ["runtime"],
}


def _manifest(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            # Exits on SIGTERM at once, so teardown costs no grace period.
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                            "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}],
        },
    }


@asynccontextmanager
async def running(agent: Agent, cri: RuntimeClient) -> AsyncIterator[Agent]:
    """Run ``agent`` for the body; then delete its manifests, wait until the runtime holds nothing
    of its node (label nodeagent.io/node), and stop it. A failure in the body is re-raised as
    itself, not wrapped in the task group's ExceptionGroup."""
    node = agent.config.node_name
    manifests = agent.config.static_pod_path
    assert manifests is not None
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(agent.run)
            try:
                yield agent
            finally:
                with anyio.CancelScope(shield=True):
                    for path in manifests.iterdir():
                        path.unlink()
                    try:
                        await eventually(lambda: _gone(cri, node), f"the agent to tear down node {node}'s pods")
                    finally:
                        tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await remove_objects(cri, await objects_with(cri, {L.MANAGED_BY: node}))  # a failed test's leftovers
            await agent.runtime.close()


async def _gone(cri: RuntimeClient, node: str) -> bool:
    return not await objects_with(cri, {L.MANAGED_BY: node})


def _uid(agent: Agent, name: str) -> str | None:
    return next((uid for uid, (ref, *_) in agent.status.all().items() if ref.name == name), None)


@pytest.mark.anyio
@pytest.mark.containerd
async def test_agent_runs_labelled_pod_and_rejects_unlabelled(containerd: Any, tmp_path: Path) -> None:
    node = f"example-{uuid.uuid4().hex[:8]}"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "labelled.json").write_text(json.dumps(_manifest("labelled", {"team": "storage"})))
    (manifests / "unlabelled.json").write_text(json.dumps(_manifest("unlabelled", {"app": "demo"})))
    config = AgentConfig(
        node_name=node,
        static_pod_path=manifests,
        container_runtime_endpoint=containerd.endpoint,
        root_dir=tmp_path / "root",
        pod_logs_dir=tmp_path / "logs",
        healthz_port=0,
        profile=PROFILE,
        plugins={"requiredlabel": {"label": "team"}},
    )
    async with RuntimeClient(containerd.endpoint, timeout=TIMEOUT) as cri, running(Agent(config), cri) as agent:
        assert agent.pipeline is not None
        assert agent.pipeline.as_dict()["admit"] == ["noderesources", "requiredlabel"]

        labelled = await eventually(lambda: _uid(agent, f"labelled-{node}"), "the agent to see the labelled pod")
        unlabelled = await eventually(lambda: _uid(agent, f"unlabelled-{node}"), "the agent to see the unlabelled pod")

        async def running_in_containerd() -> list[t.Container]:
            found = await objects_with(cri, {L.POD_UID: labelled})
            return [c for c in found.containers if c.state == t.ContainerState.CONTAINER_RUNNING]

        await eventually(running_in_containerd, "the labelled pod's container to run in containerd")
        await eventually(lambda: agent.status.get(labelled).get("phase") == "Running",
                         "the labelled pod's status phase Running")

        def failed() -> dict[str, Any] | None:
            status = agent.status.get(unlabelled)
            return status if status.get("phase") == "Failed" else None

        status = await eventually(failed, "the unlabelled pod's status phase Failed")
        assert status["reason"] == "MissingRequiredLabel", status
        assert "'team'" in status["message"] and f"unlabelled-{node}" in status["message"], status
        assert agent.status.all()[unlabelled][3] is PodState.REJECTED
        found = await objects_with(cri, {L.POD_UID: unlabelled})
        assert not found, f"a rejected pod must never reach the runtime: {found.describe()}"
        rejected = [e for e in agent.trace.chain(unlabelled) if e["kind"] == "PodRejected"]
        assert [e["reason"] for e in rejected] == ["MissingRequiredLabel"], agent.trace.chain(unlabelled)



@pytest.mark.anyio
async def test_the_walkthrough_stage_gives_a_real_container_its_variable(containerd: Any, tmp_path: Path) -> None:
    """docs/PLUGINS.md's walkthrough (examples/node-env), installed as its own distribution:
    in the profile before the runtime stage, every container of a pod run on containerd has
    NODE_ZONE, and a container that sets it itself keeps its own value."""
    from devenv.images import BUSYBOX_IMAGE
    from nodeagent.registry import DEFAULT_PROFILE
    from tests.agent_helpers import running_agent

    prepare = [*DEFAULT_PROFILE["prepare"][:-1], "nodeenv", "runtime"]
    profile = {**{k: list(v) for k, v in DEFAULT_PROFILE.items()}, "prepare": prepare}
    async with running_agent(containerd, tmp_path, profile=profile, plugins={"nodeenv": {"zone": "eu-1"}}) as env:
        env.write("zoned.yaml", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "zoned"},
                                 "spec": {"terminationGracePeriodSeconds": 1, "containers": [
                                     {"name": "a", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]},
                                     {"name": "b", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                                      "env": [{"name": "NODE_ZONE", "value": "mine"}]}]}})
        await env.wait_seen_running("zoned")
        for container, zone in (("a", "eu-1"), ("b", "mine")):
            [record] = [c for c in await env.running_containers("zoned") if c.metadata.name == container]
            result = await env.client.exec_sync(record.id, ["sh", "-c", "echo $NODE_ZONE"], timeout=10)
            assert result.stdout.decode().strip() == zone, container
