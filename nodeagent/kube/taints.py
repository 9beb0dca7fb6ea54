"""Taint toleration as the API defines it (``Toleration.ToleratesTaint``), shared by admission
stages (tainttoleration: NoExecute taints; eviction: the memory-pressure taint).

Toleration matching follows ``Toleration.ToleratesTaint``: an empty effect matches every effect,
an empty key (with ``Exists``) every key, ``Equal`` (or no operator) compares values,
``Exists`` ignores them; ``Lt``/``Gt`` match nothing (their feature gate,
TaintTolerationComparisonOperators, is alpha and off by default). ``tolerationSeconds`` does not
matter at admission: a pod that tolerates a taint for a while is admitted (the taint manager
evicts it later).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NO_EXECUTE = "NoExecute"


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


def first_untolerated(taints: Sequence[Mapping[str, Any]],
                      tolerations: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first NoExecute taint no toleration tolerates, or None."""
    for taint in taints:
        if taint.get("effect") == NO_EXECUTE and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


__all__ = ["NO_EXECUTE", "first_untolerated", "tolerates"]
