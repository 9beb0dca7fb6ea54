"""The gang stage's metrics (reference/gang.md §8.10), in the Prometheus text format.

The agent counts every fact by kind (``nodeagent_events_total{kind="GangCommitted"}`` and so on);
these add what a count cannot say: how long members waited and held, and the decisions per gang.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from nodeagent.metrics import Histogram


@dataclass
class GangMetrics:
    barrier_wait: Histogram = field(default_factory=lambda: Histogram(
        "nodeagent_gang_barrier_wait_seconds",
        "Seconds a gang member waited at the barrier, from prepared to released or failed.", ("result",)))
    hold: Histogram = field(default_factory=lambda: Histogram(
        "nodeagent_gang_hold_seconds",
        "Seconds a gang member held its reservation before its gang decided.", ("result",)))
    decisions: Counter[str] = field(default_factory=Counter)
    """Per gang generation: commit, abort or timeout."""
    partial_starts: int = 0
    """Gangs aborted while a member had containers in the runtime. Must stay 0."""

    def render(self) -> str:
        lines = ["# HELP nodeagent_gang_decisions_total Gang decisions, one per gang generation.",
                 "# TYPE nodeagent_gang_decisions_total counter"]
        for result in ("commit", "abort", "timeout"):
            lines.append(f'nodeagent_gang_decisions_total{{result="{result}"}} {self.decisions[result]}')
        lines += ["# HELP nodeagent_gang_partial_start_total Gangs aborted while a member had containers.",
                  "# TYPE nodeagent_gang_partial_start_total counter",
                  f"nodeagent_gang_partial_start_total {self.partial_starts}"]
        lines += self.barrier_wait.render() + self.hold.render()
        return "\n".join(lines) + "\n"
