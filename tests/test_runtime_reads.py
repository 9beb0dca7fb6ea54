"""What the runtime stage reads from the runtime per container it starts (plugins/runtime/seen.py):
the sandbox's IPs and an image's status are read once per sandbox and image, not once per
container. Counted from the agent's own runtime-operations observer (the calls the
kubelet_runtime_operations_total metric counts), against the real containerd."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.agent_helpers import BUSYBOX_IMAGE, pod_manifest, running_agent

pytestmark = pytest.mark.anyio


async def test_a_pods_containers_share_one_read_of_its_sandbox_and_of_each_image(
        containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        calls: Counter[str] = Counter()
        observe = env.agent.runtime.observer

        def counting(method: str, seconds: float, error: bool) -> None:
            calls[method] += 1
            if observe is not None:
                observe(method, seconds, error)

        env.agent.runtime.observer = counting
        env.write("one.yaml", pod_manifest("one"))
        await env.wait_seen_running("one", 60)
        one = Counter(calls)
        calls.clear()
        three = pod_manifest("three", initContainers=[
            {"name": "init", "image": BUSYBOX_IMAGE, "command": ["true"]}])
        three["spec"]["containers"].append({"name": "second", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]})
        env.write("three.yaml", three)
        await env.wait_seen_running("three", 60)
        # Two more containers cost two more pull-policy checks (one ImageStatus each, as the
        # kubelet's EnsureImageExists) and nothing else: no second ImageStatus of the image the
        # first container's start read, no PodSandboxStatus per container.
        assert calls["ImageStatus"] - one["ImageStatus"] == 2, (one, calls)
        assert calls["PodSandboxStatus"] == one["PodSandboxStatus"], (one, calls)
        assert calls["CreateContainer"] == 3 and calls["StartContainer"] == 3, calls
