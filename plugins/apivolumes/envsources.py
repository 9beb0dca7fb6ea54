"""A container's env from the API: envFrom and configMapKeyRef/secretKeyRef, resolved the way
kubelet_pods.go makeEnvironmentVariables does, into the :class:`ApiEnv` the env builder reads.

A missing required object or key does not fail the stage: it is recorded in ``ApiEnv.error``,
so that the sandbox runs and the container waits with CreateContainerConfigError and the
kubelet's message until the object appears (the kubelet's behaviour).
"""

from __future__ import annotations

from nodeagent.additions import ApiEnv
from nodeagent.kube.configdata import Kind, ObjectData, ObjectReader, ObjectUnavailable
from nodeagent.model import Container


def uses_api(container: Container) -> bool:
    return bool(container.env_from) or any(
        v.value_from is not None and (v.value_from.config_map_key_ref or v.value_from.secret_key_ref)
        for v in container.env if not v.value)


async def _object(reader: ObjectReader, kind: Kind, name: str, optional: bool) -> ObjectData | None:
    """None when the object is missing and ``optional``; otherwise raises ObjectUnavailable."""
    try:
        return await reader.get(kind, name)
    except ObjectUnavailable as exc:
        if exc.not_found and optional:
            return None
        raise


async def resolve_env(container: Container, reader: ObjectReader, namespace: str) -> ApiEnv:
    """The container's ApiEnv. A required object or key the API says is missing gives an
    ApiEnv with ``error``; an object that could not be read at all (forbidden, the API server
    down) raises :class:`ObjectUnavailable`."""
    env_from: dict[str, str] = {}
    values: dict[tuple[str, str, str], str] = {}
    try:
        # envFrom first, in order (a later source overrides an earlier one); env overrides it.
        for source in container.env_from:
            ref = source.config_map_ref or source.secret_ref
            if ref is None:
                continue
            kind: Kind = "ConfigMap" if source.config_map_ref is not None else "Secret"
            obj = await _object(reader, kind, ref.name, ref.optional)
            if obj is None:
                continue
            for key, value in obj.env_values().items():
                env_from[source.prefix + key] = value
        for var in container.env:
            value_from = var.value_from
            if var.value or value_from is None:
                continue  # a literal value wins over valueFrom, as in the kubelet
            selector = value_from.config_map_key_ref or value_from.secret_key_ref
            if selector is None:
                continue  # the downward API: resolved by the env builder itself
            kind = "ConfigMap" if value_from.config_map_key_ref is not None else "Secret"
            obj = await _object(reader, kind, selector.name, selector.optional)
            if obj is None:
                continue
            found = obj.env_values().get(selector.key)
            if found is None:
                if selector.optional:
                    continue
                return ApiEnv(error=f"couldn't find key {selector.key} in {kind} {namespace}/{selector.name}")
            values[(kind, selector.name, selector.key)] = found
    except ObjectUnavailable as exc:
        if not exc.not_found:
            raise  # forbidden, API down: the caller may keep what it read before
        return ApiEnv(error=str(exc))
    return ApiEnv(env_from=env_from, values=values)
