"""The runtime handler of a pod's sandbox: its ``runtimeClassName`` resolved through the
RuntimeClass object (the kubelet's runtimeclass manager, LookupRuntimeHandler).

The class comes from the object store in both modes: the API server in cluster mode (a node
may get, list and watch RuntimeClasses), the manifests beside the static pods standalone (where
the kubelet, without an API client, would ignore the field and run the default handler: a pod
silently on the wrong runtime is what nodeagent refuses to do). No class name → the default
handler ``""``. A class that is not there fails the sandbox as the kubelet's lister does —
``Failed to create pod sandbox: runtimeclass.node.k8s.io "<name>" not found``, reason
FailedCreatePodSandBox, the pod Pending and retried (the class may be created later).
"""

from __future__ import annotations

from nodeagent.model import Pod
from nodeagent.objects import ObjectError, kinds
from nodeagent.stages import PodContext
from plugins.runtime.sandbox import SandboxConfigError

DEFAULT_HANDLER = ""


def not_found(name: str) -> str:
    """The NotFound text of the kubelet's lister (its generated listers name the resource in
    the singular: ``runtimeclass.node.k8s.io``)."""
    return f'runtimeclass.{kinds.RUNTIME_CLASS.group} "{name}" not found'


async def handler_of(ctx: PodContext, pod: Pod | None = None) -> str:
    """The CRI runtime handler for ``pod`` (default: the context's), or SandboxConfigError."""
    pod = pod or ctx.pod
    name = pod.spec.runtime_class_name
    if not name:
        return DEFAULT_HANDLER
    objects = getattr(ctx, "objects", None)
    if objects is None:
        raise SandboxConfigError(f"Failed to create pod sandbox: failed to lookup RuntimeClass {name}: "
                                 "no object store")
    try:
        found = await objects.get(kinds.RUNTIME_CLASS, name)
    except ObjectError as exc:
        raise SandboxConfigError(f"Failed to create pod sandbox: failed to lookup RuntimeClass {name}: {exc}") \
            from None
    if found is None:
        raise SandboxConfigError(f"Failed to create pod sandbox: {not_found(name)}")
    handler = found.get("handler")
    return handler if isinstance(handler, str) else DEFAULT_HANDLER


__all__ = ["DEFAULT_HANDLER", "handler_of", "not_found"]
