"""A container's environment as the kubelet builds it (kubelet_pods.go makeEnvironmentVariables),
and the downward API values that env vars and downwardAPI volumes share (pkg/fieldpath,
pkg/api/v1/resource).

Only what a node can know without an API server: the pod's own metadata and spec, the pod and
host IPs, and resources. envFrom and configMapKeyRef/secretKeyRef values come already read from
the API (:class:`nodeagent.additions.ApiEnv`, by plugins/apivolumes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from nodeagent import quantity
from nodeagent.additions import ApiEnv
from nodeagent.kube.resources import requests_of
from nodeagent.model import Container, Pod, ResourceFieldSelector

OPERATOR = "$"


def expand(text: str, mapping: Callable[[str], str]) -> str:
    """``$(VAR)`` expansion (third_party/forked/golang/expansion): ``$$`` is an escaped ``$``,
    an unresolved reference stays literal (the mapping decides), an unclosed ``$(`` too."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == OPERATOR and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            nxt = text[cursor + 1]
            advance = 1
            if nxt == OPERATOR:
                out.append(OPERATOR)
            elif nxt == "(":
                close = text.find(")", cursor + 2)
                if close == -1:
                    out.append("$(")
                else:
                    out.append(mapping(text[cursor + 2:close]))
                    advance = close - cursor
            else:
                out.append(OPERATOR + nxt)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def mapping_for(*contexts: Mapping[str, str]) -> Callable[[str], str]:
    """The first context that defines a name wins; an unknown name expands to itself."""

    def lookup(name: str) -> str:
        for context in contexts:
            if name in context:
                return context[name]
        return f"$({name})"

    return lookup


@dataclass(frozen=True)
class PodFacts:
    """What the downward API shows beyond the spec: addresses and the node's allocatable
    (the default for unset limits, as defaultPodLimitsForDownwardAPI does)."""

    pod_ips: Sequence[str] = ()
    host_ips: Sequence[str] = ()
    allocatable: Mapping[str, int] = field(default_factory=dict)
    """``cpu`` in millicores, ``memory`` and ``ephemeral-storage`` in bytes."""


class FieldError(ValueError):
    """A downward-API reference nodeagent cannot resolve (the kubelet fails the container the
    same way: CreateContainerConfigError)."""


def _go_quote(value: str) -> str:
    """Go's %q (strconv.Quote) for the label/annotation files."""
    escapes = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v",
               '"': r"\"", "\\": r"\\"}
    out = []
    for ch in value:
        if ch in escapes:
            out.append(escapes[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def format_map(values: Mapping[str, str]) -> str:
    """fieldpath.FormatMap: ``key="value"`` lines sorted by key, no trailing newline."""
    return "\n".join(f"{k}={_go_quote(values[k])}" for k in sorted(values))


def _subscript(path: str, prefix: str) -> str | None:
    """``metadata.labels['k']`` → ``k`` (None when ``path`` is not of that form)."""
    if path.startswith(prefix + "['") and path.endswith("']"):
        return path[len(prefix) + 2:-2]
    return None


def metadata_value(pod: Pod, path: str) -> str:
    """fieldpath.ExtractFieldPathAsString for the metadata paths."""
    meta = pod.metadata
    simple = {"metadata.name": meta.name, "metadata.namespace": meta.namespace, "metadata.uid": meta.uid}
    if path in simple:
        return simple[path]
    if path == "metadata.labels":
        return format_map(meta.labels)
    if path == "metadata.annotations":
        return format_map(meta.annotations)
    for prefix, values in (("metadata.labels", meta.labels), ("metadata.annotations", meta.annotations)):
        key = _subscript(path, prefix)
        if key is not None:
            return values.get(key, "")
    raise FieldError(f"unsupported fieldPath: {path}")


def field_value(pod: Pod, path: str, facts: PodFacts) -> str:
    """podFieldSelectorRuntimeValue: the env var value of a ``fieldRef``."""
    pod_ips = list(facts.pod_ips)
    if pod.spec.host_network and not pod_ips:
        pod_ips = list(facts.host_ips)  # a host-network pod's IPs are the node's
    by_path = {
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.hostIP": facts.host_ips[0] if facts.host_ips else "",
        "status.hostIPs": ",".join(facts.host_ips),
        "status.podIP": pod_ips[0] if pod_ips else "",
        "status.podIPs": ",".join(pod_ips),
    }
    if path in by_path:
        return by_path[path]
    return metadata_value(pod, path)


_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def resource_value(pod: Pod, container: Container, selector: ResourceFieldSelector, facts: PodFacts) -> str:
    """containerResourceRuntimeValue with the allocatable defaults for unset limits; rounds up
    (1250m with divisor 1 is 2, as the conformance tests expect)."""
    target = container
    if selector.container_name:
        found = [c for c in pod.all_containers() if c.name == selector.container_name]
        if not found:
            raise FieldError(f"container {selector.container_name!r} not found in the pod")
        target = found[0]
    kind, _, resource = selector.resource.partition(".")
    if kind not in ("limits", "requests") or resource not in _RESOURCES:
        raise FieldError(f"unsupported container resource: {selector.resource}")
    if kind == "limits":
        amount = target.resources.limits.get(resource)
        if amount is None:
            # defaultPodLimitsForDownwardAPI: an unset limit is the node's allocatable.
            return _scaled(resource, Decimal(facts.allocatable.get(resource, 0)), selector, base_units=True)
    else:
        amount = requests_of(target).get(resource, 0)
    return _scaled(resource, quantity.parse(amount), selector, base_units=False)


def _scaled(resource: str, amount: Decimal, selector: ResourceFieldSelector, *, base_units: bool) -> str:
    divisor = quantity.parse(selector.divisor) if selector.divisor not in (None, "", 0, "0") else Decimal(1)
    if resource == "cpu":
        # Go: ceil(cpu.MilliValue() / divisor.MilliValue()); allocatable is already millicores.
        milli = int(amount) if base_units else math.ceil(amount * 1000)
        return str(math.ceil(Decimal(milli) / math.ceil(divisor * 1000)))
    return str(math.ceil(Decimal(math.ceil(amount)) / math.ceil(divisor)))


def container_env(pod: Pod, container: Container, facts: PodFacts, api: ApiEnv | None = None) -> dict[str, str]:
    """The container's declared env, resolved in order: a value expands ``$(VAR)`` against the
    variables declared before it; a valueFrom is resolved from the downward API (or ``api``)
    and not expanded (the kubelet's order of precedence). envFrom comes first and is
    overridden by env. Without ``api`` (standalone), API references are left unset."""
    if api is not None and api.error:
        raise FieldError(api.error)
    services = api.services if api is not None else {}
    env: dict[str, str] = dict(api.env_from) if api is not None else {}
    for var in container.env:
        value = var.value
        if value:
            value = expand(value, mapping_for({**services, **env}))
        elif var.value_from is not None:
            source = var.value_from
            if source.field_ref is not None:
                value = field_value(pod, source.field_ref.field_path, facts)
            elif source.resource_field_ref is not None:
                value = resource_value(pod, container, source.resource_field_ref, facts)
            elif (ref := source.config_map_key_ref or source.secret_key_ref) is not None:
                kind = "ConfigMap" if source.config_map_key_ref is not None else "Secret"
                found = api.values.get((kind, ref.name, ref.key)) if api is not None else None
                if found is None:
                    continue  # optional and missing: not set at all (the kubelet's `continue`)
                value = found
        env[var.name] = value
    # Service variables last and only where the container did not set the name itself.
    return {**services, **env}


def expand_command(container: Container, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """ExpandContainerCommandAndArgs: command and args against the final environment."""
    mapping = mapping_for(env)
    return [expand(c, mapping) for c in container.command], [expand(a, mapping) for a in container.args]
