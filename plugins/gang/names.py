"""The names the gang stage shows users and other nodes' agents: waiting and failure reasons, and
the two pod conditions that carry a member's vote and the gang's decision.

The conditions are domain-qualified custom types, like readiness-gate conditions. In cluster
mode they are the protocol between agents (docs/GANG.md, "Across nodes"): each agent writes them
only on pods bound to its node (NodeRestriction allows nothing else), and reads the other
members' through a watch.
"""

from __future__ import annotations

WAITING = "WaitingForGang"
ABORTED = "GangAborted"
TIMEOUT = "GangAdmissionTimeout"
LOCAL_ADMISSION_FAILED = "GangLocalAdmissionFailed"
INVALID = "GangDeclarationInvalid"
POLICY_UNAVAILABLE = "GangPolicyUnavailable"
COMMITTED = "GangCommitted"
"""A member passed the barrier (reason of its Prepared condition, and of StartCommitted in
standalone mode)."""
PARTIAL_START = "GangPartialStart"
"""Reason of the Warning Event for a member found with containers when its gang aborted (must
never be seen)."""
QUORUM_REACHED = "GangQuorumReached"
"""(cluster) The coordinator's commit record: reason of StartCommitted=True on its own pod."""

PREPARED_CONDITION = "gang.nodeagent.io/Prepared"
"""The member's vote: True (reason WaitingForGang) once its local preparation is done, with the
vote's expiry in the message; reason GangCommitted once it passed the barrier; False with the
failure reason when it was released without starting."""
COMMITTED_CONDITION = "gang.nodeagent.io/StartCommitted"
"""The decision. Standalone: on every member, the decision it followed. Cluster mode: only on
the coordinator's pod, written by its agent — True (GangQuorumReached) or False (GangAborted /
GangAdmissionTimeout): the one record every member's agent follows."""

ABORT_REASONS = frozenset({ABORTED, TIMEOUT})
