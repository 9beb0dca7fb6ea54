"""Service environment variables (pkg/kubelet/envvars, kubelet_pods.go getServiceEnvVarMap):
every container of an API pod sees the services of its namespace (unless
``enableServiceLinks: false``) and the master service ``default/kubernetes`` as Docker-link
style variables, e.g. ``FOO_SERVICE_HOST``, ``FOO_SERVICE_PORT``, ``FOO_PORT_80_TCP_ADDR``.

They have the lowest precedence: the container's env and envFrom win, and a value may refer to
them with ``$(VAR)`` (nodeagent/kube/env.py). They come, as the kubelet's do, from a service
informer: one object-store view of every namespace's services (the node's credentials may
list and watch them), read at each pass of the apivolumes stage (its prepare and its resync)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nodeagent.objects import View

MASTER_NAMESPACE = "default"
MASTER_SERVICES = frozenset({"kubernetes"})


SYNC_WAIT_SECONDS = 10.0
"""How long a pass waits for the services view's first listing before it goes on without it."""


class ServicesUnavailable(Exception):
    """The services could not be listed (forbidden, the API server away)."""


def _var_name(name: str) -> str:
    return name.replace("-", "_").upper()


def _has_ip(spec: Any) -> bool:
    ip = (spec or {}).get("clusterIP") or ""
    return ip not in ("", "None")


def env_for(services: Iterable[Any]) -> dict[str, str]:
    """envvars.FromServices: for each service with a cluster IP, its host and ports, then its
    link variables per port (the first port also as ``<NAME>_PORT``)."""
    env: dict[str, str] = {}
    for svc in services:
        spec = svc.get("spec")
        if not spec or not _has_ip(spec):
            continue
        name, ip = _var_name(svc["metadata"]["name"]), spec["clusterIP"]
        ports = list(spec.get("ports") or [])
        env[f"{name}_SERVICE_HOST"] = ip
        if ports:
            env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                env[f"{name}_SERVICE_PORT_{_var_name(port['name'])}"] = str(port["port"])
        for i, port in enumerate(ports):
            protocol = (port.get("protocol") or "TCP").upper()
            address = f"[{ip}]:{port['port']}" if ":" in ip else f"{ip}:{port['port']}"
            url = f"{protocol.lower()}://{address}"
            if i == 0:
                env[f"{name}_PORT"] = url
            prefix = f"{name}_PORT_{port['port']}_{protocol}"
            env[prefix] = url
            env[f"{prefix}_PROTO"] = protocol.lower()
            env[f"{prefix}_PORT"] = str(port["port"])
            env[f"{prefix}_ADDR"] = ip
    return env


async def service_env(services: View, namespace: str, links: bool) -> Mapping[str, str]:
    """The variables for a pod in ``namespace`` from ``services`` (a view of every namespace's
    services); raises :class:`ServicesUnavailable` while the view has not listed them."""
    if not await services.wait_synced(SYNC_WAIT_SECONDS):
        raise ServicesUnavailable(f"cannot list services in {namespace}: {services.error or 'not listed yet'}")
    chosen: dict[str, Any] = {}
    if links:
        for svc in services.items():
            meta = svc.get("metadata") or {}
            if meta.get("namespace") == namespace and _has_ip(svc.get("spec")):
                chosen[meta["name"]] = svc
    if namespace != MASTER_NAMESPACE or not links:
        for name in MASTER_SERVICES:
            if name in chosen:
                continue  # a same-named service of the pod's own namespace wins
            svc = services.get(name, MASTER_NAMESPACE)
            if svc is not None and _has_ip(svc.get("spec")):
                chosen[name] = svc
    # Sorted like the kubelet's map iteration does not matter: the names do not collide.
    return env_for(chosen[n] for n in sorted(chosen))
