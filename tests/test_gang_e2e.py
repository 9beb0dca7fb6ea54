"""The gang end to end (issue 20), sized for CI: the real kube-scheduler places a
Workload/PodGroup gang (scheduling.k8s.io, the GangScheduling plugin) whose members each claim
every fake GPU of a node through a ResourceClaimTemplate; nodeagent on each node (its own
process, its own private containerd, the fake GPU DRA driver publishing the node's devices)
prepares the devices and starts the bound members together or not at all.

The harness is benchmarks/gang_cluster.py (the same one ``python -m benchmarks.gang --nodes 8
--gpus 8`` measures with). What ran where is read from each node's own CRI and the driver's state
on disk (a monitor every 100 ms), not from the agents' bookkeeping:

* all or nothing: a member's container ran only if every member's did, each once, none before
  the last member's sandbox existed;
* each GPU prepared for at most one claim at a time (the driver's CDI specs);
* after the gang goes: no sandbox, no prepared claim (driver), no DRA checkpoint entry, on any node.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any
from pathlib import Path

import anyio
import pytest

from benchmarks.gang_cluster import GangCluster, Member, gang_cluster, private_runtimes, until
from controlplane import ControlPlane
from nodeagent.objects import kinds

pytestmark = pytest.mark.anyio

NODES = 2
GPUS = 2
TIMEOUT = 8
"""The gang's bound hold (the gang stage's timeoutSeconds; graceSeconds is 5)."""
BARRIER = os.environ.get("NODEAGENT_GANG_E2E_BARRIER", "1") != "0"
"""NODEAGENT_GANG_E2E_BARRIER=0 runs the agents without the gang stage: each test must fail then."""


@pytest.fixture
async def cluster(control_plane: ControlPlane, request: pytest.FixtureRequest) -> AsyncIterator[GangCluster]:
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    workdir = Path(tempfile.mkdtemp(prefix="ge2e-", dir="/tmp"))
    async with private_runtimes(NODES, keep=lambda: request.session.testsfailed > 0) as runtimes, \
            gang_cluster(control_plane, runtimes, GPUS, workdir, {"timeoutSeconds": TIMEOUT}, barrier=BARRIER) as c:
        yield c


async def _released(c: GangCluster, pods: list[str]) -> None:
    await until(lambda: _true(c.quiet(pods)), 60, lambda: f"nothing of the gang held on any node: {c.held()}")


async def _true(value: bool) -> bool:
    return value


async def test_the_scheduler_places_the_gang_and_every_node_starts_its_members_together(
        cluster: GangCluster) -> None:
    c = cluster
    # The gang stage reads the version the API server serves.
    assert c.version in kinds.POD_GROUP.versions and c.version in kinds.WORKLOAD.versions
    gang = await c.create_gang(NODES, create=NODES - 1)
    # The scheduler's gang: with fewer members than minCount nobody is bound.
    await anyio.sleep(3)
    assert not any(c.pods[m].bound for m in gang.members), "the scheduler bound part of the gang"
    await c.add_members(gang, range(NODES - 1, NODES))
    members = list(gang.members)

    async def all_running() -> bool:
        return all(c.pods[m].running for m in members)

    await until(all_running, 120, "every member Running")
    await anyio.sleep(0.3)
    # The scheduler placed them (no spec.nodeName in what we created), one per node: each
    # member claims all of a node's GPUs.
    assert sorted(c.pods[m].node for m in members) == sorted(n.name for n in c.nodes)
    started = c.check_all_or_nothing(members)
    assert len(started) == NODES
    # The one commit record, on the coordinator (the smallest name); the others followed it.
    records = [m for m in members if c.pods[m].record]
    assert records == [members[0]], records
    assert c.pods[members[0]].record["reason"] == "GangQuorumReached"
    for node in c.nodes:
        assert sum(len(d) for d in node.prepared.values()) == GPUS, node.prepared
    assert not c.violations, c.violations

    await c.delete_gang(gang)
    await _released(c, members)
    assert not c.violations, c.violations


def _failed(c: GangCluster, pods: list[str]) -> Any:
    async def check() -> bool:
        return all(c.pods[m].failed for m in pods)
    return check


@pytest.mark.parametrize("coordinator", ["broken", "healthy"])
async def test_a_driver_that_fails_to_prepare_on_one_node_starts_no_member_anywhere(
        cluster: GangCluster, coordinator: str) -> None:
    """(a) One node's driver fails NodePrepareResources: that member never reaches the barrier,
    the others hold their devices for the gang's bounded time only, nothing runs anywhere, every
    member fails with the gang's reason and everything is released; once the driver recovers,
    the controller's next generation of the gang starts as a whole. The coordinator (member 0)
    is sent to the broken node (it never decides: the others release themselves at their votes'
    expiry plus grace) or to a healthy one (it times the gang out)."""
    c = cluster
    broken = c.nodes[1]
    assert broken.driver is not None
    broken.driver.fail = "prepare"
    gang = await c.create_gang(NODES, on={0: (broken if coordinator == "broken" else c.nodes[0]).name})
    members = list(gang.members)
    await until(lambda: _true(all(c.pods[m].bound for m in members)), 60, "every member bound")
    healthy = [m for m in members if c.pods[m].node != broken.name]
    stuck = [m for m in members if c.pods[m].node == broken.name]
    assert len(stuck) == 1 and healthy
    # The healthy members prepare (their devices), vote, and are released within the gang's
    # bound: its timeout, plus the grace when the stuck member is the coordinator.
    await until(lambda: _true(all(c.pods[m].voted for m in healthy) or bool(c.started(members))), 60,
                "the healthy members voted")
    assert not c.started(members), "a member ran while another could not prepare its devices"
    voted = max(c.pods[m].voted for m in healthy)
    await until(_failed(c, healthy), TIMEOUT + 5 + 30, "the healthy members released")
    for m in healthy:
        assert c.pods[m].failed - voted <= TIMEOUT + 5 + 10, (c.pods[m].failed - voted)
        assert c.pods[m].reason in ("GangAdmissionTimeout", "GangAborted"), (c.pods[m].reason, c.pods[m].message)
    await until(lambda: _true(c.quiet(healthy)), 30,
                lambda: f"the healthy members' devices and sandboxes released: {c.held()}")
    pod = c.pods[stuck[0]].pod
    assert pod["status"]["phase"] == "Pending" and pod["status"].get("reason") == "FailedPrepareDynamicResources", \
        pod["status"]
    assert not c.started(members), "a member ran while another could not prepare its devices"

    # The driver recovers: the stuck member prepares, reaches the barrier, finds the gang
    # ended, and fails too; its claim is unprepared.
    broken.driver.fail = "none"
    await until(_failed(c, stuck), 60, "the stuck member failed at the barrier")
    assert c.pods[stuck[0]].reason in ("GangAborted", "GangAdmissionTimeout"), c.pods[stuck[0]].message
    assert not c.started(members), "a member of the ended gang ran"
    await c.kubectl("delete", "pods", "-l", f"gang-e2e={gang.name}", "--wait=false")
    await _released(c, members)

    # The controller's part: a new generation of the same PodGroup starts as a whole.
    again = await c.add_members(gang, range(NODES, 2 * NODES))
    await until(lambda: _true(all(c.pods[m].running for m in again)), 120, "the new generation Running")
    await anyio.sleep(0.3)
    assert len(c.check_all_or_nothing(again)) == NODES
    assert not c.started(members)
    assert not c.violations, c.violations
    await c.delete_gang(gang)
    await _released(c, again)
