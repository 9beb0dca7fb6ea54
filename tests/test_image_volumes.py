"""Image volumes (``volumes[].image``) against the real containerd and a registry on loopback:
the image is pulled per its policy, mounted read-only by the runtime (CRI Mount.image), a
subPath gives a directory of the image, a volume whose image cannot be pulled holds back the
containers that mount it with the kubelet's reasons, an unmounted one holds back nothing, and a
runtime that cannot mount images (containerd before 2.1) refuses the pod at admission."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from cri import RuntimeClient
from cri import types as t
from devenv import registry as oci_registry
from devenv.containerd import Containerd
from devenv.images import LayerBuilder, write_oci_archive
from nodeagent.unsupported import UNSUPPORTED_VOLUME, mounts_images
from tests.agent_helpers import (
    BUSYBOX_IMAGE,
    AgentEnv,
    pod_manifest,
    running_agent,
    wait_for,
)
from tests.private_runtime import blob_image, private_containerd

pytestmark = pytest.mark.anyio

DATA = {"kitten.jpg": "a stand-in: the content image of the upstream ImageVolume tests"}


def _content_image(path: Path) -> Path:
    """Files only, no binary (like e2e-test-images/kitten): data.json and an /etc."""
    layer = LayerBuilder()
    layer.file("data.json", json.dumps(DATA).encode())
    layer.dir("etc")
    layer.file("etc/os-release", b'NAME="a content image"\n')
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    write_oci_archive(path, layer.finish(), {}, ("nodeagent.test/content:1",))
    return path


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[oci_registry.Registry]:
    archive = _content_image(tmp_path_factory.mktemp("content") / "content.tar")
    with oci_registry.serve({"e2e/content:1.0": archive}) as served:
        yield served


def _image_pod(name: str, reference: str, mounts: list[dict[str, Any]], policy: str = "Always",
               command: str = "sleep 3600") -> dict[str, Any]:
    return pod_manifest(name, command, container={"volumeMounts": mounts},
                        volumes=[{"name": "volume", "image": {"reference": reference, "pullPolicy": policy}}])


async def _exec(env: AgentEnv, pod: str, *cmd: str) -> t.ExecSyncResult:
    container = await env.wait_running(pod, 60)
    return await env.client.exec_sync(container.id, list(cmd), timeout=10)


def _waiting(env: AgentEnv, pod: str, container: str = "main") -> dict[str, str]:
    for status in env.status_of(pod).get("containerStatuses") or []:
        if status.get("name") == container:
            return dict(status.get("state", {}).get("waiting", {}))
    return {}


async def test_an_image_volume_is_pulled_and_mounted_read_only(containerd: Any, tmp_path: Path,
                                                              registry: oci_registry.Registry) -> None:
    reference = f"{registry.host}/e2e/content:1.0"
    mounts = [{"name": "volume", "mountPath": "/volume"}, {"name": "volume", "mountPath": "/sub", "subPath": "etc"}]
    async with running_agent(containerd, tmp_path) as env:
        env.write("image.yaml", _image_pod("image", reference, mounts))
        if not mounts_images(env.client.runtime_version):
            # containerd 1.6 ignores Mount.image: refused at admission, never run without it.
            async def rejected() -> dict[str, Any] | None:
                status = env.status_of("image")
                return status if status.get("reason") else None

            status = await wait_for(rejected, 30, "the image-volume pod refused")
            assert status["reason"] == UNSUPPORTED_VOLUME, status
            assert 'volume "volume" is an image volume' in status["message"]
            assert "containerd 2.1 or later" in status["message"]
            assert await env.running_containers("image") == []
            return
        got = await _exec(env, "image", "cat", "/volume/data.json")
        assert got.exit_code == 0 and json.loads(got.stdout) == DATA, got
        got = await _exec(env, "image", "cat", "/sub/passwd")  # subPath: the image's etc/
        assert got.exit_code == 0 and got.stdout.startswith(b"root:"), got
        got = await _exec(env, "image", "sh", "-c", "echo x > /volume/new")
        assert got.exit_code != 0 and b"Read-only file system" in got.stderr, got
        assert registry.manifest_gets("e2e/content") >= 1  # Always: asked the registry
        # The container's CRI mounts name the image, not a path of ours.
        container = await env.wait_running("image")
        _, info = await env.client.container_status(container.id, verbose=True)
        spec = json.loads(info["info"])["config"]
        image_mounts = [m for m in spec.get("mounts", []) if m.get("image")]
        assert sorted(m["container_path"] for m in image_mounts) == ["/sub", "/volume"], image_mounts
        assert all(m.get("readonly") for m in image_mounts), image_mounts
        # containerd fills the host path in: its own mount of the image, under its state, per sandbox.
        assert all(str(tmp_path) not in m.get("host_path", "") for m in image_mounts), image_mounts
        assert all(m["image"]["user_specified_image"] == reference for m in image_mounts), image_mounts


async def test_an_image_volume_that_cannot_be_pulled_holds_back_only_its_containers(
        containerd: Any, tmp_path: Path, registry: oci_registry.Registry) -> None:
    missing = f"{registry.host}/e2e/missing:1.0"  # the registry answers 404
    async with running_agent(containerd, tmp_path) as env:
        if not mounts_images(env.client.runtime_version):
            pytest.skip("this runtime refuses image volumes at admission (the test above checks it)")
        env.write("unused.yaml", _image_pod("unused", missing, []))
        used = _image_pod("used", missing, [{"name": "volume", "mountPath": "/volume"}])
        # A second container that does not mount it runs (toKubeContainerImageVolumes).
        used["spec"]["containers"].append({"name": "other", "image": BUSYBOX_IMAGE,
                                           "command": ["sh", "-c", "sleep 3600"]})
        env.write("used.yaml", used)
        env.write("subpath.yaml", _image_pod("subpath", f"{registry.host}/e2e/content:1.0",
                                             [{"name": "volume", "mountPath": "/v", "subPath": "not-existing"}]))
        # No container mounts it: the pull fails and nothing waits for it (the upstream
        # "should succeed if image volume is not existing but unused").
        got = await _exec(env, "unused", "ls", "/")
        assert b"volume" not in got.stdout
        # Mounted: the container waits with the pull's reasons (the upstream "should fail if
        # image volume is not existing": ImagePullBackOff), and never runs.
        async def backing_off() -> bool:
            return _waiting(env, "used").get("reason") == "ImagePullBackOff"

        await wait_for(backing_off, 60, "the container mounting a missing image volume in ImagePullBackOff")
        assert f'Back-off pulling image "{missing}"' in _waiting(env, "used")["message"]
        async def only_other() -> bool:
            running = await env.running_containers("used")
            return [c.metadata.name for c in running if c.metadata] == ["other"]

        await wait_for(only_other, 30, "the container not mounting the volume running, alone")
        told = [e for e in env.agent.trace.chain(f"default/used-{env.node}") if e["kind"] == "ImageVolumePullFailed"]
        assert {e["reason"] for e in told} >= {"ErrImagePull", "ImagePullBackOff"}, told
        assert all(e["container"] == "main" for e in told), told
        # The unmounted volume's failed pull is told too (the kubelet's puller events), on its pod.
        assert any(e["kind"] == "ImageVolumePullFailed" for e in env.agent.trace.chain(f"default/unused-{env.node}"))
        # A subPath the image lacks: the runtime cannot mount it (the upstream "should fail if
        # subPath in volume is not existing": CreateContainerError).
        async def create_error() -> dict[str, str] | None:
            waiting = _waiting(env, "subpath")
            return waiting if waiting.get("reason") == "CreateContainerError" else None

        waiting = await wait_for(create_error, 60, "CreateContainerError for a missing subPath")
        assert "not-existing" in waiting["message"], waiting
        assert await env.running_containers("subpath") == []


@pytest.mark.containerd
async def test_image_gc_never_removes_an_image_a_volume_mounts(tmp_path: Path) -> None:
    # handleImageVolumes: an image only an image volume uses is in use (the kubelet reads each
    # container's mounts from ContainerStatus). Past the high threshold, with nothing to keep
    # free, a GC pass removes every unused image old enough at once: the one imported after the
    # pod started going shows a pass ran while the volume's image was mounted.
    suffix = tmp_path.name[-8:].lower().replace("_", "")
    volume_name, unused_name = f"localhost/gc-volume:{suffix}", f"localhost/gc-unused:{suffix}"
    volume, unused = blob_image(tmp_path, volume_name, 4096), blob_image(tmp_path, unused_name, 3_000_000)
    base = Path(tempfile.mkdtemp(prefix="na-gciv-", dir="/tmp"))
    with private_containerd(base, volume) as runtime:
        # imageMinimumGCAge 5s: the pod is up well before its volume's image may be collected.
        gc = {"imageGCHighThresholdPercent": 1, "imageGCLowThresholdPercent": 0, "imageMinimumGCAge": "5s",
              "imageGCPeriod": "1s"}
        async with running_agent(runtime, tmp_path, plugins={"gc": gc}) as env:
            if not mounts_images(env.client.runtime_version):
                pytest.skip("this runtime refuses image volumes at admission")
            env.write("user.yaml", _image_pod("user", volume_name, [{"name": "volume", "mountPath": "/volume"}],
                                              policy="Never"))
            got = await _exec(env, "user", "ls", "/volume")
            assert got.stdout.split() == [b"blob"], got
            await anyio.to_thread.run_sync(runtime.import_images, [unused])

            async def names() -> set[str]:
                return {n for i in await env.client.list_images() for n in i.repo_tags}

            async def unused_there() -> bool:
                return unused_name in await names()

            await wait_for(unused_there, 30, f"{unused_name} listed by CRI")  # 2.x lists an import a bit later

            async def unused_gone() -> bool:
                return unused_name not in await names()

            await wait_for(unused_gone, 60, f"{unused_name} removed by image GC")
            assert volume_name in await names(), "the image a volume mounts stays"
            got = await _exec(env, "user", "ls", "/volume")
            assert got.stdout.split() == [b"blob"], got


@pytest.mark.containerd
async def test_a_registry_mirror_serves_a_registry_k8s_io_name(registry: oci_registry.Registry) -> None:
    # How the upstream e2e run gets kitten with imagePullPolicy Always: containerd's registry
    # config makes the loopback registry the mirror of registry.k8s.io.
    base = Path(tempfile.mkdtemp(prefix="na-mirror-", dir="/tmp"))
    runtime = Containerd(base, registry_mirrors={"registry.k8s.io": registry.host})
    runtime.start()
    try:
        before = registry.manifest_gets("e2e/content")
        async with RuntimeClient(runtime.endpoint) as client:
            ref = await client.pull_image("registry.k8s.io/e2e/content:1.0")
            image = await client.image_status("registry.k8s.io/e2e/content:1.0")
        assert image is not None and image.id == ref
        assert registry.manifest_gets("e2e/content") > before
    finally:
        runtime.stop()
        shutil.rmtree(base, ignore_errors=True)
