"""The gang stage's cross-node half: votes in the API, the coordinator's record.

In cluster mode a gang's members may be on several nodes. Each prepared member's vote goes into
its own pod's status (``gang.nodeagent.io/Prepared``, with its expiry); one deterministic member's
agent, the coordinator, writes the decision on its own pod (``StartCommitted``); every agent,
the coordinator's too, follows that record as the API shows it (plugins/gang/coordinator.py
assesses the members' pods; docs/GANG.md explains why this is safe).

A mixin of :class:`plugins.gang.GangStage`: the barrier's local half (commit, abort, release,
fail, the event outbox) lives there, and these methods use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from nodeagent.events import Event
from nodeagent.model import Pod
from nodeagent.stages import PodContext, Result
from plugins.gang.coordinator import Assessment, abort_message, assess, attempt_end, vote_message
from plugins.gang.declaration import Declaration, GangKey, created_at
from plugins.gang.events import GangAborted, GangDecisionRecorded, GangMemberPrepared
from plugins.gang.names import (
    ABORTED,
    COMMITTED_CONDITION,
    PREPARED_CONDITION,
    QUORUM_REACHED,
    TIMEOUT,
    WAITING,
)
from plugins.gang.state import Gangs, GangState, Generation, Member

if TYPE_CHECKING:
    from nodeagent.clock import Clock
    from plugins.gang import GangConfig
    from plugins.gang.metrics import GangMetrics
    from plugins.gang.view import ClusterView

log = structlog.get_logger("nodeagent.gang")


class AcrossNodes:
    # Provided by GangStage.
    name: str
    config: GangConfig
    view: ClusterView | None
    gangs: Gangs
    metrics: GangMetrics
    _clock: Clock
    _node_name: str
    _outbox: list[Event]
    _handle: Any

    if TYPE_CHECKING:
        def _commit(self, gen: Generation, *, recovered: bool = False, prepared: int | None = None,
                    how: str = "") -> None: ...

        def _abort(self, gen: Generation, reason: str, message: str, *, wall: float | None = None) -> None: ...

        async def _release(self, ctx: PodContext, gen: Generation, member: Member, *,
                           recovered: bool = False) -> Result: ...

        async def _fail(self, ctx: PodContext, gen: Generation, member: Member | None) -> Result: ...

    async def _permit_across_nodes(self, ctx: PodContext, gen: Generation, member: Member, arrived: bool) -> Result:
        assert self.view is not None
        if arrived:
            # The vote: written once (the status sink patches it to the API); its message does
            # not change while the member waits, so waiting costs no API writes.
            member.vote_expires = self._clock.now() + gen.timeout
            ctx.status.set_condition(PREPARED_CONDITION, True, WAITING, vote_message(member.vote_expires))
        self.view.watch(gen.key.namespace)
        self._reconcile(gen)
        if arrived:
            await ctx.publish(GangMemberPrepared(gang=str(gen.key), generation=gen.number,
                                                 prepared=len(gen.prepared()), min_member=gen.min_member,
                                                 across_nodes=True))
        await self._flush()
        return await self._follow_across_nodes(ctx, gen, member)

    async def _follow_across_nodes(self, ctx: PodContext, gen: Generation, member: Member) -> Result:
        if gen.state is GangState.COMMITTED:
            return await self._release(ctx, gen, member)
        if gen.state is GangState.ABORTED:
            return await self._fail(ctx, gen, member)
        assert self.view is not None
        wall = self._clock.now()
        coordinating = gen.coordinator_uid == member.ref.uid
        # The coordinator decides a timeout itself at its vote's expiry; any other member
        # releases itself after its own vote's expiry plus grace, unless this agent wrote a
        # commit (as coordinator) that the API does not show yet: that member was counted.
        deadline = (member.vote_expires or wall) + (0.0 if coordinating else self.config.grace_seconds)
        if not coordinating and gen.recorded is None and wall >= deadline:
            return await self._withdraw(ctx, gen, member)
        error = self.view.error(gen.key.namespace)
        if error and not self.view.synced(gen.key.namespace):
            message = f"gang {gen.key}: prepared; cannot read the gang's members from the API ({error})"
        else:
            message = (f"gang {gen.key}: prepared; waiting for the coordinator "
                       f"{gen.coordinator or '(not known yet)'} to commit")
        for container in ctx.pod.all_containers():
            ctx.status.container_waiting(container.name, WAITING, message)
        retry = min(max(deadline - wall, 0.05), self.config.recheck_seconds)
        return Result.wait(WAITING, message, retry_after=retry)

    async def _view_changed(self, keys: set[GangKey]) -> None:
        """(the view) Pods of these gangs changed in the API."""
        for key in keys:
            gen = self.gangs.current(key)
            if gen is not None and gen.cluster:
                self._reconcile(gen)
        await self._flush()

    def _reconcile(self, gen: Generation) -> None:
        """Follow the gang's record, or write it as its coordinator. Synchronous: the reading
        and what it leads to happen between two awaits."""
        if gen.state is not GangState.FORMING or self.view is None or not gen.members:
            return
        if not self.view.synced(gen.key.namespace):
            return
        wall = self._clock.now()
        found = assess(self.view.pods(gen.key), gen.min_member, wall)
        if found.commit is not None:
            # For messages: the members prepared, voting or already past the barrier (the
            # unexpired votes alone shrink as members follow), this node's own included.
            prepared = {p.uid for p in found.current if p.prepared is not None and p.prepared.status}
            prepared.update(m.ref.uid for m in gen.prepared())
            self._commit(gen, prepared=len(prepared), how=found.commit)
            return
        created = [m.created for m in gen.members.values()]
        record = found.abort_for(None if None in created else min(c for c in created if c is not None))
        if record is not None:
            self._abort(gen, record.reason, record.message, wall=record.at)
            return
        coordinator = found.coordinator
        gen.coordinator = coordinator.full_name if coordinator is not None else None
        gen.coordinator_uid = coordinator.uid if coordinator is not None else None
        if gen.recorded is not None and gen.recorded[0] != gen.coordinator_uid:
            gen.recorded = None  # the coordinator that wrote it is gone before anyone saw it
        if coordinator is None or gen.recorded is not None:
            return
        me = gen.members.get(coordinator.uid)
        if me is None or me.ctx is None or me.prepared_at is None:
            return  # another node's member, or ours but not prepared yet
        self._decide_as_coordinator(gen, me, found, wall)

    def _decide_as_coordinator(self, gen: Generation, me: Member, found: Assessment, wall: float) -> None:
        votes = ", ".join(p.name for p in found.votes)
        # Which members an abort ends: those the API shows of this attempt and this node's own
        # (one the API view has not shown yet is still of it).
        until = attempt_end([*(p.created for p in (*found.current, *found.failed)),
                             *(m.created for m in gen.members.values())], wall)
        if found.failed:
            culprit = found.failed[0]
            cause = f"{culprit.reason}: {culprit.message}" if culprit.reason else culprit.message or "Failed"
            message = (f"gang {gen.key} aborted: member {culprit.full_name} failed on node {culprit.node} "
                       f"({cause}); no container of the gang was started")
            message = abort_message(message, until)
            self._record(gen, me, False, ABORTED, message, found)
            self._abort(gen, ABORTED, message, wall=until)
        elif len(found.votes) >= gen.min_member:
            message = (f"gang {gen.key}: {len(found.votes)} of {gen.min_member} members prepared ({votes}); "
                       f"decided by {me.ref.namespace}/{me.ref.name} on node {self._node_name}")
            self._record(gen, me, True, QUORUM_REACHED, message, found)
            # Followed once the API shows it, as every other member's agent does: a commit that
            # is not durable must not start anything.
        elif me.vote_expires is not None and wall >= me.vote_expires:
            voted = ", ".join(p.name for p in found.voted)
            message = (f"gang {gen.key} did not commit within {gen.timeout:g}s: {len(found.voted)} of "
                       f"{gen.min_member} members were prepared ({voted or 'none'}); no container of the gang "
                       "was started")
            message = abort_message(message, until)
            self._record(gen, me, False, TIMEOUT, message, found)
            self._abort(gen, TIMEOUT, message, wall=until)

    def _record(self, gen: Generation, me: Member, committed: bool, reason: str, message: str,
                found: Assessment) -> None:
        assert me.ctx is not None
        me.ctx.status.set_condition(COMMITTED_CONDITION, committed, reason, message)
        gen.recorded = (me.ref.uid, committed)
        result = "commit" if committed else ("timeout" if reason == TIMEOUT else "abort")
        self.metrics.records[result] += 1
        log.info("gang decision recorded", gang=str(gen), committed=committed, reason=reason,
                 votes=len(found.votes), min_member=gen.min_member, coordinator=f"{me.ref.namespace}/{me.ref.name}")
        self._outbox.append(GangDecisionRecorded(pod=me.ref, source=self.name, gang=str(gen.key),
                                                 generation=gen.number, committed=committed, reason=reason,
                                                 message=message, votes=len(found.votes),
                                                 min_member=gen.min_member))

    def _abort_record_for(self, pod: Pod, decl: Declaration) -> tuple[str, str] | None:
        """(admission) The abort that ended the cluster generation this pod was created in."""
        if self.view is None or not self.view.synced(decl.key.namespace):
            return None
        found = assess(self.view.pods(decl.key), decl.min_member or 1, self._clock.now())
        if found.commit is not None:
            return None
        record = found.abort_for(created_at(pod))
        return (record.reason, record.message) if record is not None else None

    async def _withdraw(self, ctx: PodContext, gen: Generation, member: Member) -> Result:
        """Release this member alone: its vote expired long enough ago that no coordinator can
        count it (unilateral release, bounded by the vote's expiry plus grace)."""
        message = (f"gang {gen.key}: no decision within {gen.timeout:g}s of this member's vote and "
                   f"{self.config.grace_seconds:g}s of grace (coordinator {gen.coordinator or 'unknown'}); "
                   "released without starting")
        if member.prepared_at is not None:
            self.metrics.barrier_wait.observe(self._clock.monotonic() - member.prepared_at, "timeout")
        for container in ctx.pod.all_containers():
            ctx.status.clear_container_waiting(container.name)
        ctx.status.set_condition(PREPARED_CONDITION, False, TIMEOUT, message)
        log.warning("gang member released itself", gang=str(gen), pod=str(ctx.ref), message=message)
        await ctx.publish(GangAborted(gang=str(gen.key), generation=gen.number, reason=TIMEOUT, message=message,
                                      prepared=len(gen.prepared()), min_member=gen.min_member, across_nodes=True))
        return Result.reject(TIMEOUT, message)

    async def _flush(self) -> None:
        events, self._outbox = self._outbox, []
        for event in events:
            await self._handle.publish(event)
