"""The kubelet's AppArmor admission (plugins/podsecurity.py): a pod asking for an AppArmor
profile on a host that cannot enforce one is refused before anything is made for it, with the
kubelet's reason and message (pkg/kubelet/lifecycle AppArmor admit handler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.model import Pod
from nodeagent.stages import Verdict
from plugins.podsecurity import APPARMOR, PodSecurity, SysctlAllowlist, apparmor_host_error

pytestmark = pytest.mark.anyio
NO_APPARMOR = "AppArmor is not enabled on the host"


def _pod(spec_sc: dict[str, Any] | None = None, container_sc: dict[str, Any] | None = None,
         annotations: dict[str, str] | None = None) -> Pod:
    container: dict[str, Any] = {"name": "c", "image": "i"}
    if container_sc is not None:
        container["securityContext"] = container_sc
    spec: dict[str, Any] = {"containers": [container]}
    if spec_sc is not None:
        spec["securityContext"] = spec_sc
    return Pod.model_validate({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                                            "annotations": annotations or {}}, "spec": spec})


@pytest.mark.parametrize("pod", [
    _pod(container_sc={"appArmorProfile": {"type": "RuntimeDefault"}}),
    _pod(spec_sc={"appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-apparmor-example"}}),
    _pod(annotations={"container.apparmor.security.beta.kubernetes.io/c": "localhost/k8s-apparmor-example"}),
])
async def test_a_profile_on_a_host_without_apparmor_is_refused_with_the_kubelets_words(pod: Pod) -> None:
    stage = PodSecurity(True, SysctlAllowlist([]), apparmor_host=NO_APPARMOR)
    result = await stage.admit(pod, None)  # type: ignore[arg-type]
    assert (result.verdict, result.reason, result.message) == (
        Verdict.REJECT, APPARMOR, f"Cannot enforce AppArmor: {NO_APPARMOR}")


@pytest.mark.parametrize("pod", [
    _pod(),
    _pod(container_sc={"appArmorProfile": {"type": "Unconfined"}}),
    _pod(annotations={"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}),
])
async def test_no_profile_or_unconfined_needs_nothing_from_the_host(pod: Pod) -> None:
    stage = PodSecurity(True, SysctlAllowlist([]), apparmor_host=NO_APPARMOR)
    assert (await stage.admit(pod, None)).verdict is Verdict.CONTINUE  # type: ignore[arg-type]


async def test_on_an_apparmor_host_an_empty_localhost_profile_is_refused() -> None:
    stage = PodSecurity(True, SysctlAllowlist([]), apparmor_host=None)
    assert (await stage.admit(_pod(container_sc={"appArmorProfile": {"type": "RuntimeDefault"}}),
                              None)).verdict is Verdict.CONTINUE  # type: ignore[arg-type]
    result = await stage.admit(_pod(container_sc={"appArmorProfile": {"type": "Localhost",
                                                                      "localhostProfile": " "}}), None)  # type: ignore[arg-type]
    assert result.reason == APPARMOR and "invalid empty AppArmor profile name" in result.message


def test_the_host_check_reads_the_kernels_switch(tmp_path: Path) -> None:
    assert apparmor_host_error(tmp_path) == NO_APPARMOR
    (tmp_path / "kernel/security/apparmor").mkdir(parents=True)
    (tmp_path / "module/apparmor/parameters").mkdir(parents=True)
    (tmp_path / "module/apparmor/parameters/enabled").write_text("N\n")
    assert apparmor_host_error(tmp_path) == NO_APPARMOR
    (tmp_path / "module/apparmor/parameters/enabled").write_text("Y\n")
    assert apparmor_host_error(tmp_path) is None
