"""Evented relisting (issue 15 §2): on a runtime that streams container events (containerd
2.x), a container's exit reaches the agent at once rather than at the next periodic relist; on
one that does not (containerd 1.6), periodic relisting carries on, said once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent_helpers import pod_manifest, running_agent, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.containerd]


async def test_an_exit_is_seen_without_waiting_for_the_next_relist(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        relister = env.agent.relister
        if containerd.runtime.name == "containerd1.6":
            await anyio.sleep(2)
            assert not relister.evented, "containerd 1.6 streams no events: periodic relisting only"
            pytest.skip("containerd 1.6 has no GetContainerEvents (checked: the relister falls back)")
        # The safety net out of the way: only an event can make it look now.
        relister._period = relister._evented_period = 30.0
        env.write("brief.yaml", pod_manifest("brief", command="sleep 3; exit 7", restartPolicy="Never"))
        running = await env.wait_running("brief")

        async def exited() -> Any:
            record = relister.pod(env.uid_of("brief") or "").latest("main")
            return record if record is not None and record.exited else None

        record = await wait_for(exited, 20, "the exit in the agent's view, long before a 30 s relist")
        seen = time.time()
        assert record.id == running.id and record.exit_code == 7
        assert relister.evented and relister.events_seen > 0 and relister.period == 30.0
        assert seen - record.finished_at / 1e9 < 5.0, "seen within seconds of the exit, not at the next relist"
