"""Whether a node's labels satisfy a pod's ``spec.nodeSelector`` and required node affinity.

The kubelet re-checks this at admission (GeneralPredicates, via the scheduler's
GetRequiredNodeAffinity): a pod bound to a node it does not match, by a client that set
``spec.nodeName`` itself or a static pod, is rejected with reason ``NodeAffinity``. Pure
functions over plain mappings, the shapes the API uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

REASON = "NodeAffinity"
MESSAGE = "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"


def matches(node_name: str, labels: Mapping[str, str], node_selector: Mapping[str, str],
            affinity: Mapping[str, Any] | None) -> bool:
    """nodeSelector (every label equal) AND requiredDuringSchedulingIgnoredDuringExecution
    (any of its terms; within a term every expression and field)."""
    if any(labels.get(key) != value for key, value in node_selector.items()):
        return False
    required = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    terms = required.get("nodeSelectorTerms") or []
    # An empty term matches nothing (the API rejects an empty term list, so never all-empty).
    return any(_term(node_name, labels, term) for term in terms)


def _term(node_name: str, labels: Mapping[str, str], term: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return (all(_expression(labels, e) for e in expressions)
            and all(_expression({"metadata.name": node_name}, f) for f in fields))


def _expression(labels: Mapping[str, str], expression: Mapping[str, Any]) -> bool:
    key = expression.get("key", "")
    operator = expression.get("operator", "")
    values: Sequence[str] = expression.get("values") or []
    present = key in labels
    value = labels.get(key, "")
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        # One integer value; a label that is not an integer never matches.
        try:
            have, want = int(value), int(values[0])
        except (ValueError, IndexError):
            return False
        return present and (have > want if operator == "Gt" else have < want)
    return False  # an operator the API would not have accepted
