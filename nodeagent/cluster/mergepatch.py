"""JSON merge patches (RFC 7386) of pod status, computed from what we last wrote.

Pure functions: the status sink decides when to send, these decide what.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any], *, remove: bool = True) -> dict[str, Any]:
    """The merge patch that turns ``old`` into ``new``: maps are merged key by key, lists and
    scalars replaced whole; a key of ``old`` missing from ``new`` becomes null (unless
    ``remove`` is False: then keys we never wrote, which other writers may own, are kept)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_diff(before, value, remove=remove)
            if sub:
                patch[key] = sub
        elif before is _MISSING or before != value:
            patch[key] = value
    if remove:
        for key in old:
            if key not in new:
                patch[key] = None
    return patch


_MISSING: Any = object()

NODE_OWNED_CONDITIONS = frozenset({"PodResizePending", "PodResizeInProgress"})
"""Conditions only the node writes, and removes by no longer reporting them (the kubelet's
status manager drops them when a resize is accepted or done): never carried over as another
writer's."""


def api_status(computed: Mapping[str, Any], previous: Mapping[str, Any] | None,
               in_api: Mapping[str, Any] | None) -> dict[str, Any]:
    """The status to send: ours, with each condition's lastTransitionTime kept while its status
    stays the same (the writer stamps every recomputation), and the conditions other writers
    own carried over from the API's copy."""
    status = dict(computed)
    known: dict[str, Mapping[str, Any]] = {}
    for source in (in_api or {}, previous or {}):  # what we wrote last wins over the API's copy
        for condition in source.get("conditions") or []:
            known[condition.get("type", "")] = condition
    ours = []
    for condition in computed.get("conditions") or []:
        before = known.get(condition["type"])
        if before is not None and before.get("status") == condition.get("status") \
                and before.get("lastTransitionTime"):
            condition = {**condition, "lastTransitionTime": before["lastTransitionTime"]}
        ours.append(condition)
    # A condition type we do not compute (readiness gates, DisruptionTarget, the scheduler's
    # PodScheduled before we report ours) belongs to another writer: keep the API's copy.
    own_types = {c["type"] for c in ours} | NODE_OWNED_CONDITIONS
    foreign = [c for c in (in_api or {}).get("conditions") or [] if c.get("type") not in own_types]
    if ours or foreign:
        status["conditions"] = ours + foreign
    return status
