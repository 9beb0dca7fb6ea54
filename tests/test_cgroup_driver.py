"""The node's cgroup driver (issue 15 §6): the runtime's, from CRI RuntimeConfig, wins over the
configured cgroupDriver; a runtime without RuntimeConfig (containerd 1.6) falls back to the
configuration, as the kubelet does, and is counted in kubelet_cri_losing_support; a node whose
driver is systemd (which nodeagent does not implement) refuses pods instead of failing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from cri import CriError, RuntimeClient, Unimplemented
from cri import types as t
from nodeagent import cgroupdriver
from nodeagent.model import Pod
from nodeagent.unsupported import UNSUPPORTED_CGROUP_DRIVER, refusal
from tests.agent_helpers import pod_manifest, running_agent, wait_for

pytestmark = pytest.mark.anyio


class _Answers:
    def __init__(self, *answers: t.LinuxRuntimeConfiguration | None | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def runtime_config(self) -> t.LinuxRuntimeConfiguration | None:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def _no_sleep(_: float) -> None:
    pass


async def test_the_runtimes_answer_wins_and_unimplemented_falls_back_at_once() -> None:
    systemd = t.LinuxRuntimeConfiguration(cgroup_driver=t.CgroupDriver.SYSTEMD)
    cgroupfs = t.LinuxRuntimeConfiguration(cgroup_driver=t.CgroupDriver.CGROUPFS)
    assert await cgroupdriver.resolve(_Answers(systemd), "cgroupfs") == cgroupdriver.CgroupDriver("systemd", True)
    assert await cgroupdriver.resolve(_Answers(cgroupfs), "systemd") == cgroupdriver.CgroupDriver("cgroupfs", True)
    unimplemented = _Answers(Unimplemented("RuntimeConfig", "unix:///x", grpc.StatusCode.UNIMPLEMENTED,
                                           "unknown method"))
    fallback = await cgroupdriver.resolve(unimplemented, "systemd", sleep=_no_sleep)
    assert fallback == cgroupdriver.CgroupDriver("systemd", False, losing_support=True)
    assert unimplemented.calls == 1
    assert 'kubelet_cri_losing_support{version="1.38.0"} 1' in fallback.render_metrics()
    assert cgroupdriver.CgroupDriver("cgroupfs", True).render_metrics() == ""
    # Other errors are retried (the runtime may be starting), then the configuration is used.
    flaky = _Answers(CriError("RuntimeConfig", "unix:///x", grpc.StatusCode.UNKNOWN, "starting"), cgroupfs)
    assert await cgroupdriver.resolve(flaky, "systemd", sleep=_no_sleep) == cgroupdriver.CgroupDriver("cgroupfs", True)
    failing = _Answers(*(CriError("RuntimeConfig", "unix:///x", grpc.StatusCode.UNKNOWN, "down") for _ in range(3)))
    fell_back = await cgroupdriver.resolve(failing, "systemd", sleep=_no_sleep)
    assert fell_back == cgroupdriver.CgroupDriver("systemd", False)
    assert await cgroupdriver.resolve(_Answers(None), "cgroupfs") == cgroupdriver.CgroupDriver("cgroupfs", False)


def test_a_systemd_node_refuses_pods() -> None:
    pod = Pod.model_validate({"metadata": {"name": "p", "uid": "u"},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}})
    refused = refusal(pod, cgroup_driver="systemd")
    assert refused is not None and refused.reason == UNSUPPORTED_CGROUP_DRIVER
    assert "systemd cgroup driver" in refused.message
    assert refusal(pod, cgroup_driver="cgroupfs") is None


async def test_the_real_runtime_decides_over_the_configuration(containerd: Any, tmp_path: Path) -> None:
    # devenv's containerd runs runc with the cgroupfs driver. Configured systemd: on 2.x the
    # runtime's answer wins and pods run; on 1.6 (no RuntimeConfig) the configuration is all
    # there is, and the pods are refused, not failed in runc.
    async with RuntimeClient(containerd.endpoint) as client:
        try:
            answer: t.LinuxRuntimeConfiguration | None = await client.runtime_config()
        except Unimplemented:
            answer = None
    async with running_agent(containerd, tmp_path, cgroup_driver="systemd") as env:
        env.write("p.yaml", pod_manifest("p"))
        metrics = env.agent.metrics.render()
        if answer is not None:
            assert answer.cgroup_driver == t.CgroupDriver.CGROUPFS
            assert env.agent.cgroup_driver == cgroupdriver.CgroupDriver("cgroupfs", True)
            assert env.agent.configz()["cgroupDriver"] == "cgroupfs"  # the effective one, as the kubelet's
            await env.wait_running("p", 60)
            assert "kubelet_cri_losing_support" not in metrics
            return
        assert env.agent.cgroup_driver == cgroupdriver.CgroupDriver("systemd", False, losing_support=True)
        assert 'kubelet_cri_losing_support{version="1.38.0"} 1' in metrics

        async def refused() -> dict[str, Any] | None:
            status = env.status_of("p")
            return status if status.get("reason") else None

        status = await wait_for(refused, 30, "the pod refused")
        assert status["reason"] == UNSUPPORTED_CGROUP_DRIVER, status
