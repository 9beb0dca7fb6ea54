"""The static pod source's inotify watch (nodeagent/sources/dirwatch.py): a manifest written
into the directory is scanned at once, not at the next poll; a directory that is not there yet
is polled until it is, then watched; one removed and made again is watched again."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodeagent import events as ev
from nodeagent.sources import static
from nodeagent.sources.dirwatch import DirectoryWatch
from tests.agent_helpers import pod_manifest, wait_for

pytestmark = pytest.mark.anyio


async def test_a_change_wakes_the_watch_and_quiet_times_out(tmp_path: Path) -> None:
    watch = DirectoryWatch(tmp_path)
    try:
        assert watch.arm() and watch.active
        assert not await watch.wait(0.05), "nothing changed"
        async with anyio.create_task_group() as tg:
            async def write() -> None:
                await anyio.sleep(0.05)
                (tmp_path / "a.yaml").write_text("x")

            tg.start_soon(write)
            t0 = time.monotonic()
            assert await watch.wait(10)
            assert time.monotonic() - t0 < 5
    finally:
        watch.close()


async def test_a_missing_directory_is_watched_once_it_exists_and_again_after_it_is_remade(tmp_path: Path) -> None:
    directory = tmp_path / "manifests"
    watch = DirectoryWatch(directory)
    try:
        assert not watch.arm() and not await watch.wait(0.01)  # polled meanwhile
        directory.mkdir()
        assert watch.arm()
        directory.rmdir()
        assert await watch.wait(5)  # the directory's own removal
        assert not watch.active
        directory.mkdir()
        assert watch.arm()
    finally:
        watch.close()


async def test_a_new_manifest_is_observed_without_waiting_for_a_poll(tmp_path: Path) -> None:
    """Polling is out of the way (an hour): only the watch can make the source look."""
    published: list[ev.Event] = []

    async def publish(event: ev.Event) -> None:
        published.append(event)

    source = static.StaticPodSource(tmp_path, "node1", publish, poll_seconds=3600, watched_poll_seconds=3600)

    async def observed() -> bool:
        return any(isinstance(e, ev.PodSpecObserved) for e in published)

    async with anyio.create_task_group() as tg:
        await tg.start(source.run)
        (tmp_path / "a.yaml").write_text(json.dumps(pod_manifest("a")))
        await wait_for(observed, 10, "the new manifest's pod observed")
        (tmp_path / "a.yaml").unlink()

        async def deleted() -> Any:
            return any(isinstance(e, ev.PodDeletionRequested) for e in published)

        await wait_for(deleted, 10, "the removed manifest's pod asked to go")
        tg.cancel_scope.cancel()
