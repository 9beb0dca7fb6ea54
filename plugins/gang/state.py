"""What the gang stage knows: each gang's current generation, its members, and its decision.

A *generation* is one attempt of a gang to start: it opens when its first member is reserved,
and is decided once — Committed or Aborted — never both, never twice. A committed generation
admits later members at once ("once-satisfied", as kube-scheduler and coscheduling do). An
aborted generation stays as a tombstone so that members created before the abort (and admitted
after it) fail too; a pod created after the abort opens a new generation (reference/gang.md §8.3:
a recreated group forms a new quorum).

In cluster mode a generation is this node's share of a gang that may span nodes: its state
follows the coordinator's record (plugins/gang/coordinator.py) instead of a local count.

Everything here is synchronous: the stage decides between two awaits, so no other member can
interleave with a check and the change it leads to.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Protocol

from nodeagent.events import PodRef
from nodeagent.stages import PodContext
from plugins.gang.declaration import Declaration, GangKey


class GangState(enum.Enum):
    FORMING = "Forming"
    COMMITTED = "Committed"
    ABORTED = "Aborted"


@dataclass
class Member:
    ref: PodRef
    reserved_at: float
    """Monotonic seconds: when the member started holding its reservation."""
    prepared_at: float | None = None
    """When the member reached the barrier (its local preparation was done)."""
    created: float | None = None
    """The pod's creation time (wall seconds, to the second): which cluster generation it is of."""
    vote_expires: float | None = None
    """(cluster) Wall seconds at which this member's vote ("prepared") stops counting."""
    ctx: PodContext | None = None
    """The member's latest permit context: how to wake it, and what the runtime shows of it."""
    released: bool = False


@dataclass
class Generation:
    key: GangKey
    number: int
    min_member: int
    timeout: float
    opened_at: float
    state: GangState = GangState.FORMING
    reason: str = ""
    message: str = ""
    decided_at: float | None = None
    """Monotonic seconds of the decision."""
    decided_wall: float | None = None
    """Wall-clock seconds compared with pods' creation times: a pod created later is of the next
    attempt. The decision's time; across nodes, the attempt's end its abort record names."""
    prepared_at_commit: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    cluster: bool = False
    """The members may be on several nodes: a coordinator member's agent decides, from the
    votes in the members' pod status (plugins/gang/coordinator.py). False: this agent decides
    alone (standalone mode, static pods)."""
    recorded: tuple[str, bool] | None = None
    """(cluster) The decision this agent wrote as the gang's coordinator: (the coordinator pod's
    UID, committed). It never writes another one while that pod is the coordinator."""
    coordinator: str | None = None
    """(cluster) ``namespace/name`` of the coordinator member as last seen (for messages)."""
    coordinator_uid: str | None = None

    @property
    def deadline(self) -> float:
        return self.opened_at + self.timeout

    def prepared(self) -> list[Member]:
        return [m for m in self.members.values() if m.prepared_at is not None]

    def __str__(self) -> str:
        return f"{self.key}#{self.number}"


Decision = Literal["commit", "timeout"]


class Decider(Protocol):
    """Who decides a forming generation that is all on this node (standalone mode, static
    pods): :class:`LocalQuorum`. Cluster generations are decided by the coordinator member's
    agent from the members' votes in the API (plugins/gang/coordinator.py)."""

    def decide(self, gen: Generation, now: float) -> Decision | None: ...


class LocalQuorum:
    """Commit once minMember members are prepared on this node; time out at the deadline."""

    def decide(self, gen: Generation, now: float) -> Decision | None:
        if len(gen.prepared()) >= gen.min_member:
            return "commit"
        if now >= gen.deadline:
            return "timeout"
        return None


class Gangs:
    def __init__(self) -> None:
        self._current: dict[GangKey, Generation] = {}
        self._member_of: dict[str, Generation] = {}
        self._numbers: Counter[GangKey] = Counter()

    def generation_for(self, key: GangKey, created: float | None) -> Generation | None:
        """The generation a pod created at ``created`` belongs to, if one is open or decided."""
        gen = self._current.get(key)
        if gen is None:
            return None
        if (gen.state is GangState.ABORTED and created is not None and gen.decided_wall is not None
                and created > gen.decided_wall):
            return None  # created after the abort: the start of a new attempt
        return gen

    def member_of(self, uid: str) -> Generation | None:
        return self._member_of.get(uid)

    def current(self, key: GangKey) -> Generation | None:
        return self._current.get(key)

    def open(self, decl: Declaration, min_member: int, timeout: float, now: float, *,
             cluster: bool = False) -> Generation:
        self._numbers[decl.key] += 1
        gen = Generation(decl.key, self._numbers[decl.key], min_member, timeout, now, cluster=cluster)
        self._current[decl.key] = gen
        return gen

    def join(self, gen: Generation, ref: PodRef, now: float) -> Member:
        member = gen.members.get(ref.uid)
        if member is None:
            member = gen.members[ref.uid] = Member(ref, now)
            self._member_of[ref.uid] = gen
        return member

    def leave(self, uid: str) -> tuple[Generation, Member] | None:
        gen = self._member_of.pop(uid, None)
        if gen is None:
            return None
        member = gen.members.pop(uid)
        # A decided-for-good generation with nobody left is forgotten, so that the next pods of
        # the same name start a new attempt; an aborted one stays as a tombstone (see above).
        if not gen.members and gen.state is not GangState.ABORTED and self._current.get(gen.key) is gen:
            del self._current[gen.key]
        return gen, member

    def decide(self, gen: Generation, state: GangState, reason: str, message: str, now: float, wall: float,
               prepared: int | None = None) -> None:
        assert gen.state is GangState.FORMING, f"{gen} was decided already ({gen.state.value})"
        gen.state, gen.reason, gen.message = state, reason, message
        gen.decided_at, gen.decided_wall = now, wall
        gen.prepared_at_commit = len(gen.prepared()) if prepared is None else prepared

    def all(self) -> list[Generation]:
        return list(self._current.values())

    def waiting(self) -> int:
        """Members at the barrier of a forming generation (a gauge for people)."""
        return sum(1 for gen in self._current.values() if gen.state is GangState.FORMING for _ in gen.prepared())
