"""The walkthrough stage's unit test: no runtime, the shared fake pod context."""

from __future__ import annotations

import pytest
from node_env import VARIABLE, plugin

from conformance.fakecontext import FakePodContext
from nodeagent.model import Pod
from nodeagent.stages import Verdict

pytestmark = pytest.mark.anyio

POD = Pod.model_validate({"metadata": {"name": "web", "uid": "u1"},
                          "spec": {"containers": [{"name": "main", "image": "busybox"},
                                                  {"name": "side", "image": "busybox"}]}})


async def test_every_container_gets_the_zone_and_loses_it_again() -> None:
    stage = plugin({"zone": "eu-1"}, handle=None)
    ctx = FakePodContext(POD)
    assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE
    assert ctx.additions.merged("main").envs == {VARIABLE: "eu-1"}
    assert ctx.additions.merged("side").envs == {VARIABLE: "eu-1"}
    assert (await stage.prepare(ctx)).verdict is Verdict.CONTINUE  # again: the same, once
    assert ctx.additions.merged("main").envs == {VARIABLE: "eu-1"}
    await stage.unprepare(ctx)
    assert ctx.additions.merged("main").envs == {}
    await stage.unprepare(ctx)  # undo is idempotent


def test_the_zone_is_required() -> None:
    with pytest.raises(ValueError, match="zone"):
        plugin({}, handle=None)
