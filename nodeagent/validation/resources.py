"""Resource requirements of containers and of the pod (validateResourceRequirements and the
pod-level rules of PodLevelResources)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from nodeagent import quantity
from nodeagent.validation import field as f
from nodeagent.validation import names
from nodeagent.validation.decode import Obj, decode_quantity, json_type
from nodeagent.validation.field import Path

_STANDARD_CONTAINER = frozenset({"cpu", "memory", "ephemeral-storage"})
# helper.standardResources: names the API knows without a domain (quota names among them).
_STANDARD = _STANDARD_CONTAINER | frozenset({
    "requests.cpu", "requests.memory", "requests.ephemeral-storage", "limits.cpu", "limits.memory",
    "limits.ephemeral-storage", "pods", "services", "replicationcontrollers", "resourcequotas", "secrets",
    "configmaps", "persistentvolumeclaims", "storage", "requests.storage", "services.nodeports",
    "services.loadbalancers"})
_POD_LEVEL = ("cpu", "memory")
_HUGEPAGES = "hugepages-"
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Quantity:
    value: Decimal
    text: str
    """As written (shown in messages: the user's own spelling)."""


def read_quantities(obj: Obj, name: str) -> dict[str, tuple[Path, Quantity]]:
    raw = obj.data.get(name)
    if raw is None:
        return {}
    path = obj.at(name)
    if not isinstance(raw, dict):
        obj.errs.append(f.type_invalid(path, json_type(raw), "object"))
        return {}
    out = {}
    for k, v in raw.items():
        q = decode_quantity(v, path.key(k), obj.errs)
        if q is not None:
            out[k] = (path.key(k), Quantity(q, v if isinstance(v, str) else repr(v)))
    return out


def is_native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def is_hugepages(name: str) -> bool:
    return name.startswith(_HUGEPAGES)


def overcommit_allowed(name: str) -> bool:
    return is_native(name) and not is_hugepages(name)


def is_extended(name: str) -> bool:
    if is_native(name) or name.startswith("requests."):
        return False
    return not names.is_qualified_name("requests." + name)


def _resource_name(name: str, path: Path, errs: list[f.FieldError], *, container: bool) -> None:
    msgs = names.is_qualified_name(name)
    if msgs:
        errs += [f.invalid(path, name, m) for m in msgs]
        return
    if "/" not in name and name not in _STANDARD and not is_hugepages(name):
        errs.append(f.invalid(path, name, "must be a standard resource type or fully qualified"))
    if not container:
        return
    if "/" not in name:
        if name not in _STANDARD_CONTAINER and not is_hugepages(name):
            errs.append(f.invalid(path, name, "must be a standard resource for containers"))
    elif not is_native(name) and not is_extended(name):
        errs.append(f.invalid(path, name, "doesn't follow extended resource name standard"))


def _quantity_value(name: str, q: Quantity, path: Path, errs: list[f.FieldError]) -> None:
    if q.value < 0:
        errs.append(f.invalid(path, q.text, "must be greater than or equal to 0"))
        return
    # Not an API rule: whatever the runtime is given (millicores, bytes) is a 64-bit integer.
    units = q.value * 1000 if name == "cpu" else q.value
    if units > INT64_MAX:
        errs.append(f.invalid(path, q.text, "must be less than or equal to 9223372036854775807 "
                              + ("millicores" if name == "cpu" else "units")))
        return
    if is_extended(name) and q.value != q.value.to_integral_value():
        errs.append(f.invalid(path, q.text, "must be an integer"))
    if is_hugepages(name):
        try:
            page = quantity.parse(name.removeprefix(_HUGEPAGES))
        except ValueError:
            page = Decimal(0)
        if page <= 0 or q.value % page != 0:
            errs.append(f.invalid(path, q.text, f"{q.text} is not positive integer multiple of {name}"))


@dataclass
class Requirements:
    limits: dict[str, Decimal]
    requests: dict[str, Decimal]


def validate_requirements(res: Obj | None, claim_names: set[str], *, container: bool = True) -> Requirements:
    """One ``resources`` block (a container's, or the pod's with ``container=False``)."""
    if res is None:
        return Requirements({}, {})
    errs = res.errs
    limits = read_quantities(res, "limits")
    requests = read_quantities(res, "requests")
    lim_path, req_path = res.at("limits"), res.at("requests")
    for name, (path, q) in limits.items():
        _resource_name(name, path, errs, container=container)
        if not container and "/" not in name and name not in _POD_LEVEL and not is_hugepages(name):
            errs.append(f.not_supported(path, name, _POD_LEVEL))
        _quantity_value(name, q, path, errs)
    for name, (path, q) in requests.items():
        _resource_name(name, path, errs, container=container)
        if not container and "/" not in name and name not in _POD_LEVEL and not is_hugepages(name):
            errs.append(f.not_supported(path, name, _POD_LEVEL))
        _quantity_value(name, q, path, errs)
        if name in limits:
            limit = limits[name][1]
            if q.value != limit.value and not overcommit_allowed(name):
                errs.append(f.invalid(req_path, q.text, f"must be equal to {name} limit of {limit.text}"))
            elif q.value > limit.value:
                errs.append(f.invalid(req_path, q.text, f"must be less than or equal to {name} limit of {limit.text}"))
        elif not overcommit_allowed(name):
            errs.append(f.required(lim_path, "Limit must be set for non overcommitable resources"))
    compute = {"cpu", "memory"}
    if not (compute & (set(limits) | set(requests))) and any(is_hugepages(n) for n in (*limits, *requests)):
        errs.append(f.forbidden(res.path, "HugePages require cpu or memory"))
    if container:
        _claims(res, claim_names)
    elif res.has("claims"):
        errs.append(f.forbidden(res.at("claims"), "claims cannot be set for Resources at pod-level"))
    return Requirements({k: v[1].value for k, v in limits.items()}, {k: v[1].value for k, v in requests.items()})


def _claims(res: Obj, claim_names: set[str]) -> None:
    errs = res.errs
    seen: set[str] = set()
    for claim in res.objs("claims"):
        name, request = claim.str("name"), claim.str("request")
        if not name:
            errs.append(f.required(claim.path))
            continue
        if name in seen:
            errs.append(f.duplicate(claim.path, name))
        else:
            key = name
            if request:
                errs += names.validate_with(names.is_dns1123_label, claim.at("request"), request)
                key += "/" + request
            if key in seen:
                errs.append(f.duplicate(claim.path, key))
            elif not request and any(k.split("/", 1)[0] == name for k in seen if "/" in k):
                errs.append(f.duplicate(claim.path, name))
            seen.add(key)
        if name not in claim_names:
            detail = "must be one of the names in pod.spec.resourceClaims"
            detail += ": " + ", ".join(sorted(claim_names)) if claim_names else " which is empty"
            errs.append(f.not_found(claim.path, name, detail))


def validate_pod_consistency(pod_res: Obj, pod: Requirements, regular: list[Requirements],
                             init: list[tuple[Requirements, bool]]) -> None:
    """Pod-level requests cover what the containers request together; no container's limit is
    above the pod's (validatePodResourceConsistency). ``init`` pairs each init container's
    requirements with whether it is a sidecar."""
    aggregate: dict[str, Decimal] = {}
    for r in regular:
        for k, v in r.requests.items():
            aggregate[k] = aggregate.get(k, Decimal(0)) + v
    sidecars: dict[str, Decimal] = {}
    for r, sidecar in init:
        if sidecar:
            for k, v in r.requests.items():
                sidecars[k] = sidecars.get(k, Decimal(0)) + v
                aggregate[k] = aggregate.get(k, Decimal(0)) + v
        else:  # an init container runs beside the sidecars started before it
            for k, v in r.requests.items():
                aggregate[k] = max(aggregate.get(k, Decimal(0)), v + sidecars.get(k, Decimal(0)))
    req_path = pod_res.at("requests")
    for k, total in sorted(aggregate.items()):
        if k in pod.requests and total > pod.requests[k]:
            pod_res.errs.append(f.invalid(req_path.key(k), _show(pod.requests[k]),
                                          f"must be greater than or equal to aggregate container requests of "
                                          f"{_show(total)}"))
    for i, r in enumerate(regular):
        for k, v in sorted(r.limits.items()):
            if k in pod.limits and v > pod.limits[k]:
                pod_res.errs.append(f.invalid(pod_res.at("containers").index(i).key(k).child("limits"), _show(v),
                                              f"must be less than or equal to pod limits of {_show(pod.limits[k])}"))


def _show(value: Decimal) -> str:
    """A quantity in plain digits (the API shows its canonical form)."""
    if value == value.to_integral_value():
        return str(int(value))
    return f"{math.ceil(value * 1000)}m"
