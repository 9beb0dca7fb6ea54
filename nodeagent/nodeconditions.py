"""Node conditions reported by node-level managers: MemoryPressure, DiskPressure and PIDPressure
by the eviction stage, Ready False ("node is shutting down") by the shutdown stage.

One store, read by the Node status writer (cluster mode: nodeagent.cluster.node), which writes
a change at once instead of at its next period, and by /metrics (both modes). A condition
nobody reported keeps the writer's default (pressure: False with the kubelet's reason).
"""

from __future__ import annotations

import anyio

from nodeagent.stages import Condition


class NodeConditions:
    def __init__(self) -> None:
        self._conditions: dict[str, Condition] = {}
        self._changed = anyio.Event()

    def set(self, condition: Condition) -> None:
        if self._conditions.get(condition.type) == condition:
            return
        self._conditions[condition.type] = condition
        self._changed.set()
        self._changed = anyio.Event()

    def get(self, type: str) -> Condition | None:
        return self._conditions.get(type)

    def all(self) -> dict[str, Condition]:
        return dict(self._conditions)

    async def wait_changed(self, timeout: float | None = None) -> None:
        """Return at the next change, or after ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            await self._changed.wait()

    def render_metrics(self) -> str:
        """nodeagent_node_condition{type,status}: 1 for the status each condition has."""
        lines = ["# HELP nodeagent_node_condition Node conditions reported by node-level managers.",
                 "# TYPE nodeagent_node_condition gauge"]
        for type_, condition in sorted(self._conditions.items()):
            for status in ("True", "False"):
                value = 1 if (status == "True") == condition.status else 0
                lines.append(f'nodeagent_node_condition{{type="{type_}",status="{status}"}} {value}')
        return "\n".join(lines) + "\n"


__all__ = ["NodeConditions"]
