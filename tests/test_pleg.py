"""The relister (PLEG) against the real containerd: the facts it publishes about containers."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from cri import RuntimeClient
from nodeagent import labels as L
from nodeagent.events import ContainerExited, ContainerStarted, Event
from nodeagent.pleg import Relister
from tests.test_cri_client import TIMEOUT, Pods, wait_exited

pytestmark = pytest.mark.anyio


async def test_a_container_that_ran_between_two_listings_is_reported_started(
        containerd: Any, tmp_path: Path) -> None:
    # The kubelet's Started event must not depend on a listing catching the container running:
    # one that started and exited in between did start, and the relister says so first.
    node = f"pleg-{uuid.uuid4().hex[:6]}"
    published: list[Event] = []

    async def publish(event: Event) -> None:
        published.append(event)

    async with RuntimeClient(containerd.endpoint, timeout=TIMEOUT) as client:
        pods = Pods(client, tmp_path)
        try:
            config = pods.sandbox_config()
            config = dataclasses.replace(config, labels={**config.labels, L.MANAGED_BY: node})
            sandbox_id = await client.run_pod_sandbox(config)
            pods.sandboxes.append(sandbox_id)
            quick = await pods.container(sandbox_id, config, "true", name="quick")
            never = await pods.container(sandbox_id, config, "true", name="never", start=False)
            await wait_exited(client, quick)

            relister = Relister(client, node, publish)
            await relister.relist_once()
        finally:
            await pods.cleanup()

    kinds = [(type(e).__name__, getattr(e, "container_id", "")) for e in published
             if isinstance(e, ContainerStarted | ContainerExited)]
    assert kinds == [("ContainerStarted", quick), ("ContainerExited", quick)]
    assert never not in {cid for _, cid in kinds}  # created, never started: no such fact
