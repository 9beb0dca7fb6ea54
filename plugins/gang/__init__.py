"""The gang stage: a gang's pods come up as a group or not at all (docs/GANG.md).

Local preparation (admission, images, sandbox, volumes, devices) is phase one of a two-phase
start; container start is phase two, and ``permit`` is the barrier between them:

- ``admit`` fails a member at once when its gang has already aborted, and checks that the node
  can hold the member beside everything admitted before it; a member that does not fit fails with
  ``GangLocalAdmissionFailed`` and aborts its gang, so that the node's share of a gang is admitted
  all or none.
- ``reserve`` makes the pod a member of its gang's current generation (holding starts: the
  timeout runs from the first member's reserve); ``unreserve`` removes it, and a member leaving a
  gang that has not committed aborts it (it was deleted, failed preparation or was rejected).
- ``permit`` parks each prepared member with ``WaitingForGang`` until the gang commits (every
  waiting member is woken then), and fails it with ``GangAborted`` / ``GangAdmissionTimeout`` when
  the gang aborts; the worker then tears it down the normal way (stop, unprepare, cleanup,
  unreserve). Non-gang pods are skipped in every phase: they never wait behind a gang.

Standalone (and for static pods) the agent decides alone: every member is on this node. In
cluster mode a gang's members may be on several nodes: each member's vote goes into its pod's
status, one deterministic member's agent (the coordinator) writes the decision on its own pod,
and every member's agent follows that record (plugins/gang/acrossnodes.py, coordinator.py,
docs/GANG.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
import structlog
from pydantic import Field

from nodeagent import labels as L
from nodeagent.events import Event, PodRef
from nodeagent.kube import nodefit
from nodeagent.model import Pod
from nodeagent.objects.ownnode import labels_of, own_node
from nodeagent.pluginconfig import PluginConfig
from nodeagent.stages import (
    Admit,
    AgentHandle,
    NodeView,
    Permit,
    PodContext,
    Reserve,
    Result,
    Verdict,
)
from plugins.gang.acrossnodes import AcrossNodes
from plugins.gang.apicatalog import ApiCatalog
from plugins.gang.catalog import GroupCatalog, ManifestCatalog, NoCatalog, ObjectKey
from plugins.gang.declaration import (
    Declaration,
    DeclarationError,
    created_at,
    declaration_of,
)
from plugins.gang.events import (
    GangAborted,
    GangCommitted,
    GangMemberPrepared,
    GangPartialStartDetected,
)
from plugins.gang.metrics import GangMetrics
from plugins.gang.names import (
    ABORTED,
    COMMITTED,
    COMMITTED_CONDITION,
    INVALID,
    LOCAL_ADMISSION_FAILED,
    POLICY_UNAVAILABLE,
    PREPARED_CONDITION,
    TIMEOUT,
    WAITING,
)
from plugins.gang.state import (
    Decider,
    Gangs,
    GangState,
    Generation,
    LocalQuorum,
    Member,
)
from plugins.gang.view import ClusterView

log = structlog.get_logger("nodeagent.gang")


class GangConfig(PluginConfig):
    timeout_seconds: float = Field(default=300.0, gt=0)
    """How long a gang may hold its members' reservations without committing, unless its
    declaration says (coscheduling: scheduleTimeoutSeconds, else 60 s; ours: the
    gang.nodeagent.io/timeout-seconds annotation). 300 s is kube-scheduler's gang timeout."""
    pod_group_path: Path | None = None
    """A directory of PodGroup / Workload manifests (standalone mode has no API server to read
    them from)."""
    strict: bool = False
    """A pod that names a group whose minMember cannot be learned fails (GangPolicyUnavailable)
    instead of starting as a pod of its own (the scheduler-trust default)."""
    recheck_seconds: float = Field(default=5.0, gt=0)
    """At most this long between two looks at a waiting gang (commits and aborts wake members at
    once; this only bounds how late a timeout is noticed and a status refreshed)."""
    grace_seconds: float = Field(default=30.0, ge=0)
    """(cluster) A member whose vote expired with no decision seen waits this much longer, then
    releases itself (GangAdmissionTimeout). Must exceed clock skew between nodes plus watch
    latency: the coordinator never counts an expired vote, so a commit and a member's own release
    cannot both happen while that holds."""
    coordination: Literal["auto", "local"] = "auto"
    """auto: in cluster mode, gangs of API pods are decided by their coordinator member's agent
    from the votes in the API; static pods' gangs, and every gang standalone, on this node alone.
    local: every gang on this node alone (only for clusters whose gangs never span nodes)."""


