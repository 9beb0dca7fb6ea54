"""A pod's lifecycle: one explicit state, one table of allowed transitions, one mutator.

The state is never derived from timestamps and flags. The table below is the only place where
edges exist; :meth:`Lifecycle.apply` is the only function that changes a state, and the pod
worker is its only caller. ``nodeagent lifecycle`` renders the table; docs/ARCHITECTURE.md holds
the same rendering and a test checks that the two agree.

Invariant (the kubelet's): once a pod UID starts terminating it never runs again — no edge leaves
TERMINATING except to TERMINATED, and nothing leaves TERMINATED.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeagent.errors import IllegalTransition


class PodState(enum.Enum):
    OBSERVED = "Observed"  # a source wants the pod; admission has not decided
    ADMITTED = "Admitted"  # admitted and reserved; setup not begun
    PREPARING = "Preparing"  # prepare stages running (images, devices, sandbox)
    WAITING = "Waiting"  # a permit stage said WAIT (e.g. the gang has not committed)
    STARTING = "Starting"  # start stages running (containers)
    RUNNING = "Running"  # started; observe stages watch it
    COMPLETED = "Completed"  # no container will run again; sandbox released, records kept
    REJECTED = "Rejected"  # admission said no; nothing was set up
    TERMINATING = "Terminating"  # teardown running (stop, unprepare, cleanup, unreserve)
    TERMINATED = "Terminated"  # torn down; only the final status remains


class Trigger(enum.Enum):
    ADMIT = "admit"
    REJECT = "reject"
    PREPARE = "prepare"
    WAIT = "wait"
    PERMIT = "permit"
    STARTED = "started"
    COMPLETE = "complete"
    FAIL = "fail"  # a stage rejected the pod after admission
    KILL = "kill"  # deletion, or the source dropped the pod
    TORN_DOWN = "torn_down"


S, T = PodState, Trigger

TRANSITIONS: Mapping[tuple[PodState, Trigger], PodState] = {
    (S.OBSERVED, T.ADMIT): S.ADMITTED,
    (S.OBSERVED, T.REJECT): S.REJECTED,
    (S.OBSERVED, T.KILL): S.TERMINATING,
    (S.ADMITTED, T.PREPARE): S.PREPARING,
    (S.ADMITTED, T.FAIL): S.TERMINATING,
    (S.ADMITTED, T.KILL): S.TERMINATING,
    (S.PREPARING, T.WAIT): S.WAITING,
    (S.PREPARING, T.PERMIT): S.STARTING,
    (S.PREPARING, T.FAIL): S.TERMINATING,
    (S.PREPARING, T.KILL): S.TERMINATING,
    (S.WAITING, T.WAIT): S.WAITING,
    (S.WAITING, T.PERMIT): S.STARTING,
    (S.WAITING, T.FAIL): S.TERMINATING,
    (S.WAITING, T.KILL): S.TERMINATING,
    (S.STARTING, T.STARTED): S.RUNNING,
    (S.STARTING, T.FAIL): S.TERMINATING,
    (S.STARTING, T.KILL): S.TERMINATING,
    (S.RUNNING, T.COMPLETE): S.COMPLETED,
    (S.RUNNING, T.FAIL): S.TERMINATING,
    (S.RUNNING, T.KILL): S.TERMINATING,
    (S.COMPLETED, T.KILL): S.TERMINATING,
    (S.REJECTED, T.KILL): S.TERMINATED,
    (S.TERMINATING, T.KILL): S.TERMINATING,  # a second deletion may only shorten the grace
    (S.TERMINATING, T.TORN_DOWN): S.TERMINATED,
    (S.TERMINATED, T.KILL): S.TERMINATED,
}

SETUP_STATES = frozenset({S.OBSERVED, S.ADMITTED, S.PREPARING, S.WAITING, S.STARTING})
HOLDS_RESOURCES = frozenset({S.ADMITTED, S.PREPARING, S.WAITING, S.STARTING, S.RUNNING, S.COMPLETED, S.TERMINATING})
"""States in which the pod counts against the node in admission (the kubelet counts a pod until
it is fully terminated)."""


@dataclass
class Lifecycle:
    state: PodState = PodState.OBSERVED
    history: list[tuple[PodState, Trigger, PodState]] = field(default_factory=list)

    def can(self, trigger: Trigger) -> bool:
        return (self.state, trigger) in TRANSITIONS

    def apply(self, trigger: Trigger) -> PodState:
        """The only mutator of a pod's state."""
        try:
            new = TRANSITIONS[(self.state, trigger)]
        except KeyError:
            raise IllegalTransition(f"{self.state.value} --{trigger.value}--> (no such edge)") from None
        self.history.append((self.state, trigger, new))
        self.state = new
        return new


def render_table() -> str:
    """The transition table as a Markdown table (the copy in docs/ARCHITECTURE.md must match)."""
    triggers = list(Trigger)
    head = "| state | " + " | ".join(t.value for t in triggers) + " |"
    sep = "|---" * (len(triggers) + 1) + "|"
    rows = [head, sep]
    for state in PodState:
        cells = [TRANSITIONS[(state, t)].value if (state, t) in TRANSITIONS else "" for t in triggers]
        rows.append(f"| {state.value} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
