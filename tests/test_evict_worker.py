"""AgentHandle.evict on the real containerd: a pod failed as a whole by a node-level manager
through its worker — while it runs (stopped with the given grace, Failed with the reason,
message and condition, its sandbox released) and while it is still being set up (setup
cancelled, torn down); sticky: a second eviction, or one of a finished pod, changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.stages import Condition
from tests.agent_helpers import pod_manifest, running_agent, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.containerd]

CONDITION = Condition("DisruptionTarget", True, "TerminationByKubelet", "evicted by the test")


async def test_evict_a_running_pod_and_one_still_being_set_up(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("runner.yaml", pod_manifest("runner", "trap 'exit 0' TERM; while true; do sleep 1; done"))
        await env.wait_seen_running("runner")
        # An image that is not there and may not be pulled: the pod waits in prepare (RETRY).
        stuck = pod_manifest("stuck")
        stuck["spec"]["containers"][0].update(image="localhost/absent:never", imagePullPolicy="Never")
        env.write("stuck.yaml", stuck)
        ops = env.agent.node_ops

        async def preparing() -> bool:
            return any(p.ref.name == f"stuck-{env.node}" and p.state.value == "Preparing" for p in ops.pods())

        await wait_for(preparing, 30, "the stuck pod in prepare")
        runner_uid, stuck_uid = env.uid_of("runner"), env.uid_of("stuck")
        assert runner_uid and stuck_uid

        released = ops.evict(runner_uid, reason="Evicted", message="the test evicts it", grace_seconds=1,
                             condition=CONDITION)
        assert released is not None
        assert ops.evict(runner_uid, reason="Other", message="again", grace_seconds=0) is None, "sticky"
        await wait_for(lambda: _set(released), 30, "the running pod released")
        status = env.status_of("runner")
        assert (status["phase"], status["reason"], status["message"]) == ("Failed", "Evicted", "the test evicts it")
        [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
        assert (target["status"], target["reason"]) == ("True", "TerminationByKubelet")
        assert await env.running_containers("runner") == []
        assert ops.evict(runner_uid, reason="Evicted", message="done", grace_seconds=1) is None, "finished"

        setup_released = ops.evict(stuck_uid, reason="Terminated", message="shutting down", grace_seconds=1)
        assert setup_released is not None
        await wait_for(lambda: _set(setup_released), 30, "the pod in setup torn down")
        status = env.status_of("stuck")
        assert (status["phase"], status["reason"], status["message"]) == ("Failed", "Terminated", "shutting down")


async def _set(event: Any) -> bool:
    return bool(event.is_set())
