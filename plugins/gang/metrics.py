"""The gang stage's metrics (reference/gang.md §8.10), in the Prometheus text format, served on
the agent's /metrics (the agent renders every stage's ``render_metrics``).

The agent counts every fact by kind (``nodeagent_events_total{kind="GangCommitted"}`` and so on);
these add what a count cannot say: how long members waited, held and took to release, and the
decisions per gang.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from nodeagent.metrics import Histogram

RESULTS = ("commit", "abort", "timeout")


@dataclass
class GangMetrics:
    barrier_wait: Histogram = field(default_factory=lambda: Histogram(
        "nodeagent_gang_barrier_wait_seconds",
        "Seconds a gang member waited at the barrier, from prepared to released or failed.", ("result",)))
    device_hold: Histogram = field(default_factory=lambda: Histogram(
        "nodeagent_gang_device_hold_seconds",
        "Seconds a gang member held its reservation (CPU, memory, devices, sandbox) before its gang "
        "decided.", ("result",)))
    release: Histogram = field(default_factory=lambda: Histogram(
        "nodeagent_gang_release_seconds",
        "Seconds from a gang's abort (as this node learned it) to the member being released: "
        "sandbox stopped and removed, devices unprepared, reservations given back.", ()))
    decisions: Counter[str] = field(default_factory=Counter)
    """Per gang generation on this node: commit, abort or timeout (the decision followed)."""
    records: Counter[str] = field(default_factory=Counter)
    """(cluster) Decisions this agent wrote as a gang's coordinator."""
    partial_starts: int = 0
    """Gangs aborted while a member had containers in the runtime. Must stay 0."""

    def render(self, waiting: int | None = None) -> str:
        lines = [("# HELP nodeagent_gang_decisions_total Gang decisions followed on this node, one per gang "
                  "generation."),
                 "# TYPE nodeagent_gang_decisions_total counter"]
        for result in RESULTS:
            lines.append(f'nodeagent_gang_decisions_total{{result="{result}"}} {self.decisions[result]}')
        lines += [("# HELP nodeagent_gang_coordinator_decisions_total Gang decisions this node wrote as the "
                   "gang's coordinator (cluster mode)."),
                  "# TYPE nodeagent_gang_coordinator_decisions_total counter"]
        for result in RESULTS:
            lines.append(f'nodeagent_gang_coordinator_decisions_total{{result="{result}"}} {self.records[result]}')
        lines += [("# HELP nodeagent_gang_partial_start_total Gangs aborted while a member had containers "
                   "(from the runtime, not bookkeeping). Must stay 0."),
                  "# TYPE nodeagent_gang_partial_start_total counter",
                  f"nodeagent_gang_partial_start_total {self.partial_starts}"]
        if waiting is not None:
            lines += ["# HELP nodeagent_gang_waiting_members Gang members at the barrier of an undecided gang.",
                      "# TYPE nodeagent_gang_waiting_members gauge",
                      f"nodeagent_gang_waiting_members {waiting}"]
        lines += self.barrier_wait.render() + self.device_hold.render() + self.release.render()
        return "\n".join(lines) + "\n"
