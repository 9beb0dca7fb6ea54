"""Disk pressure end to end (issue 17 §3-4), against the real control plane: a size-limited
tmpfs holds the node's rootDir and its own containerd's root (one disk, as on most nodes) and a
pod fills it. The eviction stage reports DiskPressure (the lifecycle controller taints the
node), reclaims at node level first — the unused image goes, the periodic image GC being off —
and when the pod keeps writing, evicts it (the lowest-ranked: over its request), never the quiet
pod; once the space is back the condition clears after the transition period, and the taint
with it."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from controlplane import ControlPlane
from tests.agent_helpers import wait_for
from tests.private_runtime import blob_image, mounted_tmpfs, private_containerd
from tests.test_cluster_node import (
    cleanup_node,
    cluster_agent,
    cluster_config,
    condition,
    delete_node,
    get_json,
)
from tests.test_cluster_pods import api_pod, create_pod, wait_running
from tests.test_eviction import _condition_true, _tainted, wait_phase

pytestmark = pytest.mark.anyio

MB = 1_000_000
# Writes 10 MB every half second, 300 MB in all (on a disk that never runs out: the unused
# image's space comes back in between), then stays.
FILLER = ("i=0; while [ $i -lt 30 ]; do i=$((i+1)); head -c 10000000 /dev/zero > /data/f$i || true; sleep 0.5; "
          "done; sleep 3600")


async def test_disk_pressure_reclaims_images_first_then_evicts_the_filler(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    unused = f"localhost/disk-unused:{uuid.uuid4().hex[:8]}"
    with mounted_tmpfs("400M") as disk:
        images = [blob_image(tmp_path, unused, 60 * MB)]
        with private_containerd(disk / "c", *images) as runtime:
            config = await cluster_config(
                cp, runtime, disk / "agent", volume_stats_agg_period=1.0,
                plugins={
                    "eviction": {"evictionMonitoringPeriod": "1s", "evictionPressureTransitionPeriod": "5s",
                                 "evictionHard": {"memory.available": "100Mi", "nodefs.available": "150Mi",
                                                  "imagefs.available": "150Mi"}},
                    # Periodic image GC off: only eviction's node-level reclaim removes images.
                    "gc": {"imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 0,
                           "imageMinimumGCAge": "1s"},
                })
            node = config.node_name
            try:
                async with cluster_agent(cp, runtime, config) as env:
                    try:
                        await _fill(cp, env, runtime, node, unused)
                    finally:
                        await cleanup_node(cp, env)
            finally:
                await delete_node(cp, node)


async def _fill(cp: ControlPlane, env: Any, runtime: Any, node: str, unused: str) -> None:
    await wait_for(lambda: _condition_true(cp, node, "Ready"), 60, "the node Ready")
    suffix = uuid.uuid4().hex[:6]
    quiet = api_pod(f"quiet-{suffix}", node)
    quiet["spec"]["containers"][0]["resources"] = {"requests": {"ephemeral-storage": "50Mi"}}
    await create_pod(cp, quiet)
    quiet_uid = (await wait_running(cp, quiet["metadata"]["name"]))["metadata"]["uid"]
    filler = api_pod(f"filler-{suffix}", node, FILLER)
    filler["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    filler["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    await create_pod(cp, filler)
    filler_uid = (await wait_running(cp, filler["metadata"]["name"]))["metadata"]["uid"]
    eviction = env.agent.pipeline.stages["eviction"].manager
    gc = env.agent.pipeline.stages["gc"].images

    pressured = await wait_for(lambda: _condition_true(cp, node, "DiskPressure"), 60, "DiskPressure on the Node")
    assert condition(pressured, "DiskPressure")["reason"] == "KubeletHasDiskPressure"
    evicted = await wait_phase(cp, filler["metadata"]["name"], "Failed", timeout=120)
    assert evicted["status"]["reason"] == "Evicted"
    assert evicted["status"]["message"].startswith("The node was low on resource: ephemeral-storage. ")

    # Node-level reclaim came first: the unused image went before any pod did.
    left = {n for i in await env.client.list_images() for n in i.repo_tags}
    assert unused not in left and "registry.k8s.io/pause:3.10" in left
    assert gc.removed_at and eviction.evicted_at
    assert max(gc.removed_at.values()) < eviction.evicted_at[0], "the image was removed before the eviction"
    assert eviction.history == [(filler_uid, "nodefs.available")], "only the filler, the lowest-ranked pod"
    assert (await get_json(cp, "pod", quiet["metadata"]["name"]))["status"]["phase"] == "Running"
    assert quiet_uid not in [uid for uid, _ in eviction.history]
    await wait_for(lambda: _tainted(cp, node, "node.kubernetes.io/disk-pressure"), 60,
                   "the node lifecycle controller's disk-pressure taint")

    # The evicted pod's emptyDir is gone with its volumes: the pressure ends, and after the
    # transition period (5 s) the condition, then the taint.
    await wait_for(lambda: _condition_false(cp, node, "DiskPressure"), 90, "DiskPressure cleared")
    assert time.time() - eviction.evicted_at[0] >= 5, "not before the transition period"
    await wait_for(lambda: _untainted(cp, node, "node.kubernetes.io/disk-pressure"), 90, "the taint removed")


async def _condition_false(cp: ControlPlane, node: str, kind: str) -> bool:
    obj = await get_json(cp, "node", node)
    return condition(obj, kind).get("status") == "False"


async def _untainted(cp: ControlPlane, node: str, key: str) -> bool:
    return not await _tainted(cp, node, key)

