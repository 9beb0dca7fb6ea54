"""The memory runtime's state machine: what each CRI call does, with containerd's rules.

This module knows sandboxes, containers, images and their transitions; the gRPC layer
(service.py) only converts messages and reports :class:`CriFailure` as the gRPC status
containerd would answer. Messages are containerd's (pkg/cri/server), so that code matching on
them (the runtime stage's "starting state", "context canceled") meets the words it meets in
production.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import os
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc
import grpc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from conformance.memruntime.images import Image, ImageStore
from conformance.memruntime.objects import (
    POD_UID_LABEL,
    Container,
    ContainerFiles,
    CriLog,
    Sandbox,
    now_ns,
)
from conformance.memruntime.process import (
    SIGNALS,
    Context,
    Exit,
    ExitShell,
    Process,
    SigtermMode,
    default_argv,
    run_argv,
)
from cri._generated import api_pb2 as api

Flavour = Literal["2.x", "1.6"]
START_ERROR_CODE = 128  # containerd's errorStartExitCode
START_ERROR_REASON = "StartError"
OOM_REASON = "OOMKilled"
EVENT_BUFFER = 1000
_SIGNAL_NUMBERS = {api.SIGTERM: 15, api.SIGINT: 2, api.SIGQUIT: 3, api.SIGHUP: 1, api.SIGKILL: 9,
                   api.SIGUSR1: 10, api.SIGUSR2: 12}


class CriFailure(Exception):
    """A call fails with ``code`` and containerd's ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def not_found(message: str) -> CriFailure:
    return CriFailure(grpc.StatusCode.NOT_FOUND, message)


def unknown(message: str) -> CriFailure:
    # containerd's plain fmt errors reach the client as UNKNOWN (errdefs.ToGRPC)
    return CriFailure(grpc.StatusCode.UNKNOWN, message)


def state_name(state: int) -> str:
    return str(api.ContainerState.Name(state))


