"""cgroupsPerQOS, the kubelet's field: with it (the default) every pod gets a cgroup under the
agent's QoS hierarchy; without it none is made, so the agent needs nothing under /sys/fs/cgroup
(the root-free contract suite runs it so)."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from nodeagent.config import AgentConfig, ConfigError, load
from nodeagent.model import Pod
from nodeagent.stages import PodContext
from plugins.runtime import podcgroup
from plugins.runtime.sandbox import sandbox_config

pytestmark = pytest.mark.anyio


def _pod() -> Pod:
    return Pod.model_validate({"metadata": {"name": "p", "namespace": "n", "uid": "u-1"},
                               "spec": {"containers": [{"name": "c", "image": "busybox",
                                                        "resources": {"limits": {"memory": "64Mi"}}}]}})


def test_cgroups_per_qos_is_the_kubelets_field(tmp_path: Path) -> None:
    assert AgentConfig().kubelet.cgroups_per_qos is True
    path = tmp_path / "config.yaml"
    path.write_text("cgroupsPerQOS: false\n")
    # The kubelet's validation: its default enforceNodeAllocatable ([pods]) needs pod cgroups.
    with pytest.raises(ConfigError, match='cgroupsPerQOS \\(--cgroups-per-qos\\) must be set to true when "pods" '
                                          'contained in enforceNodeAllocatable'):
        load(path)
    path.write_text("cgroupsPerQOS: false\nenforceNodeAllocatable: []\n")
    assert load(path).kubelet.cgroups_per_qos is False
    path.write_text("cgroupsPerQos: false\n")
    with pytest.raises(ConfigError, match="cgroupsPerQos"):
        load(path)


def test_without_cgroups_per_qos_the_sandbox_has_no_pod_cgroup(tmp_path: Path) -> None:
    pod = _pod()
    on = sandbox_config(pod, 0, tmp_path, "node", settings=AgentConfig().node_config())
    off = sandbox_config(pod, 0, tmp_path, "node", settings=AgentConfig.model_validate({"cgroupsPerQOS": False}).node_config())
    assert on.linux is not None and on.linux.cgroup_parent == "/nodeagent-pods/burstable/podu-1"
    assert off.linux is not None and off.linux.cgroup_parent == ""


async def test_without_cgroups_per_qos_nothing_is_written_under_the_cgroup_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podcgroup, "CGROUP_FS", tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")  # a v2 hierarchy of our own
    for name in ("nodeagent-pods", "nodeagent-pods/burstable"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.subtree_control").write_text("cpu memory\n")
    pod = _pod()
    off = AgentConfig.model_validate({"cgroupsPerQOS": False}).node_config()
    await podcgroup.apply(cast(PodContext, SimpleNamespace(settings=off)), pod)
    assert not (tmp_path / "nodeagent-pods/burstable/podu-1").exists()
    await podcgroup.apply(cast(PodContext, SimpleNamespace(settings=AgentConfig().node_config())), pod)
    assert (tmp_path / "nodeagent-pods/burstable/podu-1/memory.max").read_text() == str(64 * 2**20)


# --- cgroupRoot: the kubelet's <cgroupRoot>/kubepods layout ---------------------------------------


def test_cgroup_root_gives_the_kubelets_kubepods_layout(tmp_path: Path) -> None:
    pod = _pod()
    guaranteed = Pod.model_validate({"metadata": {"name": "g", "namespace": "n", "uid": "u-2"},
                                     "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {
                                         "limits": {"cpu": "100m", "memory": "64Mi"}}}]}})

    def parent(p: Pod, **config: object) -> str:
        settings = AgentConfig.model_validate(config).node_config()
        linux = sandbox_config(p, 0, tmp_path, "node", settings=settings).linux
        assert linux is not None
        return linux.cgroup_parent

    assert parent(pod) == "/nodeagent-pods/burstable/podu-1"  # unset: a root of nodeagent's own
    assert parent(pod, cgroupRoot="/") == "/kubepods/burstable/podu-1"  # the kubelet's, exactly
    assert parent(guaranteed, cgroupRoot="/") == "/kubepods/podu-2"
    assert parent(pod, cgroupRoot="/node-a/") == "/node-a/kubepods/burstable/podu-1"
    assert podcgroup.pods_root(AgentConfig.model_validate({"cgroupRoot": "/"}).node_config()) == "/kubepods"


def test_a_cgroup_root_that_climbs_out_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("cgroupRoot: /a/../../etc\n")
    with pytest.raises(ConfigError, match=r"cgroupRoot \(--cgroup-root\) '/a/\.\./\.\./etc' must not contain '\.\.'"):
        load(path)


async def test_a_pod_runs_in_the_kubepods_tree_of_the_configured_cgroup_root(containerd: Any, tmp_path: Path) -> None:
    """On the host's cgroups, through the runtime: the QoS tiers made and sized, the container's
    own /proc/self/cgroup naming <cgroupRoot>/kubepods/burstable/pod<uid>, the pod's directory
    going with the pod."""
    from tests.agent_helpers import pod_manifest, running_agent, wait_for

    root = f"/nodeagent-test-{uuid.uuid4().hex[:8]}"  # of its own: other agents run on this host
    hierarchy = podcgroup.CGROUP_FS if podcgroup.unified() else podcgroup.CGROUP_FS / "memory"
    try:
        async with running_agent(containerd, tmp_path, cgroupRoot=root) as env:
            env.write("p.yaml", pod_manifest("p", container={"resources": {"requests": {"cpu": "250m"},
                                                                            "limits": {"memory": "64Mi"}}}))
            main = await env.wait_running("p")
            uid = env.uid_of("p")
            result = await env.client.exec_sync(main.id, ["cat", "/proc/self/cgroup"], timeout=10)
            assert result.exit_code == 0, result
            lines = result.stdout.decode().splitlines()
            memory = next(ln.split(":", 2)[2] for ln in lines if ln.split(":")[1] in ("memory", ""))
            assert memory.startswith(f"{root}/kubepods/burstable/pod{uid}/"), memory
            pod_dir = hierarchy / root.lstrip("/") / "kubepods" / "burstable" / f"pod{uid}"
            assert pod_dir.is_dir()
            # Both QoS tiers, as the kubelet's QoS container manager keeps them: BestEffort at the
            # minimum CPU shares, Burstable sized by its pods' requests (250m: 256 shares).
            assert (hierarchy / root.lstrip("/") / "kubepods" / "besteffort").is_dir()
            tiers = podcgroup.CGROUP_FS / "cpu" / root.lstrip("/") / "kubepods"
            if not podcgroup.unified():
                assert (tiers / "besteffort" / "cpu.shares").read_text().strip() == "2"
                assert (tiers / "burstable" / "cpu.shares").read_text().strip() == "256"
            env.remove("p.yaml")

            async def removed() -> bool:
                return not pod_dir.exists()

            await wait_for(removed, 60, f"{pod_dir} removed with the pod")
            if not podcgroup.unified():
                assert (tiers / "burstable" / "cpu.shares").read_text().strip() == "2"  # no Burstable pod left
    finally:
        for h in [hierarchy] if podcgroup.unified() else podcgroup.CGROUP_FS.iterdir():
            if (h / root.lstrip("/")).is_dir():
                podcgroup._rmdir_tree(h / root.lstrip("/"))  # best effort: an empty tree only
