"""Patches of pod status, computed from what we last wrote: JSON merge patches (RFC 7386) of
maps, and the strategic merge patch the API server applies to pod status (lists merged by key).

Pure functions: the status sink decides when to send, these decide what.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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

MERGE_KEYS: Mapping[str, str] = {"conditions": "type", "podIPs": "ip", "hostIPs": "ip"}
"""The PodStatus lists the API server merges item by item under a strategic merge patch
(patchStrategy "merge", with this patchMergeKey): an item we do not send stays as it is."""

NODE_OWNED_CONDITIONS = frozenset({"PodResizePending", "PodResizeInProgress"})
"""Conditions only the node writes, and removes by no longer reporting them (the kubelet's
status manager drops them when a resize is accepted or done): removed from the API's copy on
our first write even though we did not write them in this run."""


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any], *, first: bool) -> dict[str, Any]:
    """The strategic merge patch of pod status that turns ``old`` into ``new``.

    ``old`` is what we wrote last, or on our ``first`` write in this run the API's copy (then
    keys and conditions we do not produce are left alone: they may be another writer's).
    Conditions are patched by type, as the kubelet's status manager does: a condition someone
    else owns (a readiness gate's, DisruptionTarget) is never sent, so a write of ours racing
    theirs cannot undo it."""
    plain_old = {k: v for k, v in old.items() if k not in MERGE_KEYS}
    plain_new = {k: v for k, v in new.items() if k not in MERGE_KEYS}
    patch = merge_diff(plain_old, plain_new, remove=not first)
    for name, key in MERGE_KEYS.items():
        if name not in new:
            if name != "conditions" and name in old and not first:
                patch[name] = None  # never for conditions: that would drop other writers' too
            continue
        if first and name == "conditions":
            removable: Callable[[Any], bool] = NODE_OWNED_CONDITIONS.__contains__
        else:
            removable = _always
        items = _keyed_diff(old.get(name) or [], new.get(name) or [], key, removable)
        if items:
            patch[name] = items
    return patch


def _always(_: Any) -> bool:
    return True


def _keyed_diff(old: list[Mapping[str, Any]], new: list[Mapping[str, Any]], key: str,
                removable: Callable[[Any], bool]) -> list[dict[str, Any]]:
    """The items of a merge-keyed list that changed: new ones whole, changed ones as a merge
    diff (a field we no longer write becomes null, else the server would keep it), and a
    ``$patch: delete`` directive for each removable one that went."""
    before = {item.get(key): item for item in old}
    out: list[dict[str, Any]] = []
    for item in new:
        was = before.get(item[key])
        if was is None:
            out.append(dict(item))
        elif was != item:
            out.append({**merge_diff(was, item), key: item[key]})
    present = {item[key] for item in new}
    out += [{key: value, "$patch": "delete"} for value in before if value not in present and removable(value)]
    return out


def api_status(computed: Mapping[str, Any], previous: Mapping[str, Any] | None,
               in_api: Mapping[str, Any] | None) -> dict[str, Any]:
    """The status to send: ours, with each condition's lastTransitionTime kept while its status
    stays the same (the writer stamps every recomputation). Conditions of other writers are not
    ours to send (status_patch leaves them alone)."""
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
    if ours:
        status["conditions"] = ours
    return status
