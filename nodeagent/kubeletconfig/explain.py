"""``nodeagent config explain``: the effective configuration, where each value came from and
what nodeagent does with it.

One row per leaf of the KubeletConfiguration (nested structs are dotted; maps and lists are one
value): its value, its source (``default``, ``file <path>``, ``drop-in <path>``, ``flag
--x``, ``agent-config <path>``), whether nodeagent honours it and how; the fields reported at
start (not honoured and not at their default) are marked ``!``. Then the kubelet's
command-line settings and nodeagent's own configuration.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from nodeagent.kubeletconfig import support

if TYPE_CHECKING:
    from nodeagent.config import AgentConfig


def rows(config: AgentConfig) -> list[dict[str, Any]]:
    assembled = config.assembled
    origins = assembled.origins if assembled is not None else {}
    reported = config.unsupported_fields()
    out = []
    for path, value in sorted(support.leaves(config.kubelet).items()):
        entry = support.support_of(path)
        origin = origins.get(path)
        out.append({"field": path, "value": value, "source": str(origin) if origin else "default",
                    "nodeagent": entry.status, "note": entry.note, "reported": path in reported})
    return out


def _value(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


def render(config: AgentConfig, *, output: str = "table") -> str:
    table = rows(config)
    flags = config.flags.model_dump(mode="json")
    agent = config.agent.model_dump(mode="json", by_alias=True, exclude={"kubelet_flags"})
    if output == "json":
        return json.dumps({"kubeletConfiguration": table, "kubeletFlags": flags, "nodeAgentConfiguration": agent,
                           "node": {"name": config.node_name, "rootDir": str(config.root_dir)}}, indent=1)
    width = max(len(r["field"]) for r in table)
    source_width = min(max(len(r["source"]) for r in table), 48)
    lines = ["KubeletConfiguration (kubelet.config.k8s.io/v1beta1), effective:",
             f"  {'FIELD':<{width}}  {'VALUE':<30} {'SOURCE':<{source_width}} NODEAGENT"]
    for r in table:
        mark = "!" if r["reported"] else " "
        status = r["nodeagent"] + (f": {r['note']}" if r["note"] else "")
        lines.append(f"{mark} {r['field']:<{width}}  {_value(r['value']):<30} {r['source']:<{source_width}} {status}")
    reported = [r for r in table if r["reported"]]
    lines.append("")
    lines.append(f"! = not honoured by nodeagent and not at its default ({len(reported)} field(s)): reported at start "
                 "as a warning and, in cluster mode, a NodeAgentConfigurationUnsupported Event on the Node")
    lines.append("")
    lines.append(f"kubelet command-line settings (KubeletFlags); node name {config.node_name}:")
    origins = config.assembled.origins if config.assembled is not None else {}
    for name, value in flags.items():
        origin = origins.get(f"flags.{name}")
        lines.append(f"  {name:<40} {_value(value):<40} {origin or ''}")
    lines.append("")
    lines.append("NodeAgentConfiguration (nodeagent.io/v1alpha1):")
    for name, value in agent.items():
        origin = origins.get(f"agent.{name}")
        lines.append(f"  {name:<12} {json.dumps(value)}" + (f"  ({origin})" if origin else ""))
    return "\n".join(lines)


__all__ = ["render", "rows"]
