"""Image and container garbage collection (issue 17 §4) on a containerd of the test's own:
past the high threshold an unused image is removed and the image a running container uses is
not (nor the sandbox image); dead containers beyond maximumDeadContainersPerContainer go."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from cri import types as t
from nodeagent import labels as L
from plugins.gc.config import GcConfig
from plugins.gc.images import format_size
from tests.agent_helpers import pod_manifest, running_agent, wait_for
from tests.private_runtime import blob_image, private_containerd, runnable_image

pytestmark = pytest.mark.anyio


def test_gc_configuration_as_the_kubelet_checks_it() -> None:
    assert GcConfig().image_minimum_gc_age == 120 and GcConfig(imageMinimumGCAge="0s").image_minimum_gc_age == 120
    with pytest.raises(ValueError, match="imageGCLowThresholdPercent .* must be less than"):
        GcConfig(imageGCHighThresholdPercent=50, imageGCLowThresholdPercent=60)
    assert not GcConfig(imageGCHighThresholdPercent=100).image_gc_enabled
    assert format_size(int(19.5 * 2**30)) == "19.5 GiB" and format_size(512) == "512 B"


@pytest.mark.containerd
async def test_image_gc_removes_unused_images_never_one_in_use(tmp_path: Path) -> None:
    suffix = tmp_path.name[-8:].lower().replace("_", "")
    used_name, unused_name = f"localhost/gc-used:{suffix}", f"localhost/gc-unused:{suffix}"
    images = [runnable_image(tmp_path, used_name), blob_image(tmp_path, unused_name, 3_000_000)]
    base = Path(tempfile.mkdtemp(prefix="na-gc-", dir="/tmp"))
    with private_containerd(base, *images) as runtime:
        gc = {"imageGCHighThresholdPercent": 1, "imageGCLowThresholdPercent": 0, "imageMinimumGCAge": "1s",
              "imageGCPeriod": "1s", "containerGCPeriod": "1s"}
        async with running_agent(runtime, tmp_path, healthz_port=0, plugins={"gc": gc}) as env:
            manifest = pod_manifest("user", "sleep 3600")
            manifest["spec"]["containers"][0].update(image=used_name, imagePullPolicy="Never")
            env.write("user.yaml", manifest)
            await env.wait_seen_running("user")
            # Dead containers: a pod whose container exits at once and is restarted, keeping
            # at most maximumDeadContainersPerContainer (1) of its dead instances.
            crasher = pod_manifest("crasher", "exit 1")
            crasher["spec"]["containers"][0].update(image=used_name, imagePullPolicy="Never")
            env.write("crasher.yaml", crasher)

            async def names() -> set[str]:
                return {n for i in await env.client.list_images() for n in i.repo_tags}

            async def unused_gone() -> bool:
                return unused_name not in await names()

            await wait_for(unused_gone, 60, f"{unused_name} removed by image GC")
            left = await names()
            assert used_name in left, "the image a running container uses stays"
            assert "registry.k8s.io/pause:3.10" in left, "the sandbox image stays"
            stage = env.agent.pipeline.stages["gc"]  # type: ignore[union-attr]
            assert stage.images.collected["space"] >= 1
            assert 'kubelet_image_garbage_collected_total{reason="space"}' in env.agent.metrics.render()

            async def dead_instances() -> list[t.Container]:
                found = await env.client.list_containers(t.ContainerFilter(
                    label_selector={L.POD_NAME: f"crasher-{env.node}"}))
                return [c for c in found if c.state != t.ContainerState.CONTAINER_RUNNING]

            async def restarted_twice() -> bool:
                status = env.status_of("crasher")
                return any(cs.get("restartCount", 0) >= 3 for cs in status.get("containerStatuses", []))

            await wait_for(restarted_twice, 90, "the crashing container restarted three times")
            await wait_for(lambda: _at_most(dead_instances(), 2), 30, "dead instances collected")
            assert used_name in await names()


async def _at_most(found: Any, count: int) -> bool:
    return len(await found) <= count
