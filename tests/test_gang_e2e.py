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
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from benchmarks.gang_cluster import (
    GangCluster,
    gang_cluster,
    start_runtimes,
    stop_runtimes,
    until,
)
from controlplane import ControlPlane
from devenv import Containerd
from nodeagent.objects import kinds

pytestmark = pytest.mark.anyio

NODES = 2
GPUS = 2
TIMEOUT = 8
"""The gang's bound hold (the gang stage's timeoutSeconds; graceSeconds is 5) in the tests that
inject a failure and wait for the hold to release the healthy members."""
STEADY_TIMEOUT = 60
"""The hold in the tests whose gang must start (``@pytest.mark.gang_hold(STEADY_TIMEOUT)``):
generous, so that a machine loaded by the other worker (a Go build of e2e.test in CI takes both
cores for minutes) cannot time out a gang whose members prepare 8 s apart."""
WIDE_NODES = 8
WIDE_GPUS = 1
"""The 8-node test: one fake GPU per node (CI's two cores run 8 agents and 8 containerds)."""
WIDE_TIMEOUT = 60
"""Its gang's bound hold: generous, the happy path must not time out on a loaded machine."""
BARRIER = os.environ.get("NODEAGENT_GANG_E2E_BARRIER", "1") != "0"
"""NODEAGENT_GANG_E2E_BARRIER=0 runs the agents without the gang stage: each test must fail then."""


@pytest.fixture(scope="module")
def runtimes(request: pytest.FixtureRequest) -> Iterator[list[Containerd]]:
    """The machines' containerds, shared by the module's tests (each test has its own nodes and
    agents, and leaves the runtimes empty); kept with their logs if a test failed."""
    envs = start_runtimes(NODES)
    try:
        yield envs
    finally:
        stop_runtimes(envs, keep=request.session.testsfailed > 0)


@pytest.fixture
async def cluster(control_plane: ControlPlane, runtimes: list[Containerd],
                  request: pytest.FixtureRequest) -> AsyncIterator[GangCluster]:
    hold = request.node.get_closest_marker("gang_hold")
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    workdir = Path(tempfile.mkdtemp(prefix="ge2e-", dir="/tmp"))
    async with gang_cluster(control_plane, runtimes, GPUS, workdir,
                            {"timeoutSeconds": hold.args[0] if hold else TIMEOUT},
                            barrier=BARRIER) as c:
        yield c
    if request.session.testsfailed == 0:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def runtimes8(request: pytest.FixtureRequest) -> Iterator[list[Containerd]]:
    """Eight machines' containerds for the one 8-node test (defined first in the module, so
    they are stopped before the 2-node ones start: never ten daemons on CI's two cores)."""
    t0 = time.monotonic()
    envs = start_runtimes(WIDE_NODES)
    print(f"8 containerds started in {time.monotonic() - t0:.1f}s")
    try:
        yield envs
    finally:
        stop_runtimes(envs, keep=request.session.testsfailed > 0)


@pytest.fixture
async def cluster8(control_plane: ControlPlane, runtimes8: list[Containerd],
                   request: pytest.FixtureRequest) -> AsyncIterator[GangCluster]:
    workdir = Path(tempfile.mkdtemp(prefix="ge2e8-", dir="/tmp"))
    t0 = time.monotonic()
    async with gang_cluster(control_plane, runtimes8, WIDE_GPUS, workdir, {"timeoutSeconds": WIDE_TIMEOUT},
                            barrier=BARRIER) as c:
        print(f"8 agents and drivers Ready in {time.monotonic() - t0:.1f}s; "
              f"agents' CPU {sum(n.cpu_seconds() for n in c.nodes):.1f}s")
        yield c
        print(f"agents' CPU at the end {sum(n.cpu_seconds() for n in c.nodes):.1f}s")
        t0 = time.monotonic()
    print(f"8-node cluster closed in {time.monotonic() - t0:.1f}s")
    if request.session.testsfailed == 0:
        shutil.rmtree(workdir, ignore_errors=True)


