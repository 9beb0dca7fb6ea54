"""cgroupsPerQOS, the kubelet's field: with it (the default) every pod gets a cgroup under the
agent's QoS hierarchy; without it none is made, so the agent needs nothing under /sys/fs/cgroup
(the root-free contract suite runs it so)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

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
    assert AgentConfig().cgroups_per_qos is True
    path = tmp_path / "config.yaml"
    path.write_text("cgroupsPerQOS: false\n")
    assert load(path).cgroups_per_qos is False
    path.write_text("cgroupsPerQos: false\n")
    with pytest.raises(ConfigError, match="cgroupsPerQos"):
        load(path)


def test_without_cgroups_per_qos_the_sandbox_has_no_pod_cgroup(tmp_path: Path) -> None:
    pod = _pod()
    on = sandbox_config(pod, 0, tmp_path, "node", settings=AgentConfig())
    off = sandbox_config(pod, 0, tmp_path, "node", settings=AgentConfig.model_validate({"cgroupsPerQOS": False}))
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
    off = AgentConfig.model_validate({"cgroupsPerQOS": False})
    await podcgroup.apply(cast(PodContext, SimpleNamespace(settings=off)), pod)
    assert not (tmp_path / "nodeagent-pods/burstable/podu-1").exists()
    await podcgroup.apply(cast(PodContext, SimpleNamespace(settings=AgentConfig())), pod)
    assert (tmp_path / "nodeagent-pods/burstable/podu-1/memory.max").read_text() == str(64 * 2**20)