class GangStage(AcrossNodes, Admit, Reserve, Permit):
    name: ClassVar[str] = "gang"

    def __init__(self, config: GangConfig, handle: AgentHandle, catalog: GroupCatalog | None = None,
                 decider: Decider | None = None, view: ClusterView | None = None) -> None:
        self.config = config
        self._handle = handle
        self._clock = handle.clock
        self._node_name = str(getattr(getattr(handle, "node", None), "name", ""))
        objects = getattr(handle, "objects", None)
        cluster = objects is not None and objects.cluster
        if catalog is None:
            if config.pod_group_path:
                catalog = ManifestCatalog(config.pod_group_path)
            elif cluster:
                catalog = ApiCatalog(objects)
            else:
                catalog = NoCatalog()
        self._catalog = catalog
        self._decider = decider or LocalQuorum()
        if view is None and cluster and config.coordination == "auto":
            view = ClusterView(objects, catalog)
        self.view = view
        """(cluster mode) The gang members of every node, from the API; None: every gang is
        decided on this node alone."""
        if view is not None:
            view.on_change = self._view_changed
        self._node = own_node(objects, self._node_name) if objects is not None else None
        """The Node's labels for the node-fit checks (the same as the noderesources stage's)."""
        self._outbox: list[Event] = []
        self.gangs = Gangs()
        self.metrics = GangMetrics()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The node-level task (started by the agent): the watches of the cluster view."""
        if self.view is None:
            task_status.started()
            return
        await self.view.run(task_status=task_status)

    def render_metrics(self) -> str:
        """The stage's series for the agent's /metrics."""
        return self.metrics.render(waiting=self.gangs.waiting())

    def describe(self) -> dict[str, Any]:
        """For the agent's /plugins: the gangs this node takes part in."""
        return {"mode": "cluster" if self.view is not None else "local",
                "watching": self.view.namespaces() if self.view is not None else [],
                "gangs": [{"gang": str(g.key), "source": g.key.source, "generation": g.number,
                           "state": g.state.value, "minMember": g.min_member, "cluster": g.cluster,
                           "coordinator": g.coordinator, "members": sorted(m.ref.name for m in g.members.values()),
                           "prepared": len(g.prepared())} for g in self.gangs.all()]}

    # --- admission: all or none of the node's share -------------------------------------

    async def admit(self, pod: Pod, node: NodeView) -> Result:
        await self._prefetch(pod)
        try:
            decl = self._declaration(pod)
        except DeclarationError as exc:
            return Result.reject(INVALID, f"pod {_name(pod)} declares a gang that cannot be used: {exc}")
        if decl is None:
            return Result.skip()
        if decl.min_member is None:
            return self._unknown(pod, decl)
        cluster = self._is_cluster(pod)
        if cluster:
            assert self.view is not None
            self.view.watch(pod.metadata.namespace)
            current = self.gangs.current(decl.key)
            if current is not None and current.cluster:
                self._reconcile(current)  # a stale local attempt learns the gang's fate first
                await self._flush()
        gen = self.gangs.generation_for(decl.key, created_at(pod))
        if gen is not None and gen.state is GangState.ABORTED:
            return Result.reject(gen.reason, gen.message)
        if cluster and (gen is None or gen.state is GangState.FORMING):
            record = self._abort_record_for(pod, decl)
            if record is not None:
                return Result.reject(record[0], record[1])
        fit = nodefit.fit(pod, node, labels_of(self._node) if self._node is not None else None)
        if fit.verdict is not Verdict.REJECT:
            return Result.ok()
        cause = f"{fit.reason}: {fit.message}"
        if gen is not None and gen.state is GangState.COMMITTED:
            # A committed gang keeps running: this late member fails alone.
            return Result.reject(LOCAL_ADMISSION_FAILED, f"{cause} (gang {decl.key} had started without it)")
        if cluster:
            # Across nodes, this node cannot know whether its other members' votes were already
            # counted in a commit: only the coordinator decides. This pod's failure, in the API,
            # is what tells the coordinator to abort; the others here are released by that abort.
            return Result.reject(LOCAL_ADMISSION_FAILED,
                                 f"{cause}; gang {decl.key} cannot start without it and is aborted by its "
                                 "coordinator, releasing every member")
        gen = gen or self.gangs.open(decl, decl.min_member, self._timeout(decl), self._clock.monotonic())
        message = (f"gang {decl.key} aborted: member {_name(pod)} cannot be admitted on node "
                   f"{node.node.name} ({cause}); no container of the gang was started")
        self._abort(gen, ABORTED, message)
        await self._announce(pod, gen, LOCAL_ADMISSION_FAILED, message)
        await self._flush()
        return Result.reject(LOCAL_ADMISSION_FAILED, f"{cause}; every member of gang {decl.key} is released")

    async def reserve(self, pod: Pod, node: NodeView) -> Result:
        decl = self._declaration_or_none(pod)
        if decl is None or decl.min_member is None:
            return Result.skip()
        gen = self._join(pod, decl)
        if gen.state is GangState.ABORTED:
            return Result.reject(gen.reason, gen.message)
        return Result.ok()

    async def unreserve(self, pod: Pod) -> None:
        gen = self.gangs.member_of(pod.uid)
        if gen is None:
            return
        # Standalone, a member leaving before the commit aborts its gang (nothing can tell whether
        # a replacement will come). Across nodes it only leaves: a controller may replace it, the
        # coordinator counts the members that remain, and the votes' expiry bounds the wait; a
        # member that failed is seen failed in the API, which makes the coordinator abort.
        aborted = gen.state is GangState.FORMING and not gen.cluster
        if aborted:
            message = (f"gang {gen.key} aborted: member {_name(pod)} was released before the gang committed "
                       "(deleted, failed its preparation or rejected on this node); no container of the gang "
                       "was started")
            self._abort(gen, ABORTED, message)
        # Leave after the abort: an aborted generation stays as a tombstone for its stragglers.
        self.gangs.leave(pod.uid)
        if gen.state is GangState.ABORTED and gen.decided_at is not None:
            self.metrics.release.observe(self._clock.monotonic() - gen.decided_at)
        if aborted:
            await self._announce(pod, gen, ABORTED, gen.message)
            await self._flush()

    # --- the barrier ---------------------------------------------------------------------

    async def permit(self, ctx: PodContext) -> Result:
        pod = ctx.pod
        await self._prefetch(pod)
        try:
            decl = self._declaration(pod)
        except DeclarationError as exc:
            return Result.reject(INVALID, f"pod {_name(pod)} declares a gang that cannot be used: {exc}")
        if decl is None or decl.min_member is None:
            return Result.skip()
        gen = self.gangs.member_of(pod.uid) or self._join(pod, decl)
        if gen.state is GangState.ABORTED:
            return await self._fail(ctx, gen, gen.members.get(pod.uid))
        member = self.gangs.join(gen, ctx.ref, self._clock.monotonic())
        member.ctx = ctx
        if gen.state is GangState.COMMITTED:
            return await self._release(ctx, gen, member)

        now = self._clock.monotonic()
        arrived = member.prepared_at is None
        if arrived:
            if _started(ctx):
                # Only an agent restart gets here: containers are started only after a commit,
                # so one that started is the commit's record (the runtime is the checkpoint).
                # Created is not started: a member's containers are created ahead while it waits.
                self._commit(gen, recovered=True)
                return await self._release(ctx, gen, member, recovered=True)
            member.prepared_at = now
        if gen.cluster:
            return await self._permit_across_nodes(ctx, gen, member, arrived)
        # Decide before the first await, so that no other member interleaves between counting
        # and deciding; the answer below reads the state again after the awaits.
        decision = self._decider.decide(gen, now)
        if decision == "commit":
            self._commit(gen)
        elif decision == "timeout":
            self._abort(gen, TIMEOUT, f"gang {gen.key} did not commit within {gen.timeout:g}s: "
                                      f"{len(gen.prepared())} of {gen.min_member} members were prepared; "
                                      "no container of the gang was started")
        if arrived:
            await ctx.publish(GangMemberPrepared(gang=str(gen.key), generation=gen.number,
                                                 prepared=len(gen.prepared()), min_member=gen.min_member))
        await self._flush()
        return await self._follow(ctx, gen, member)

    async def _follow(self, ctx: PodContext, gen: Generation, member: Member) -> Result:
        """The member's answer from its generation's state, read after the awaits above."""
        if gen.state is GangState.COMMITTED:
            return await self._release(ctx, gen, member)
        if gen.state is GangState.ABORTED:
            return await self._fail(ctx, gen, member)
        now = self._clock.monotonic()
        message = (f"gang {gen.key}: {len(gen.prepared())} of {gen.min_member} members prepared; "
                   f"waiting up to {max(gen.deadline - now, 0):.0f}s more")
        for container in ctx.pod.all_containers():
            ctx.status.container_waiting(container.name, WAITING, message)
        ctx.status.set_condition(PREPARED_CONDITION, True, WAITING, f"generation {gen.number}: {message}")
        retry = min(max(gen.deadline - now, 0.05), self.config.recheck_seconds)
        return Result.wait(WAITING, message, retry_after=retry)

    # --- decisions -------------------------------------------------------------------------

    def _commit(self, gen: Generation, *, recovered: bool = False, prepared: int | None = None, how: str = "") -> None:
        now = self._clock.monotonic()
        detail = " (recovered from the runtime)" if recovered else (f" ({how})" if how else "")
        self.gangs.decide(gen, GangState.COMMITTED, COMMITTED, f"gang {gen.key} committed{detail}",
                          now, self._clock.now(), prepared=prepared)
        self.metrics.decisions["commit"] += 1
        log.info("gang committed", gang=str(gen), prepared=gen.prepared_at_commit, min_member=gen.min_member,
                 how=how or ("recovered" if recovered else "local quorum"))
        for member in gen.members.values():
            self.metrics.device_hold.observe(now - member.reserved_at, "commit")
        self._wake(gen)

    def _abort(self, gen: Generation, reason: str, message: str, *, wall: float | None = None) -> None:
        now = self._clock.monotonic()
        self.gangs.decide(gen, GangState.ABORTED, reason, message, now, self._clock.now() if wall is None else wall)
        result = "timeout" if reason == TIMEOUT else "abort"
        self.metrics.decisions[result] += 1
        log.warning("gang aborted", gang=str(gen), reason=reason, message=message)
        for member in gen.members.values():
            self.metrics.device_hold.observe(now - member.reserved_at, result)
        self._wake(gen)
        self._release_preparing(gen)

    def _release_preparing(self, gen: Generation) -> None:
        """Members here that have not reached the barrier (still pulling, preparing devices, or
        retrying a failed preparation) would otherwise hold their reservation, sandbox and
        devices until that preparation ends: the abort fails them now, through their workers,
        with the gang's reason (their facts go out with the next flush of the outbox)."""
        for member in gen.members.values():
            if member.ctx is not None:
                continue  # at the barrier: woken above, its permit answers with the abort
            if self._handle.evict(member.ref.uid, reason=gen.reason, message=gen.message, grace_seconds=0) is None:
                continue  # not active here (not admitted yet, or already going)
            log.info("gang member released before it reached the barrier", gang=str(gen), pod=str(member.ref))
            self._outbox.append(GangAborted(pod=member.ref, source=self.name, gang=str(gen.key),
                                            generation=gen.number, reason=gen.reason, message=gen.message,
                                            prepared=len(gen.prepared()), min_member=gen.min_member,
                                            across_nodes=gen.cluster))

    def _wake(self, gen: Generation) -> None:
        for member in gen.members.values():
            if member.ctx is not None:
                member.ctx.wake()

    async def _release(self, ctx: PodContext, gen: Generation, member: Member, *, recovered: bool = False) -> Result:
        waited = 0.0
        if member.prepared_at is not None and not member.released:
            waited = self._clock.monotonic() - member.prepared_at
            self.metrics.barrier_wait.observe(waited, "commit")
        joined_late = member.prepared_at is None and not recovered
        member.released = True
        for container in ctx.pod.all_containers():
            ctx.status.clear_container_waiting(container.name)
        if gen.cluster:
            # Across nodes only the coordinator's pod carries StartCommitted (the record); a
            # member that followed it says so in its vote, which is also evidence of the commit
            # should the coordinator's pod go away.
            ctx.status.set_condition(PREPARED_CONDITION, True, COMMITTED, gen.message)
        else:
            ctx.status.set_condition(PREPARED_CONDITION, True, COMMITTED, f"generation {gen.number}")
            ctx.status.set_condition(COMMITTED_CONDITION, True, COMMITTED,
                                     f"gang {gen.key} generation {gen.number}: {gen.prepared_at_commit} of "
                                     f"{gen.min_member} members were prepared")
        await ctx.publish(GangCommitted(gang=str(gen.key), generation=gen.number, prepared=gen.prepared_at_commit,
                                        min_member=gen.min_member, waited_seconds=waited,
                                        joined_after_commit=joined_late, recovered=recovered))
        return Result.ok()

    async def _fail(self, ctx: PodContext, gen: Generation, member: Member | None) -> Result:
        if member is not None and member.prepared_at is not None:
            self.metrics.barrier_wait.observe(self._clock.monotonic() - member.prepared_at,
                                              "timeout" if gen.reason == TIMEOUT else "abort")
        # Runtime evidence, not bookkeeping: a member of an aborted gang with a started
        # container is a partial start, whoever started it (created ahead is not started).
        containers = _started(ctx)
        if containers:
            self.metrics.partial_starts += 1
            await ctx.publish(GangPartialStartDetected(gang=str(gen.key), generation=gen.number,
                                                       containers=containers))
        for container in ctx.pod.all_containers():
            ctx.status.clear_container_waiting(container.name)
        if gen.cluster:
            # The vote is withdrawn; the coordinator's pod keeps the record it wrote.
            ctx.status.set_condition(PREPARED_CONDITION, False, gen.reason, gen.message)
        else:
            ctx.status.set_condition(COMMITTED_CONDITION, False, gen.reason, gen.message)
        await ctx.publish(GangAborted(gang=str(gen.key), generation=gen.number, reason=gen.reason, message=gen.message,
                                      prepared=len(gen.prepared()), min_member=gen.min_member,
                                      across_nodes=gen.cluster))
        return Result.reject(gen.reason, gen.message)

    async def _announce(self, pod: Pod, gen: Generation, reason: str, message: str) -> None:
        """The fact of an abort decided in admission or at unreserve, on the pod that caused it
        (no pod context there: the handle publishes)."""
        ref = PodRef(uid=pod.uid, namespace=pod.metadata.namespace, name=pod.metadata.name)
        event: Event = GangAborted(pod=ref, source=self.name, gang=str(gen.key), generation=gen.number,
                                   reason=reason, message=message, prepared=len(gen.prepared()),
                                   min_member=gen.min_member, across_nodes=gen.cluster)
        await self._handle.publish(event)

    # --- membership ------------------------------------------------------------------------

    def _join(self, pod: Pod, decl: Declaration) -> Generation:
        assert decl.min_member is not None
        gen = self.gangs.member_of(pod.uid)
        if gen is not None:
            return gen
        created = created_at(pod)
        gen = self.gangs.generation_for(decl.key, created)
        if gen is None:
            gen = self.gangs.open(decl, decl.min_member, self._timeout(decl), self._clock.monotonic(),
                                  cluster=self._is_cluster(pod))
        elif gen.min_member != decl.min_member:
            log.warning("gang members disagree on minMember; the first member's count holds",
                        gang=str(gen), pod=_name(pod), declared=decl.min_member, holds=gen.min_member)
        if gen.state is not GangState.ABORTED:
            ref = PodRef(uid=pod.uid, namespace=pod.metadata.namespace, name=pod.metadata.name)
            self.gangs.join(gen, ref, self._clock.monotonic()).created = created
            if gen.cluster and self.view is not None:
                self.view.watch(pod.metadata.namespace)
        return gen

    def _is_cluster(self, pod: Pod) -> bool:
        """Whether the pod's gang may span nodes: an API pod in cluster mode. A static pod runs
        only here, so its gang is decided here (reference/gang.md §8.5)."""
        return self.view is not None and pod.metadata.annotations.get(L.CONFIG_SOURCE) != "file"

    async def _prefetch(self, pod: Pod) -> None:
        """Read the group objects the pod's declaration names, when they come from the API."""
        fetch = getattr(self._catalog, "fetch", None)
        if fetch is None:
            return
        wanted = _Recording(self._catalog)
        try:
            declaration_of(pod, wanted)
        except DeclarationError:
            pass
        for key in wanted.asked:
            await fetch(*key)

    def _declaration(self, pod: Pod) -> Declaration | None:
        return declaration_of(pod, self._catalog)

    def _declaration_or_none(self, pod: Pod) -> Declaration | None:
        try:
            return self._declaration(pod)
        except DeclarationError:
            return None  # admit rejected it already

    def _timeout(self, decl: Declaration) -> float:
        return decl.timeout_seconds if decl.timeout_seconds is not None else self.config.timeout_seconds

    def _unknown(self, pod: Pod, decl: Declaration) -> Result:
        message = (f"pod {_name(pod)} names gang {decl.key} ({decl.key.source}), but its minMember cannot be "
                   f"learned here ({decl.min_member_from}); set annotation gang.nodeagent.io/min-member "
                   "or provide the group object")
        if self.config.strict:
            return Result.reject(POLICY_UNAVAILABLE, message)
        # Scheduler-trust: the node barrier is defence in depth behind a gang-aware scheduler,
        # and holding a pod for a policy that can never be read would never converge.
        log.warning("gang declaration without minMember; starting the pod on its own", pod=_name(pod),
                    gang=str(decl.key), source=decl.key.source, reason=decl.min_member_from)
        return Result.skip()


class _Recording:
    """A catalog that remembers what a declaration asked for (to fetch it first)."""

    def __init__(self, inner: GroupCatalog) -> None:
        self._inner = inner
        self.asked: list[ObjectKey] = []

    def get(self, api_group: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.asked.append((api_group, kind, namespace, name))
        return self._inner.get(api_group, kind, namespace, name)


def _started(ctx: PodContext) -> list[str]:
    """The member's containers that the runtime shows past CREATED: StartContainer was called
    for them (running, exited, or whose state the runtime lost)."""
    return [c.name for c in ctx.observed.containers if c.state != "created"]


def _name(pod: Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def plugin(config: GangConfig, handle: AgentHandle) -> GangStage:
    return GangStage(config, handle)


plugin.stage_class = GangStage  # type: ignore[attr-defined]
plugin.config_model = GangConfig  # type: ignore[attr-defined]

__all__ = ["ABORTED", "COMMITTED_CONDITION", "LOCAL_ADMISSION_FAILED", "PREPARED_CONDITION", "TIMEOUT", "WAITING",
           "GangConfig", "GangStage", "plugin"]