async def _released(c: GangCluster, pods: list[str]) -> None:
    await until(lambda: _true(c.quiet(pods)), 60, lambda: f"nothing of the gang held on any node: {c.held()}")


async def _true(value: bool) -> bool:
    return value


GANG_REASONS = frozenset({"WaitingForGang", "GangCommitted", "GangQuorumReached", "GangAborted",
                          "GangAdmissionTimeout", "GangLocalAdmissionFailed", "GangPartialStart"})
NORMAL_REASONS = frozenset({"WaitingForGang", "GangCommitted", "GangQuorumReached"})


async def _gang_events(c: GangCluster, wanted: dict[str, list[str]], *, exact: bool = True,
                       timeout: float = 30) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Wait until each member carries the gang Events ``wanted`` (pod -> reasons, one entry per
    Event), as the API server has them: exactly those (``exact``), or at least those. Every gang
    Event found must be one Event (count 1) from the kubelet on the member's node, of the type its
    reason has, saying the gang and the generation. Returns pod -> reason -> Events."""
    last: dict[str, list[dict[str, Any]]] = {}
    every: dict[str, list[str]] = {}

    def reasons(pod: str) -> list[str]:
        return sorted(e["reason"] for e in last[pod])

    async def arrived() -> bool:
        got = await c.pod_events(list(wanted))
        last.clear()
        last.update({p: [e for e in events if e["reason"] in GANG_REASONS] for p, events in got.items()})
        every.update({p: [e["reason"] for e in events] for p, events in got.items()})
        return all(not Counter(want) - Counter(reasons(p)) for p, want in wanted.items())

    await until(arrived, timeout, lambda: f"the members' gang Events {wanted}; the API has {every}", interval=0.5)
    found: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for pod, want in wanted.items():
        if exact:
            assert reasons(pod) == sorted(want), (pod, reasons(pod))  # one Event per fact, nothing else
        gang = pod.rsplit("-", 1)[0]
        for event in last[pod]:
            assert event["type"] == ("Normal" if event["reason"] in NORMAL_REASONS else "Warning"), event
            assert event["count"] == 1, event
            assert event["source"] == {"component": "kubelet", "host": c.pods[pod].node}, event
            assert f"gang default/{gang}" in event["message"].lower() and "(generation " in event["message"], event
            found.setdefault(pod, {}).setdefault(event["reason"], []).append(event)
    return found


async def test_eight_nodes_the_scheduler_places_a_gang_of_eight_and_all_start_together(
        cluster8: GangCluster) -> None:
    """The issue's shape at CI size: 8 nodes (one GPU each), a gang of 8 with minCount 8. The
    scheduler holds 7 members unbound, then places all 8, one per node (each claims its node's
    only GPU); every node's runtime shows each member's container started once, none before the
    last member's sandbox existed; one coordinator's record; everything released afterwards."""
    c = cluster8
    t0 = time.monotonic()
    gang = await c.create_gang(WIDE_NODES, create=WIDE_NODES - 1)
    await anyio.sleep(3)
    assert not any(c.pods[m].bound for m in gang.members), "the scheduler bound part of the gang"
    await c.add_members(gang, range(WIDE_NODES - 1, WIDE_NODES))
    members = list(gang.members)
    await until(lambda: _true(all(c.pods[m].running for m in members)), 240, "all 8 members Running")
    print(f"gang of 8 created → all Running in {time.monotonic() - t0:.1f}s")
    await anyio.sleep(0.3)
    assert sorted(c.pods[m].node for m in members) == sorted(n.name for n in c.nodes)
    assert len(c.check_all_or_nothing(members)) == WIDE_NODES
    records = [m for m in members if c.pods[m].record]
    assert records == [members[0]], records
    assert c.pods[members[0]].record["reason"] == "GangQuorumReached"
    for node in c.nodes:
        assert sum(len(d) for d in node.prepared.values()) == WIDE_GPUS, node.prepared
    assert not c.violations, c.violations
    events = await _gang_events(c, {m: ["WaitingForGang", "GangCommitted", *(["GangQuorumReached"] if m == members[0]
                                                                              else [])] for m in members})
    assert "8 of 8 votes" in events[members[0]]["GangQuorumReached"][0]["message"]
    assert all("8 of 8 members were prepared" in events[m]["GangCommitted"][0]["message"] for m in members), events
    t0 = time.monotonic()
    await c.delete_gang(gang)
    await _released(c, members)
    print(f"gang of 8 deleted → released on every node in {time.monotonic() - t0:.1f}s")
    assert not c.violations, c.violations


@pytest.mark.gang_hold(STEADY_TIMEOUT)
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
    # What `kubectl describe pod` shows: each member's wait and commit, the coordinator's record.
    events = await _gang_events(c, {members[0]: ["WaitingForGang", "GangQuorumReached", "GangCommitted"],
                                    members[1]: ["WaitingForGang", "GangCommitted"]})
    assert "1 of 2 members prepared on this node" in events[members[1]]["WaitingForGang"][0]["message"]
    assert "2 of 2 votes" in events[members[0]]["GangQuorumReached"][0]["message"]
    assert "2 of 2 members were prepared" in events[members[1]]["GangCommitted"][0]["message"]

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
    if coordinator == "broken":
        # No record was written (its coordinator never prepared): the stuck member keeps
        # retrying its preparation, Pending with the DRA reason, until the driver recovers.
        assert pod["status"]["phase"] == "Pending" and \
            pod["status"].get("reason") == "FailedPrepareDynamicResources", pod["status"]
    else:
        # The coordinator's abort record reaches the broken node too: its member, still retrying
        # its preparation, is failed by the abort at once, and its node released, while the
        # driver still fails.
        await until(_failed(c, stuck), 30, "the stuck member failed by the gang's abort")
        assert broken.driver.fail == "prepare"
        await until(lambda: _true(c.quiet(stuck)), 30, lambda: f"the stuck member's node released: {c.held()}")
    assert not c.started(members), "a member ran while another could not prepare its devices"

    # The driver recovers: a stuck member prepares, reaches the barrier, finds the gang ended,
    # and fails too; its claim is unprepared.
    broken.driver.fail = "none"
    await until(_failed(c, stuck), 60, "the stuck member failed at the barrier")
    assert c.pods[stuck[0]].reason in ("GangAborted", "GangAdmissionTimeout"), c.pods[stuck[0]].message
    assert not c.started(members), "a member of the ended gang ran"
    # Each member's Events say it (kubectl describe pod): the healthy ones waited, then were
    # released with their pod's reason; the stuck one was released when it came; no commit.
    # A coordinator that records the abort says so in an Event of the same reason, which may
    # reach the API before its own release's (the suite at 83a7561 read the Events then).
    async def releases_told() -> dict[str, dict[str, list[dict[str, Any]]]] | None:
        events = await _gang_events(c, {m: [*(["WaitingForGang"] if m in healthy else []), c.pods[m].reason]
                                        for m in members}, exact=False)
        told = all(any(e["message"].startswith("Released without starting") for es in events[m].values() for e in es)
                   for m in members)
        return events if told else None

    events = await until(releases_told, 60, "each member's release Event")
    for m in members:
        released = [e for es in events[m].values() for e in es if e["message"].startswith("Released without starting")]
        assert [e["reason"] for e in released] == [c.pods[m].reason], events[m]
        assert "GangCommitted" not in events[m], events[m]
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


def _voted_or_started(c: GangCluster, voters: list[str], members: list[str]) -> Any:
    async def check() -> bool:
        return all(c.pods[m].voted for m in voters) or bool(c.started(members))
    return check


def _resolved(c: GangCluster, members: list[str]) -> Any:
    """Every member running, or every member failed: the gang resolved one way or the other."""
    async def check() -> bool:
        return all(c.pods[m].running for m in members) or all(c.pods[m].failed for m in members)
    return check


async def test_an_agent_sigkilled_at_the_barrier_never_starts_the_gang_partially(cluster: GangCluster) -> None:
    """(b) The coordinator's agent is SIGKILLed while its member waits at the barrier (the other
    member is held back by its driver until then); the other member prepares and votes with the
    coordinator dead: nothing starts on any node. Restarted, the agent adopts its member and the
    gang either starts whole (each container once, after the restart) or is released whole."""
    c = cluster
    victim, slow = c.nodes[0], c.nodes[1]
    assert slow.driver is not None
    slow.driver.fail = "prepare"
    gang = await c.create_gang(NODES, on={0: victim.name})
    members = list(gang.members)
    await until(_voted_or_started(c, members[:1], members), 60, "the coordinator's member at the barrier")
    assert not c.started(members), "a member started before the gang was prepared"
    victim.kill_agent()
    slow.driver.fail = "none"
    await until(_voted_or_started(c, members[1:], members), 60, "the other member prepared with the coordinator dead")
    await anyio.sleep(2)
    assert not c.started(members), "a member started while the coordinator's agent was dead"
    assert not any(c.pods[m].record for m in members), "decided while the coordinator's agent was dead"

    restarted = time.time_ns()
    victim.start_agent()
    await until(_resolved(c, members), 90, "the gang started or released, whole")
    await anyio.sleep(0.5)
    started = c.check_all_or_nothing(members)
    if started:
        assert len(started) == NODES and all(s.started_at > restarted for s in started), started
        outcome = "started whole"
    else:
        assert all(c.pods[m].reason in ("GangAborted", "GangAdmissionTimeout") for m in members), \
            [(c.pods[m].reason, c.pods[m].message) for m in members]
        outcome = "released whole"
    print(f"after the restart the gang {outcome}")
    await c.delete_gang(gang)
    await _released(c, members)
    assert not c.violations, c.violations


@pytest.mark.gang_hold(STEADY_TIMEOUT)
async def test_a_member_deleted_after_the_gang_started_leaves_the_others_running(cluster: GangCluster) -> None:
    """(d) Our policy (docs/GANG.md): the barrier is about starting. Once a gang committed, a
    member that goes (deleted, its node lost) changes nothing for the others: they keep running,
    untouched (the kubelet has no gang policy at all; restarting or evicting the rest is the
    controller's and scheduler's part, KEP-5710 disruptionMode). The member's devices are
    unprepared and its sandbox removed on its node; a replacement in the same PodGroup, placed by
    the scheduler, starts at once (the gang is satisfied already) without a new quorum."""
    c = cluster
    gang = await c.create_gang(NODES)
    members = list(gang.members)
    await until(lambda: _true(all(c.pods[m].running for m in members)), 120, "the gang Running")
    await anyio.sleep(0.3)
    before = {s.pod: s for s in c.check_all_or_nothing(members)}
    gone = members[-1]
    node = c.member_nodes([gone])[gone]
    await c.kubectl("delete", "pod", gone, "--wait=false")
    await until(lambda: _true(bool(c.pods[gone].deleted)), 60, "the member deleted")
    await until(lambda: _true(c.quiet([gone])), 60, lambda: f"the deleted member's node released: {c.held()}")
    stay = [m for m in members if m != gone]
    await anyio.sleep(1)
    for m in stay:
        assert c.pods[m].pod["status"]["phase"] == "Running" and not c.pods[m].failed
        seen = [s for n in c.nodes for s in n.seen([m])]
        assert seen == [before[m]], f"{m} was restarted or stopped: {seen}"

    [replacement] = await c.add_members(gang, [NODES])
    await until(lambda: _true(bool(c.pods[replacement].running)), 120, "the replacement Running")
    assert c.pods[replacement].node == node.name
    vote = c.pods[replacement].vote
    assert vote.get("reason") == "GangCommitted", vote  # joined a committed gang, no new barrier
    assert not any(s.pod in stay for n in c.nodes for s in n.seen(stay) if s not in before.values())
    await c.delete_gang(gang)
    await _released(c, [*members, replacement])
    assert not c.violations, c.violations


async def test_an_image_that_cannot_be_pulled_on_one_node_starts_no_member(cluster: GangCluster) -> None:
    """(e) One member's image cannot be pulled on its node (ErrImagePull, retried with back-off):
    it never reaches the barrier, no member's container starts anywhere, the others are released
    within the gang's bound; the abort fails the member still pulling too (no wait for its
    pull to end), and deleting the gang leaves nothing on any node."""
    c = cluster
    good, bad = c.nodes[0], c.nodes[1]
    gang = await c.create_gang(NODES, on={0: good.name}, create=0)
    await c.add_members(gang, [1], image="registry.invalid/nodeagent/missing:1", on={1: bad.name})
    await c.add_members(gang, [0])
    members = sorted(gang.members)
    await until(_voted_or_started(c, members[:1], members), 60, "the member on the good node at the barrier")
    assert not c.started(members), "a member started while another's image could not be pulled"
    await until(_failed(c, members[:1]), TIMEOUT + 30, "the good node's member released")
    assert c.pods[members[0]].reason == "GangAdmissionTimeout", c.pods[members[0]].message
    await until(lambda: _true(c.quiet(members[:1])), 30, lambda: f"the good node released: {c.held()}")
    # The member still pulling is failed by the abort (the record reached its node), not left
    # to hold its node until its pull ends.
    await until(_failed(c, members[1:]), 30, "the member still pulling failed by the abort")
    assert c.pods[members[1]].reason == "GangAdmissionTimeout", c.pods[members[1]].message
    await until(lambda: _true(c.quiet(members[1:])), 30, lambda: f"the bad node released: {c.held()}")
    # The good member's Events: it waited, its agent (the coordinator's) recorded the timeout, it
    # was released; the member that never prepared was released (its own Events say ErrImagePull).
    events = await _gang_events(c, {members[0]: ["WaitingForGang", "GangAdmissionTimeout", "GangAdmissionTimeout"],
                                    members[1]: ["GangAdmissionTimeout"]})
    assert sorted(e["message"].split(" ")[0] for e in events[members[0]]["GangAdmissionTimeout"]) == \
        ["Recorded", "Released"], events
    assert [e["message"].split(" ")[0] for e in events[members[1]]["GangAdmissionTimeout"]] == ["Released"], events
    assert not c.started(members)
    await c.delete_gang(gang)
    await _released(c, members)
    assert not c.started(members)


async def test_the_api_server_down_for_30s_during_the_barrier_never_starts_the_gang_partially(
        cluster: GangCluster) -> None:
    """(c) The API server is stopped for 30 s while the coordinator's member waits at the barrier
    and the other member is still preparing (its driver failing until the outage starts): no
    member starts on any node meanwhile (the runtimes say so, polled throughout); after the API
    server is back the gang resolves, whole: all started, or all released."""
    c = cluster
    slow = c.nodes[1]
    assert slow.driver is not None
    slow.driver.fail = "prepare"
    gang = await c.create_gang(NODES, on={0: c.nodes[0].name})
    members = list(gang.members)
    await until(_voted_or_started(c, members[:1], members), 60, "the coordinator's member at the barrier")
    assert not c.started(members)
    await anyio.to_thread.run_sync(c.cp.stop_component, "kube-apiserver")
    try:
        slow.driver.fail = "none"
        for _ in range(30):
            await anyio.sleep(1)
            assert not c.started(members), "a member started while the API server was down"
    finally:
        await anyio.to_thread.run_sync(c.cp.start_component, "kube-apiserver")
    await until(_resolved(c, members), 120, "the gang started or released, whole, after the outage")
    await anyio.sleep(0.5)
    started = c.check_all_or_nothing(members)
    print(f"after the outage the gang {'started whole' if started else 'was released whole'}")
    if not started:
        # A member released before it reached the barrier once read Failed with no reason here:
        # dra's unprepare cleared it (fixed in 1c14e93). The message says who wrote each
        # member's Failed status (its managedFields), which is how that was found.
        assert all(c.pods[m].reason in ("GangAborted", "GangAdmissionTimeout") for m in members), \
            {m: c.pods[m].failed_as for m in members}
    await c.delete_gang(gang)
    await _released(c, members)
    for node in c.nodes:
        await c.wait_ready(node)
    # The scheduler's and the controller-manager's watches came back from the outage on a
    # client-go back-off (up to 30 s): until they have, their caches keep what they last saw.
    # This cluster's teardown deletes its nodes and the next test's registers its own; a
    # scheduler that missed the deletions bound the next gang to nodes gone (the suite at
    # 83a7561: PodGC then deleted its members as orphans). Restarted, they list afresh.
    for component in ("kube-scheduler", "kube-controller-manager"):
        await anyio.to_thread.run_sync(c.cp.stop_component, component)
        await anyio.to_thread.run_sync(c.cp.start_component, component)


async def test_the_benchmarks_start_floor_starts_one_container_per_runtime_at_once_and_leaves_nothing(
        runtimes: list[Containerd]) -> None:
    """benchmarks/start_floor.py, the raw-CRI floor the gang's start skew is read against: every
    runtime ran its container (the skew comes from the runtimes' own startedAt) and is empty after;
    so with fake GPUs given through CDI as a member's are (containerd refuses a container whose
    CDI device it cannot resolve), their CDI specs gone after."""
    from benchmarks import start_floor
    from cri import RuntimeClient

    workdir = Path(tempfile.mkdtemp(prefix="floor-", dir="/tmp"))
    try:
        floor = await start_floor.simultaneous_start([r.endpoint for r in runtimes], workdir)
        with_gpus = await start_floor.simultaneous_start([r.endpoint for r in runtimes], workdir,
                                                         cdi_dirs=[r.cdi_spec_dir for r in runtimes], gpus=2)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for measured in (floor, with_gpus):
        assert 0 <= measured["skew"] < 30, measured
        assert 0 < measured["call_mean"] <= measured["call_max"], measured
    for env in runtimes:
        assert not [p for p in env.cdi_spec_dir.iterdir() if start_floor.FLOOR_CLAIM_UID in p.name], env.cdi_spec_dir
        async with RuntimeClient(env.endpoint) as client:
            assert await client.list_pod_sandbox() == [], env.endpoint
            assert await client.list_containers() == [], env.endpoint


@pytest.mark.gang_hold(STEADY_TIMEOUT)
async def test_the_benchmarks_gang_run_splits_its_start_window_into_who_had_the_cpu(cluster: GangCluster) -> None:
    """benchmarks/gang_e2e.py's gang run on the real cluster: besides the timings, the CPU each
    class of process used between the commit record and the last start (benchmarks/cpushare.py),
    each class found and counted (the agents started a member each, the runtimes ran runc)."""
    from benchmarks import gang_e2e

    out = await gang_e2e.gang_run(cluster, NODES, gang=True)
    assert out["skew"] >= 0 and out["release"] > 0, out
    assert 0 < out["window_window"] < 60, out
    for key in ("window_agents", "window_runtimes", "window_control_plane"):
        assert out[key] > 0, (key, out)
    assert 0 < out["window_machine_cores"] <= (os.cpu_count() or 1) + 0.01, out
    assert not cluster.violations, cluster.violations
