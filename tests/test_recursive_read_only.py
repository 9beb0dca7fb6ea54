"""recursiveReadOnly on volumeMounts: the kubelet's resolution against the runtime handler, the
CRI mount flag, and status.volumeMounts -- on the real runtime, with a real submount."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cri import types as t
from nodeagent.model import Container, VolumeMount
from nodeagent.volumeutil.mounts import MountConfigError, resolve_recursive_read_only, with_recursive_read_only
from tests.agent_helpers import pod_manifest, running_agent, wait_for

pytestmark = pytest.mark.anyio


def _mount(**fields: Any) -> VolumeMount:
    return VolumeMount.model_validate({"name": "v", "mountPath": "/m", **fields})


def test_the_kubelets_resolution_of_each_mode() -> None:
    for supported in (True, False):
        assert resolve_recursive_read_only(_mount(readOnly=True), supported) is False
        assert resolve_recursive_read_only(_mount(readOnly=True, recursiveReadOnly="Disabled"), supported) is False
        assert resolve_recursive_read_only(_mount(readOnly=True, recursiveReadOnly="IfPossible"), supported) is supported
        with pytest.raises(MountConfigError, match="requested recursive read-only mode, but it is not read-only"):
            resolve_recursive_read_only(_mount(recursiveReadOnly="IfPossible"), supported)
        with pytest.raises(MountConfigError, match="not compatible with propagation 'HostToContainer'"):
            resolve_recursive_read_only(_mount(readOnly=True, recursiveReadOnly="Enabled",
                                               mountPropagation="HostToContainer"), supported)
    assert resolve_recursive_read_only(_mount(readOnly=True, recursiveReadOnly="Enabled", mountPropagation="None"), True)
    with pytest.raises(MountConfigError, match="requested recursive read-only mode, but it is not supported by the "
                                               "runtime"):
        resolve_recursive_read_only(_mount(readOnly=True, recursiveReadOnly="Enabled"), False)
    container = Container.model_validate({"name": "c", "image": "i", "volumeMounts": [
        {"name": "v", "mountPath": "/a", "readOnly": True, "recursiveReadOnly": "IfPossible"},
        {"name": "v", "mountPath": "/b", "readOnly": True}]})
    mounts, made = with_recursive_read_only(container, [t.Mount(container_path="/a", host_path="/h", readonly=True),
                                                        t.Mount(container_path="/b", host_path="/h", readonly=True)], True)
    assert [m.recursive_read_only for m in mounts] == [True, False] and made == {"/a"}


async def test_a_submount_is_read_only_only_where_recursive_read_only_is_asked(containerd: Any, tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "sub").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "rro-test", str(host / "sub")], check=True)
    try:
        async with running_agent(containerd, tmp_path / "agent") as env:
            caps = await env.client.capabilities()
            found = caps.handler("")
            supported = bool(found and found.features and found.features.recursive_read_only_mounts)
            env.write("p.yaml", pod_manifest("p", container={"volumeMounts": [
                {"name": "host", "mountPath": "/rro", "readOnly": True, "recursiveReadOnly": "Enabled"},
                {"name": "host", "mountPath": "/ro", "readOnly": True},
                {"name": "host", "mountPath": "/rw"}]},
                volumes=[{"name": "host", "hostPath": {"path": str(host)}}]))
            if not supported:
                # containerd 1.6 lists no handlers: Enabled cannot be had, and the container says why.
                async def refused() -> dict[str, Any] | None:
                    for cs in env.status_of("p").get("containerStatuses", []):
                        waiting = cs["state"].get("waiting") or {}
                        if waiting.get("reason") == "CreateContainerConfigError":
                            return waiting
                    return None

                waiting = await wait_for(refused, 60, "CreateContainerConfigError")
                assert "requested recursive read-only mode, but it is not supported by the runtime" in waiting["message"]
                return
            main = await env.wait_running("p")
            # The submount is read-only through /rro only; /ro is read-only at its top, not below.
            rro = await env.client.exec_sync(main.id, ["touch", "/rro/sub/x"], timeout=10)
            assert rro.exit_code != 0 and b"Read-only file system" in rro.stderr, rro
            ro = await env.client.exec_sync(main.id, ["touch", "/ro/sub/y"], timeout=10)
            assert ro.exit_code == 0, ro
            top = await env.client.exec_sync(main.id, ["touch", "/ro/z"], timeout=10)
            assert top.exit_code != 0, top

            async def reported() -> list[dict[str, Any]] | None:
                statuses = env.status_of("p").get("containerStatuses", [])
                return statuses[0].get("volumeMounts") if statuses and "running" in statuses[0]["state"] else None

            assert await wait_for(reported, 30, "status.volumeMounts") == [
                {"name": "host", "mountPath": "/rro", "readOnly": True, "recursiveReadOnly": "Enabled"},
                {"name": "host", "mountPath": "/ro", "readOnly": True, "recursiveReadOnly": "Disabled"},
                {"name": "host", "mountPath": "/rw"}]
    finally:
        subprocess.run(["umount", "-l", str(host / "sub")], check=False)
