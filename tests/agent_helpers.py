"""Running a real nodeagent against the session's containerd, for integration tests."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from cri import RuntimeClient
from cri import types as t
from devenv.images import BUSYBOX_IMAGE
from nodeagent import labels as L
from nodeagent.agent import Agent
from nodeagent.clock import Clock
from nodeagent.config import AgentConfig

__all__ = ["BUSYBOX_IMAGE", "AgentEnv", "CountingRuntime", "running_agent", "wait_for", "pod_manifest", "runtime_objects"]


async def wait_for(predicate: Callable[[], Awaitable[Any]], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    last: Any = None
    with anyio.move_on_after(timeout):
        while True:
            last = await predicate()
            if last:
                return last
            await anyio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")


def pod_manifest(name: str, command: str = "sleep 3600", **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {})
    container = {"name": spec.pop("container_name", "main"), "image": BUSYBOX_IMAGE, "command": ["sh", "-c", command]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [container], **spec},
    }


async def runtime_objects(client: RuntimeClient, node: str) -> tuple[list[t.PodSandbox], list[t.Container]]:
    sandboxes = [s for s in await client.list_pod_sandbox() if s.labels.get(L.MANAGED_BY) == node]
    containers = [c for c in await client.list_containers() if c.labels.get(L.MANAGED_BY) == node]
    return sandboxes, containers


class CountingRuntime:
    """The real runtime client, with a note of every call made through it (name and arguments):
    to show which CRI calls a component makes, not to stand in for the runtime."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name.startswith("_") or not callable(attr):
            return attr
        if name == "container_events":  # an async generator, not a coroutine
            def stream(*args: Any, **kwargs: Any) -> Any:
                self.calls.append((name, args, kwargs))
                return attr(*args, **kwargs)
            return stream

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return await attr(*args, **kwargs)
        return call

    def named(self, *names: str) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        return [c for c in self.calls if c[0] in names]


@dataclass
class AgentEnv:
    agent: Agent
    config: AgentConfig
    manifests: Path
    client: RuntimeClient

    @property
    def node(self) -> str:
        return self.config.node_name

    def write(self, filename: str, *docs: dict[str, Any]) -> None:
        text = "\n---\n".join(json.dumps(d) for d in docs)
        tmp = self.manifests / f".{filename}.tmp"
        tmp.write_text(text)
        tmp.rename(self.manifests / filename)

    def remove(self, filename: str) -> None:
        (self.manifests / filename).unlink()

    def uid_of(self, name: str) -> str | None:
        for uid, (ref, _pod, _status, _state) in self.agent.status.all().items():
            if ref.name == f"{name}-{self.node}":
                return uid
        return None

    def status_of(self, name: str) -> dict[str, Any]:
        uid = self.uid_of(name)
        return self.agent.status.get(uid) if uid else {}

    async def running_containers(self, name: str) -> list[t.Container]:
        _, containers = await runtime_objects(self.client, self.node)
        return [
            c for c in containers
            if c.labels.get(L.POD_NAME) == f"{name}-{self.node}" and c.state == t.ContainerState.CONTAINER_RUNNING
        ]

    async def wait_running(self, name: str, timeout: float = 30.0) -> t.Container:
        found = await wait_for(lambda: self.running_containers(name), timeout, f"pod {name} running in containerd")
        return found[0]

    async def wait_seen_running(self, name: str, timeout: float = 30.0) -> t.Container:
        """Running in containerd, and so in the agent's own view (its relister lags the runtime
        by up to a relist): what the agent serves (exec, attach, logs) works from that view."""
        found = await self.wait_running(name, timeout)

        async def seen() -> bool:
            statuses = self.status_of(name).get("containerStatuses", [])
            return bool(statuses) and all("running" in cs.get("state", {}) for cs in statuses)

        await wait_for(seen, timeout, f"pod {name} running in the agent's view")
        return found

    async def wait_empty(self, timeout: float = 30.0) -> None:
        async def empty() -> bool:
            sandboxes, containers = await runtime_objects(self.client, self.node)
            return not sandboxes and not containers

        await wait_for(empty, timeout, f"no runtime objects left for node {self.node}")


def make_config(base: Path, endpoint: str, node: str | None = None, **overrides: Any) -> AgentConfig:
    node = node or f"t{uuid.uuid4().hex[:8]}"
    manifests = base / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {
        "node_name": node,
        "static_pod_path": manifests,
        "container_runtime_endpoint": endpoint,
        "root_dir": base / "root",
        "pod_logs_dir": base / "logs",
        "container_logs_symlink_dir": base / "containers",
        "healthz_port": 0,
        "file_check_frequency": 5.0,
        # Many agents share this host and its loopback control plane: not the host's address.
        "node_ip": "127.0.0.1",
    }
    return AgentConfig(**{**settings, **overrides})


@asynccontextmanager
async def running_agent(containerd: Any, base: Path, *, cleanup: bool = True, config: AgentConfig | None = None,
                        clock: Clock | None = None, **overrides: Any) -> AsyncIterator[AgentEnv]:
    """Start an in-process agent; on exit remove every manifest, wait until the runtime holds
    nothing of the agent's node, and stop it (even when that wait fails: a hung teardown must
    fail the test, never hang the session)."""
    config = config or make_config(base, containerd.endpoint, **overrides)
    assert config.static_pod_path is not None
    async with RuntimeClient(containerd.endpoint) as client:
        agent = Agent(config, clock=clock)
        async with anyio.create_task_group() as tg:
            await tg.start(agent.run)
            env = AgentEnv(agent, config, config.static_pod_path, client)
            try:
                yield env
            finally:
                try:
                    if cleanup:
                        with anyio.CancelScope(shield=True):
                            for f in config.static_pod_path.iterdir():
                                f.unlink()
                            await env.wait_empty(60)
                finally:
                    tg.cancel_scope.cancel()