class RuntimeState:
    """Everything the runtime holds; one per :class:`~conformance.memruntime.MemoryRuntime`."""

    def __init__(self, root: Path, *, sigterm: SigtermMode = "pid1", handlers: Sequence[str] = ("runc",),
                 subnet: str = "10.88.0.0/16", flavour: Flavour = "2.x") -> None:
        self.root = root
        self.flavour: Flavour = flavour
        """Whose answers where containerd 2.x and 1.6 differ (see the package docstring)."""
        self.sigterm: SigtermMode = sigterm
        self.handlers = {"", *handlers}
        self.sandboxes: dict[str, Sandbox] = {}
        self.containers: dict[str, Container] = {}
        self.images = ImageStore()
        self._names: dict[str, str] = {}
        """Reserved sandbox and container names → the id holding each (containerd's name index)."""
        self._ips = (str(ip) for ip in itertools.islice(ipaddress.ip_network(subnet).hosts(), 1, None))
        self._pids = itertools.count(1000)
        self._subscribers: list[MemoryObjectSendStream[api.ContainerEventResponse]] = []
        self.task_group: anyio.abc.TaskGroup | None = None
        """Where container processes run (set while the runtime runs)."""
        self.exec_handler: Callable[[Container, Sequence[str]], api.ExecSyncResponse | None] | None = None
        """A test's own ExecSync answers; None from it falls back to the interpreter."""

    # --- lookups ------------------------------------------------------------------------

    def _find(self, table: dict[str, Any], ident: str) -> Any:
        if ident in table:
            return table[ident]
        if ident:
            found = [v for k, v in table.items() if k.startswith(ident)]
            if len(found) == 1:
                return found[0]
        return None

    def sandbox(self, sandbox_id: str) -> Sandbox:
        found = self._find(self.sandboxes, sandbox_id)
        if found is None:
            which = "" if self.flavour == "2.x" else f' "{sandbox_id}"'
            raise not_found(f"an error occurred when try to find sandbox{which}: not found")
        return found  # type: ignore[no-any-return]

    def container(self, container_id: str) -> Container:
        found = self._find(self.containers, container_id)
        if found is None:
            raise not_found(f'an error occurred when try to find container "{container_id}": not found')
        return found  # type: ignore[no-any-return]

    def pod_of(self, method: str, request: Any) -> str:
        """The pod UID a request concerns, when the runtime can tell (for the call log and for
        faults aimed at one pod)."""
        try:
            if method == "RunPodSandbox":
                return str(request.config.metadata.uid)
            if method == "PullImage":
                return str(request.sandbox_config.metadata.uid)
            sandbox_id = getattr(request, "pod_sandbox_id", "")
            if sandbox_id:
                found = self._find(self.sandboxes, sandbox_id)
                return found.uid if found is not None else ""
            container_id = getattr(request, "container_id", "")
            if container_id:
                found = self._find(self.containers, container_id)
                return found.pod_uid if found is not None else ""
            if method in ("ListPodSandbox", "ListContainers", "ListContainerStats", "ListPodSandboxStats"):
                return str(request.filter.label_selector.get(POD_UID_LABEL, ""))
        except AttributeError:
            pass
        return ""

    # --- events -------------------------------------------------------------------------

    def subscribe(self) -> MemoryObjectReceiveStream[api.ContainerEventResponse]:
        send, receive = anyio.create_memory_object_stream[api.ContainerEventResponse](EVENT_BUFFER)
        self._subscribers.append(send)
        return receive

    def unsubscribe(self, stream: MemoryObjectReceiveStream[api.ContainerEventResponse]) -> None:
        stream.close()

    def _event(self, object_id: str, kind: int, sandbox: Sandbox | None) -> None:
        event = api.ContainerEventResponse(container_id=object_id, container_event_type=kind, created_at=now_ns())  # type: ignore[arg-type]  # a proto enum is an int
        if sandbox is not None:
            event.pod_sandbox_status.CopyFrom(self.sandbox_status(sandbox))
            event.containers_statuses.extend(self.container_status(c) for c in self.containers.values()
                                             if c.sandbox_id == sandbox.id)
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                pass  # a subscriber that does not read loses events (it relists, as the kubelet does)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._subscribers.remove(send)

    # --- names --------------------------------------------------------------------------

    def _reserve(self, kind: str, name: str, ident: str) -> None:
        holder = self._names.get(name)
        if holder is not None:
            message = f'failed to reserve {kind} name "{name}": name "{name}" is reserved for "{holder}"'
            if self.flavour == "2.x":
                raise CriFailure(grpc.StatusCode.FAILED_PRECONDITION, message)
            raise unknown(message)
        self._names[name] = ident

    def _release(self, ident: str) -> None:
        for name, holder in list(self._names.items()):
            if holder == ident:
                del self._names[name]

    # --- sandboxes ----------------------------------------------------------------------

    def run_pod_sandbox(self, config: api.PodSandboxConfig, runtime_handler: str) -> Sandbox:
        if runtime_handler not in self.handlers:
            raise unknown(f'failed to get sandbox runtime: no runtime for "{runtime_handler}" is configured')
        meta = config.metadata
        name = "_".join([meta.name, meta.namespace, meta.uid, str(meta.attempt)])
        sandbox_id = secrets.token_hex(32)
        self._reserve("sandbox", name, sandbox_id)
        copy = api.PodSandboxConfig()
        copy.CopyFrom(config)
        sandbox = Sandbox(sandbox_id, copy, runtime_handler, name, ip="")
        if not sandbox.host_network:
            sandbox.ip = next(self._ips)
        self.sandboxes[sandbox_id] = sandbox
        self._event(sandbox_id, api.CONTAINER_CREATED_EVENT, sandbox)
        self._event(sandbox_id, api.CONTAINER_STARTED_EVENT, sandbox)
        return sandbox

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        if self.flavour == "2.x" and self._find(self.sandboxes, sandbox_id) is None:
            return  # containerd 2.x: stopping what is not there succeeds (1.6: NotFound)
        sandbox = self.sandbox(sandbox_id)
        # containerd stops every container of the sandbox forcibly (timeout 0: SIGKILL).
        for container in [c for c in self.containers.values() if c.sandbox_id == sandbox.id]:
            await self.stop_container(container.id, 0)
        if sandbox.ready:
            sandbox.state = api.SANDBOX_NOTREADY
            self._event(sandbox.id, api.CONTAINER_STOPPED_EVENT, sandbox)

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        found = self._find(self.sandboxes, sandbox_id)
        if found is None:
            return  # containerd: "RemovePodSandbox called for sandbox that does not exist"
        sandbox: Sandbox = found
        await self.stop_pod_sandbox(sandbox.id)
        for container in [c for c in self.containers.values() if c.sandbox_id == sandbox.id]:
            try:
                await self.remove_container(container.id)
            except CriFailure as exc:
                raise unknown(f'failed to remove container "{container.id}": {exc.message}') from None
        del self.sandboxes[sandbox.id]
        self._release(sandbox.id)
        self._event(sandbox.id, api.CONTAINER_DELETED_EVENT, None)

    def sandbox_status(self, sandbox: Sandbox) -> api.PodSandboxStatus:
        status = api.PodSandboxStatus(
            id=sandbox.id, state=sandbox.state, created_at=sandbox.created_at, runtime_handler=sandbox.runtime_handler,  # type: ignore[arg-type]  # a proto enum is an int
            labels=dict(sandbox.config.labels), annotations=dict(sandbox.config.annotations))
        status.metadata.CopyFrom(sandbox.config.metadata)
        status.network.ip = sandbox.ip
        status.linux.namespaces.options.CopyFrom(sandbox.config.linux.security_context.namespace_options)
        return status

    def sandbox_info(self, sandbox: Sandbox) -> dict[str, str]:
        return {"info": json.dumps({"pid": 0, "runtimeHandler": sandbox.runtime_handler, "runtime": "memory",
                                    "config": {"metadata": {"uid": sandbox.uid}}})}

    def list_pod_sandbox(self, filter: api.PodSandboxFilter | None) -> list[Sandbox]:
        out = []
        for sandbox in self.sandboxes.values():
            if filter is not None:
                if filter.id and not sandbox.id.startswith(filter.id):
                    continue
                if filter.HasField("state") and sandbox.state != filter.state.state:
                    continue
                if any(sandbox.config.labels.get(k) != v for k, v in filter.label_selector.items()):
                    continue
            out.append(sandbox)
        return out

    # --- containers ---------------------------------------------------------------------

    def create_container(self, sandbox_id: str, config: api.ContainerConfig,
                         sandbox_config: api.PodSandboxConfig) -> Container:
        found = self._find(self.sandboxes, sandbox_id)
        if found is None:
            raise not_found(f'failed to find sandbox id "{sandbox_id}": not found')
        sandbox: Sandbox = found
        image = self.images.resolve(config.image.image)
        if image is None:
            raise not_found(f'failed to resolve image "{config.image.image}": not found')
        for mount in config.mounts:
            # containerd makes a missing bind-mount source a directory (WithMounts)
            if mount.host_path and not os.path.exists(mount.host_path):
                try:
                    os.makedirs(mount.host_path, mode=0o755, exist_ok=True)
                except OSError as exc:
                    raise unknown(f'failed to generate container spec: failed to mkdir "{mount.host_path}": '
                                  f"{exc.strerror}") from None
        smeta = sandbox_config.metadata if sandbox_config.HasField("metadata") else sandbox.config.metadata
        name = "_".join([config.metadata.name, smeta.name, smeta.namespace, smeta.uid, str(config.metadata.attempt)])
        container_id = secrets.token_hex(32)
        self._reserve("container", name, container_id)
        copy = api.ContainerConfig()
        copy.CopyFrom(config)
        log_dir = sandbox_config.log_directory or sandbox.config.log_directory
        log_path = os.path.join(log_dir, config.log_path) if log_dir and config.log_path else ""
        container = Container(container_id, sandbox.id, sandbox.uid, copy, image, name, log_path,
                              hostname=sandbox.config.hostname)
        container.resources.CopyFrom(config.linux.resources)
        self.containers[container_id] = container
        self._event(container_id, api.CONTAINER_CREATED_EVENT, sandbox)
        return container

    async def start_container(self, container_id: str, hold: Callable[[], Awaitable[None]] | None = None) -> None:
        container = self.container(container_id)
        if container.state != api.CONTAINER_CREATED:
            raise unknown(f'failed to set starting state for container "{container.id}": '
                          f"container is in {state_name(container.state)} state")
        if container.removing:
            raise unknown(f'failed to set starting state for container "{container.id}": '
                          "container is in removing state, can't be started")
        if container.starting:
            raise unknown(f'failed to set starting state for container "{container.id}": '
                          "container is already in starting state")
        container.starting = True
        try:
            if hold is not None:
                await hold()  # a delay injected "before": the start is in progress
            sandbox = self.sandboxes.get(container.sandbox_id)
            if sandbox is None or not sandbox.ready:
                raise unknown(f'sandbox container "{container.sandbox_id}" is not running')
            for mount in container.config.mounts:
                # made at CreateContainer; gone since (a volume torn down under it): runc fails
                if mount.host_path and not os.path.exists(mount.host_path):
                    raise unknown(
                        "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                        "runc create failed: unable to start container process: error during container init: "
                        f'error mounting "{mount.host_path}" to rootfs at "{mount.container_path}": '
                        f"stat {mount.host_path}: no such file or directory: unknown")
            self._launch(container, sandbox)
        except CriFailure as exc:
            self._start_failed(container, exc.message)
            raise
        except asyncio.CancelledError:
            # The caller went away mid-start: containerd's task creation fails with the
            # request's context, and the container is left exited with that error.
            self._start_failed(container, "failed to create containerd task: failed to start shim: "
                                          "start failed: context canceled: unknown")
            raise
        finally:
            container.starting = False

    def _start_failed(self, container: Container, message: str) -> None:
        if container.state == api.CONTAINER_CREATED:
            container.state = api.CONTAINER_EXITED
            container.finished_at = now_ns()
            container.exit_code = START_ERROR_CODE
            container.reason = START_ERROR_REASON
            container.message = message

    def _launch(self, container: Container, sandbox: Sandbox) -> None:
        assert self.task_group is not None, "the memory runtime is not running"
        config = container.config
        argv = default_argv(container.image.entrypoint, container.image.cmd, config.command, config.args)
        env: dict[str, str] = {}
        for entry in container.image.env:
            key, _, value = entry.partition("=")
            env[key] = value
        env["HOSTNAME"] = sandbox.config.hostname
        for kv in config.envs:
            env[kv.key] = kv.value
        log = CriLog(container.log_path)
        log.touch()
        # PID 1 of its own PID namespace only with pid=CONTAINER (the kubelet's default); in the
        # pod's namespace (shareProcessNamespace) the pause process is PID 1, on the host's none.
        own_pid_namespace = config.linux.security_context.namespace_options.pid == api.CONTAINER
        ctx = Context(env=env, files=ContainerFiles(container), output=log, pid1=own_pid_namespace,
                      sigterm=container.sigterm or self.sigterm)
        if not argv:
            argv = ["sh"]
        if config.stdin and os.path.basename(argv[0]) in ("sh", "bash", "ash", "cat"):
            argv = ["sleep", "infinity"]  # a shell reading an open stdin waits for it
        process = Process(argv, ctx)
        container.process = process
        container.state = api.CONTAINER_RUNNING
        container.started_at = now_ns()
        container.pid = next(self._pids)

        def exited(result: Exit) -> None:
            container.state = api.CONTAINER_EXITED
            container.finished_at = now_ns()
            container.exit_code = result.code
            container.reason = result.reason
            container.message = result.message
            container.pid = 0
            self._event(container.id, api.CONTAINER_STOPPED_EVENT, self.sandboxes.get(container.sandbox_id))

        self.task_group.start_soon(process.run, exited, name=f"memruntime:{container.id[:12]}")
        self._event(container.id, api.CONTAINER_STARTED_EVENT, sandbox)

    def stop_signal(self, container: Container) -> int:
        if container.config.stop_signal != api.RUNTIME_DEFAULT:
            return _SIGNAL_NUMBERS.get(container.config.stop_signal, 15)
        if container.image.stop_signal:
            return SIGNALS.get(container.image.stop_signal.upper().removeprefix("SIG"), 15)
        return SIGNALS["TERM"]

    async def stop_container(self, container_id: str, timeout: int) -> None:
        if self.flavour == "2.x" and self._find(self.containers, container_id) is None:
            return  # containerd 2.x: stopping what is not there succeeds (1.6: NotFound)
        container = self.container(container_id)
        process = container.process
        if not container.running or process is None:
            return  # containerd: "container is not running", no error
        if timeout > 0:
            process.signal(self.stop_signal(container))
            with anyio.move_on_after(timeout):
                await process.exited.wait()
        if not process.exited.is_set():
            process.signal(SIGNALS["KILL"])
            await process.exited.wait()

    async def remove_container(self, container_id: str) -> None:
        found = self._find(self.containers, container_id)
        if found is None:
            return  # containerd: "RemoveContainer called for container that does not exist"
        container: Container = found
        if container.running:
            await self.stop_container(container.id, 0)  # "Forcibly stopping container"
        if container.starting:
            raise unknown(f'failed to set removing state for container "{container.id}": '
                          "container is in starting state, can't be removed")
        if container.removing:
            raise unknown(f'failed to set removing state for container "{container.id}": '
                          "container is already in removing state")
        del self.containers[container.id]
        self._release(container.id)
        self._event(container.id, api.CONTAINER_DELETED_EVENT, self.sandboxes.get(container.sandbox_id))

    def list_containers(self, filter: api.ContainerFilter | None) -> list[Container]:
        out = []
        for container in self.containers.values():
            if filter is not None:
                if filter.id and not container.id.startswith(filter.id):
                    continue
                if filter.HasField("state") and container.state != filter.state.state:
                    continue
                if filter.pod_sandbox_id and not container.sandbox_id.startswith(filter.pod_sandbox_id):
                    continue
                if any(container.config.labels.get(k) != v for k, v in filter.label_selector.items()):
                    continue
            out.append(container)
        return out

    def container_summary(self, container: Container) -> api.Container:
        out = api.Container(id=container.id, pod_sandbox_id=container.sandbox_id, image_ref=container.image.id,
                            image_id=container.image.id, state=container.state, created_at=container.created_at,  # type: ignore[arg-type]  # a proto enum is an int
                            labels=dict(container.config.labels), annotations=dict(container.config.annotations))
        out.metadata.CopyFrom(container.config.metadata)
        out.image.CopyFrom(container.config.image)
        return out

    def container_status(self, container: Container) -> api.ContainerStatus:
        image = container.image
        spec = api.ImageSpec(image=image.repo_tags[0]) if image.repo_tags else container.config.image
        ref = image.repo_digests[0] if image.repo_digests else image.id
        status = api.ContainerStatus(
            id=container.id, state=container.state, created_at=container.created_at,  # type: ignore[arg-type]  # a proto enum is an int
            started_at=container.started_at, finished_at=container.finished_at, exit_code=container.exit_code,
            image_ref=ref, image_id=image.id, reason=container.reason, message=container.message,
            labels=dict(container.config.labels), annotations=dict(container.config.annotations),
            log_path=container.log_path, stop_signal=container.config.stop_signal)
        status.metadata.CopyFrom(container.config.metadata)
        status.image.CopyFrom(spec)
        status.mounts.extend(container.config.mounts)
        status.resources.linux.CopyFrom(container.resources)
        if image.uid is not None:
            status.user.linux.uid = image.uid
            status.user.linux.gid = image.uid
        return status

    def container_info(self, container: Container) -> dict[str, str]:
        return {"info": json.dumps({"pid": container.pid, "sandboxID": container.sandbox_id,
                                    "runtimeSpec": {"process": {"args": list(container.config.command)}}})}

    def update_container_resources(self, container_id: str, linux: api.LinuxContainerResources) -> None:
        container = self.container(container_id)
        if container.state not in (api.CONTAINER_RUNNING, api.CONTAINER_CREATED):
            raise unknown(f'failed to update resources: container "{container.id}" is in '
                          f"{state_name(container.state)} state")
        container.resources.CopyFrom(linux)

    def reopen_container_log(self, container_id: str) -> None:
        container = self.container(container_id)
        if not container.running:
            raise unknown("container is not running")

    async def exec_sync(self, container_id: str, cmd: Sequence[str], timeout: int) -> api.ExecSyncResponse:
        container = self.container(container_id)
        if not container.running:
            raise unknown(f"container is in {state_name(container.state)} state")
        if self.exec_handler is not None:
            answer = self.exec_handler(container, cmd)
            if answer is not None:
                return answer
        buffers: dict[str, list[str]] = {"stdout": [], "stderr": []}

        class Capture:
            def write(self, stream: str, text: str) -> None:
                buffers[stream].append(text)

        env = {"HOSTNAME": container.hostname, **{kv.key: kv.value for kv in container.config.envs}}
        ctx = Context(env=env, files=ContainerFiles(container), output=Capture(), pid1=False, exec_mode=True)
        code = 0
        with anyio.move_on_after(timeout if timeout > 0 else None) as scope:
            async with anyio.create_task_group() as tg:
                ctx.groups.append(tg)
                try:
                    code = await run_argv(list(cmd), ctx) if cmd else 0
                except ExitShell as exc:
                    code = exc.code
                finally:
                    tg.cancel_scope.cancel()
        if scope.cancelled_caught:
            raise CriFailure(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"failed to exec in container: timeout {timeout}s exceeded: context deadline exceeded")
        return api.ExecSyncResponse(stdout="".join(buffers["stdout"]).encode(),
                                    stderr="".join(buffers["stderr"]).encode(), exit_code=code)

    # --- what a test does to the "processes" ------------------------------------------------

    def exit(self, container_id: str, code: int = 0, reason: str = "", message: str = "") -> None:
        """Make the container's process exit now with ``code``."""
        container = self.container(container_id)
        if container.process is None or not container.running:
            raise ValueError(f"container {container_id} is not running")
        container.process.kill(code, reason, message)

    def oom_kill(self, container_id: str) -> None:
        self.exit(container_id, 137, OOM_REASON)

    def kill_sandbox(self, sandbox_id: str) -> None:
        """The sandbox dies (its pause process exits): every container in it is killed and the
        sandbox is NOTREADY, as after a node-level failure."""
        sandbox = self.sandbox(sandbox_id)
        for container in self.containers.values():
            if container.sandbox_id == sandbox.id and container.process is not None and container.running:
                container.process.kill(137)
        sandbox.state = api.SANDBOX_NOTREADY
        self._event(sandbox.id, api.CONTAINER_STOPPED_EVENT, sandbox)

    def objects_of(self, uid: str) -> tuple[list[Sandbox], list[Container]]:
        return ([s for s in self.sandboxes.values() if s.uid == uid],
                [c for c in self.containers.values() if c.pod_uid == uid])

    # --- images -------------------------------------------------------------------------

    def image_of(self, spec: api.ImageSpec) -> Image | None:
        return self.images.resolve(spec.image)

    def image_message(self, image: Image) -> api.Image:
        out = api.Image(id=image.id, repo_tags=image.repo_tags, repo_digests=image.repo_digests, size=image.size,
                        username=image.username, pinned=image.pinned)
        if image.uid is not None:
            out.uid.value = image.uid
        out.spec.image = image.id
        return out

    def images_in_use(self) -> Iterable[str]:
        return {c.image.id for c in self.containers.values()}


__all__ = ["CriFailure", "Flavour", "RuntimeState", "not_found", "unknown"]
