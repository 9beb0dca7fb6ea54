"""Pod start counts: kubelet_started_pods_total and kubelet_started_user_namespaced_pods_total,
with their error counters (the kubelet's pkg/kubelet/metrics names).

The kubelet counts in SyncPod, each time it creates a pod's sandbox: every attempt counts
as started. A pod error is a failed sandbox creation (RuntimeClass lookup, the user namespace's
mappings, RunPodSandbox). For pods with ``hostUsers: false`` it also counts the failures of that
same sync pass — usually a container that cannot be created or started inside the user
namespace — because those are how user namespace problems show. Here the sandbox is created in
``prepare`` and the containers are first created and started in ``start``. That start pass
counts as the rest of the kubelet's SyncPod.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from nodeagent.stages import PodContext
from nodeagent.stash import StashKey

FIRST_SYNC = StashKey[bool]("runtime.first_sync")
"""Set when a sandbox was created and its first container pass has not run yet; whether the pod
has its own user namespace."""
CONTAINER_FAILURES = StashKey[int]("runtime.container_failures")
"""Containers of the pod that could not be configured, created or started, so far."""


class StartCounts:
    def __init__(self) -> None:
        self.pods = 0
        self.pod_errors = 0
        self.userns_pods = 0
        self.userns_errors = 0

    @contextmanager
    def sandbox_creation(self, ctx: PodContext) -> Iterator[None]:
        """Around one attempt to create the pod's sandbox: counted, and counted as an error if
        it raises (cancellation is not a failure)."""
        userns = ctx.pod.spec.host_users is False
        self.pods += 1
        self.userns_pods += userns
        try:
            yield
        except Exception:
            self.pod_errors += 1
            self.userns_errors += userns
            raise
        ctx.stash[FIRST_SYNC] = userns

    @staticmethod
    def container_failed(ctx: PodContext) -> None:
        ctx.stash[CONTAINER_FAILURES] = (ctx.stash.get(CONTAINER_FAILURES) or 0) + 1

    @contextmanager
    def sync_pass(self, ctx: PodContext) -> Iterator[None]:
        """Around one pass of the sync loop (``start``'s, or one that recreates the sandbox): if
        a sandbox was created before or during it, a user-namespaced pod whose containers failed
        in the pass counts one error (once per sandbox, as the kubelet's deferred check)."""
        before = ctx.stash.get(CONTAINER_FAILURES) or 0
        try:
            yield
        except Exception:
            self.userns_errors += bool(ctx.stash.pop(FIRST_SYNC, False))
            raise
        if ctx.stash.pop(FIRST_SYNC, False) and (ctx.stash.get(CONTAINER_FAILURES) or 0) > before:
            self.userns_errors += 1

    def render_metrics(self) -> str:
        lines = []
        for name, value, text in (
                ("kubelet_started_pods_total", self.pods, "Pod sandboxes this node tried to create."),
                ("kubelet_started_pods_errors_total", self.pod_errors, "Pod sandboxes that could not be created."),
                ("kubelet_started_user_namespaced_pods_total", self.userns_pods,
                 "Sandboxes of pods with their own user namespace (hostUsers: false) this node tried to create."),
                ("kubelet_started_user_namespaced_pods_errors_total", self.userns_errors,
                 "Those of them whose sandbox, or a container in the pass that followed it, failed.")):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]
        return "\n".join(lines) + "\n"
