"""The task dump (nodeagent.taskdump): SIGUSR1 makes a running agent write where every task
waits, and a stop that hangs ends in a dump and an exit instead of a process that never goes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodeagent import taskdump
from tests.agent_helpers import pod_manifest, wait_for
from tests.test_agent_crash import _start_agent as start_agent

pytestmark = pytest.mark.anyio


async def _waits_deep_inside(event: anyio.Event) -> None:
    await _one_level_down(event)


async def _one_level_down(event: anyio.Event) -> None:
    await event.wait()


async def test_the_dump_shows_where_each_task_waits_not_only_its_entry_point() -> None:
    event = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_waits_deep_inside, event, name="deep-waiter")
        await anyio.sleep(0.05)
        text = taskdump.render_tasks()
        event.set()
    block = text.split("task 'deep-waiter' pending", 1)[1].split("\ntask ", 1)[0]
    # asyncio's own Task.get_stack() stops at _waits_deep_inside; the chain goes down to the event.
    assert "in _waits_deep_inside" in block and "in _one_level_down" in block, text
    assert "await event.wait()" in block and "awaiting" in block, block


async def test_sigusr1_writes_a_dump_and_the_agent_runs_on(containerd: Any, tmp_path: Path) -> None:
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "p.json").write_text(json.dumps(pod_manifest("dumped")))
    agent = start_agent(tmp_path, containerd.endpoint, f"dump{os.getpid() % 10000}")
    log = tmp_path / "agent-0.log"
    debug = tmp_path / "root" / taskdump.DEBUG_DIR
    try:
        status = tmp_path / "root" / "pod-status"

        def running() -> bool:
            return any(json.loads(f.read_text())["status"].get("phase") == "Running" for f in status.glob("*.json"))

        await wait_for(lambda: anyio.to_thread.run_sync(running), timeout=60, what="the pod running")
        agent.send_signal(signal.SIGUSR1)
        dumps: list[Path] = await wait_for(lambda: anyio.to_thread.run_sync(lambda: list(debug.glob("tasks-*.txt"))),
                                           timeout=20, what="a task dump")
        await anyio.sleep(0.5)  # written in one go; let it finish
        text = dumps[0].read_text()
        assert "(SIGUSR1)" in text and "threads:" in text, text[:2000]
        # The pod's worker and the supervised tasks are there, each with where it waits.
        assert "pod:" in text or "worker" in text, text[:4000]
        assert "nodeagent/" in text and "awaiting" in text, text[:4000]
        assert oct(debug.stat().st_mode & 0o777) == "0o700"
        assert agent.poll() is None, "SIGUSR1 stopped the agent"
        assert "task dump written" in log.read_text()
    finally:
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(40)
    assert code == 0, log.read_text()[-3000:]


STUCK_AGENT = textwrap.dedent('''
    # A test double of the agent whose stop never finishes (a shielded wait): the real
    # run_forever around it must give up after its bound, with a dump saying where it hung.
    import sys, types
    from pathlib import Path
    import anyio
    import nodeagent.agent as agent_module

    class HangsOnStop:
        def __init__(self, config, verbose=False, certificates=None):
            self.ready = anyio.Event()  # never set: it never gets ready either

        async def run(self):
            with anyio.CancelScope(shield=True):
                await self.never_returns()

        async def never_returns(self):
            print("ready", flush=True)
            await anyio.sleep(3600)

    agent_module.Agent = HangsOnStop
    agent_module.SHUTDOWN_TIMEOUT_SECONDS = float(sys.argv[2])
    config = types.SimpleNamespace(kubeconfig=None, root_dir=Path(sys.argv[1]))
    anyio.run(agent_module.run_forever, config)
''')


@pytest.mark.parametrize("second_signal", [False, True], ids=["bound", "second-signal"])
def test_a_stop_that_hangs_ends_in_a_dump_and_an_exit(tmp_path: Path, second_signal: bool) -> None:
    bound = 60.0 if second_signal else 1.0
    proc = subprocess.Popen([sys.executable, "-c", STUCK_AGENT, str(tmp_path), str(bound)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGTERM)
    if second_signal:
        time.sleep(0.5)
        assert proc.poll() is None, "the first SIGTERM should only start the stop"
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(20)
    output = proc.stdout.read().decode()
    assert code == 1, output
    assert "exiting without a clean stop" in output, output
    dumps = list((tmp_path / taskdump.DEBUG_DIR).glob("tasks-*.txt"))
    assert len(dumps) == 1, output
    assert "in never_returns" in dumps[0].read_text()


def test_old_dumps_are_pruned(tmp_path: Path) -> None:
    debug = tmp_path / taskdump.DEBUG_DIR
    debug.mkdir()
    for i in range(taskdump.KEEP_DUMPS + 5):
        (debug / f"tasks-20260101T0000{i:02}Z-1.txt").write_text("old")

    async def dump() -> Path:
        return taskdump.write_dump(tmp_path, "test")

    newest = anyio.run(dump)
    kept = sorted(debug.glob("tasks-*.txt"))
    assert len(kept) == taskdump.KEEP_DUMPS and newest in kept
