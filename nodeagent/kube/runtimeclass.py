"""RuntimeClass (node.k8s.io/v1): what a pod's ``runtimeClassName`` means.

Two parties act on it upstream, and nodeagent does both parts where the kubelet's world has them:

* the API server's RuntimeClass admission plugin, on pod creation: the class's
  ``overhead.podFixed`` becomes ``spec.overhead``, its ``scheduling.nodeSelector`` is merged
  into the pod's and its ``scheduling.tolerations`` appended (:func:`admit`). In cluster mode
  the API server has done that before the pod reaches the node; standalone there is no API
  server, so the static source applies it when a static pod first appears (as the mirror pod's
  creation would), with the admission plugin's refusals;
* the kubelet, at sandbox creation: the class's ``handler`` is the CRI runtime handler
  (plugins/runtime/runtimeclass.py), and ``spec.overhead`` counts in admission and the pod
  cgroup (nodeagent/kube/resources.py, plugins/runtime/podcgroup.py).

Messages are the admission plugin's (plugin/pkg/admission/runtimeclass).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from nodeagent import quantity

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class RuntimeClassRejected(ValueError):
    """The API server's RuntimeClass admission refuses the pod (Forbidden)."""


def check(obj: Mapping[str, Any]) -> None:
    """The API server's validation of the fields a node reads (a manifest that fails it is
    refused with its file, as the API server would refuse it)."""
    handler = obj.get("handler")
    if not isinstance(handler, str) or not handler:
        raise ValueError("handler: Required value")
    if len(handler) > 63 or not _DNS1123_LABEL.match(handler):
        raise ValueError(f"handler: Invalid value: {handler!r}: a lowercase RFC 1123 label must consist of lower "
                         "case alphanumeric characters or '-', and must start and end with an alphanumeric character")
    overhead = obj.get("overhead")
    if overhead is not None:
        fixed = overhead.get("podFixed") if isinstance(overhead, Mapping) else None
        if overhead and not isinstance(fixed, Mapping | None):
            raise ValueError("overhead.podFixed: must be a map of resource quantities")
        for name, value in (fixed or {}).items():
            try:
                quantity.parse(value)
            except (TypeError, ValueError):
                raise ValueError(f"overhead.podFixed[{name}]: Invalid value: {value!r}: must be a quantity") from None
    scheduling = obj.get("scheduling")
    if scheduling is not None and not isinstance(scheduling, Mapping):
        raise ValueError("scheduling: must be an object")


def pod_fixed(runtime_class: Mapping[str, Any]) -> dict[str, Any] | None:
    overhead = runtime_class.get("overhead") or {}
    fixed = overhead.get("podFixed") if isinstance(overhead, Mapping) else None
    return dict(fixed) if fixed else None


def _same_quantities(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if set(a) != set(b):
        return False
    return all(quantity.base_units(k, a[k]) == quantity.base_units(k, b[k]) for k in a)


def admit(pod: Mapping[str, Any], runtime_class: Mapping[str, Any]) -> dict[str, Any]:
    """The pod (an API mapping) as the RuntimeClass admission plugin leaves it, or
    :class:`RuntimeClassRejected` with its message."""
    out = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    fixed = pod_fixed(runtime_class)
    current = spec.get("overhead")
    if fixed is not None:
        if current and not _same_quantities(current, fixed):
            raise RuntimeClassRejected("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead")
        spec["overhead"] = fixed
    elif current:
        raise RuntimeClassRejected("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead")
    scheduling = runtime_class.get("scheduling") or {}
    selector = dict(scheduling.get("nodeSelector") or {})
    if selector:
        merged = dict(spec.get("nodeSelector") or {})
        for key, value in selector.items():
            if key in merged and merged[key] != value:
                raise RuntimeClassRejected(
                    f"conflict: runtimeClass.scheduling.nodeSelector[{key}] = {value}; "
                    f"pod.spec.nodeSelector[{key}] = {merged[key]}")
            merged[key] = value
        spec["nodeSelector"] = merged
    tolerations = list(scheduling.get("tolerations") or [])
    if tolerations:
        existing = list(spec.get("tolerations") or [])
        spec["tolerations"] = existing + [t for t in tolerations if t not in existing]
    return out


def not_found_message(name: str) -> str:
    """The API admission plugin's refusal of a pod naming a class that does not exist."""
    return f'pod rejected: RuntimeClass "{name}" not found'


__all__ = ["RuntimeClassRejected", "admit", "check", "not_found_message", "pod_fixed"]
