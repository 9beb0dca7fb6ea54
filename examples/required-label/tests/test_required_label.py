"""Unit tests of the stage (no runtime needed), then the contract every stage plugin passes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError
from required_label import REASON, RequiredLabel, RequiredLabelConfig, plugin

from conformance.contract import StageContract
from conformance.harness import Harness
from nodeagent.model import Pod
from nodeagent.stages import NodeInfo, NodeView, Verdict

NODE = NodeView(node=NodeInfo(name="node-a", ip="127.0.0.1", allocatable={"pods": 110}), admitted=[])


def pod(**labels: str) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    })


@pytest.mark.anyio
async def test_admits_a_pod_with_the_label() -> None:
    stage = RequiredLabel(RequiredLabelConfig(label="team"))
    assert (await stage.admit(pod(team="storage"), NODE)).verdict is Verdict.CONTINUE
    assert (await stage.admit(pod(team=""), NODE)).verdict is Verdict.CONTINUE  # any value will do


@pytest.mark.anyio
async def test_rejects_a_pod_without_it_and_says_why() -> None:
    result = await RequiredLabel(RequiredLabelConfig(label="team")).admit(pod(app="web"), NODE)
    assert result.verdict is Verdict.REJECT
    assert result.reason == REASON
    assert "shop/web" in result.message and "'team'" in result.message and "node-a" in result.message


@pytest.mark.parametrize("config", [{}, {"label": ""}, {"label": "team", "typo": 1}])
def test_a_bad_configuration_fails_when_the_agent_loads(config: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        plugin(config, handle=None)  # type: ignore[arg-type]


class TestRequiredLabelContract(StageContract):
    plugin = "requiredlabel"
    config: ClassVar[Mapping[str, Any]] = {"label": "team"}

    def pods(self, harness: Harness) -> list[Pod]:
        return [harness.pod(labels={"team": "storage"}), harness.pod()]  # CONTINUE and REJECT
