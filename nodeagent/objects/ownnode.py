"""The agent's own Node as the API has it — the kubelet's node informer: labels and taints an
administrator set live only there. One view, shared by every stage that asks (noderesources,
tainttoleration, gang, eviction); standalone it stays empty and readers decide on what the
agent knows itself."""

from __future__ import annotations

from typing import Any

from nodeagent.objects import kinds
from nodeagent.objects.view import View


def own_node(objects: Any, name: str) -> View:
    """A view of the Node ``name`` (``fieldSelector=metadata.name``: what a node may watch)."""
    return objects.view(kinds.NODE, fields={"metadata.name": name})  # type: ignore[no-any-return]


def _node(view: View) -> dict[str, Any]:
    found = view.items()
    return dict(found[0]) if found else {}


def labels_of(view: View) -> dict[str, str]:
    return dict((_node(view).get("metadata") or {}).get("labels") or {})


def taints_of(view: View) -> list[dict[str, Any]]:
    return list((_node(view).get("spec") or {}).get("taints") or [])


__all__ = ["labels_of", "own_node", "taints_of"]
