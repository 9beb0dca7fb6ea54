"""An in-memory CRI runtime: a faithful fake of containerd's CRI for tests that need no root.

:class:`MemoryRuntime` serves our generated ``runtime.v1`` RuntimeService and ImageService over
grpc.aio on a unix socket, so the agent's real :class:`cri.RuntimeClient` — its conversions,
deadlines, retries and error mapping — talks to it exactly as it talks to containerd::

    async with MemoryRuntime(tmp).serving() as rt:
        client = RuntimeClient(rt.endpoint)
        ...
        rt.exit(container_id, 3)                                # the container exits with 3 now
        rt.faults.fail("RunPodSandbox", grpc.StatusCode.UNAVAILABLE)   # the next call fails
        rt.faults.delay("StopContainer", 0.5)                   # every StopContainer is slow
        rt.calls("CreateContainer", pod=uid)                     # what the agent asked

What is faithful to containerd (1.6/1.7/2.x CRI, pkg/cri/server), because the agent depends on it:

* **which containerd**: 2.x by default (the runtime nodeagent targets), 1.6 with ``flavour="1.6"``,
  where they differ: StopPodSandbox and StopContainer of an unknown id succeed on 2.x (NotFound
  on 1.6); a name already reserved is FailedPrecondition on 2.x (Unknown on 1.6); 2.x adds the
  ``ContainerdHasNoDeprecationWarnings`` condition; 1.6 answers RuntimeConfig and
  GetContainerEvents Unimplemented.
* **ids** are 64 hex digits, found by unique prefix as well; timestamps are nanoseconds.
* **sandboxes**: RunPodSandbox reserves the name ``<name>_<namespace>_<uid>_<attempt>`` (a second
  sandbox with the same metadata fails: "failed to reserve sandbox name ..."); READY → NOTREADY on
  StopPodSandbox, which kills (SIGKILL) every container of the sandbox; RemovePodSandbox
  force-stops the sandbox and removes its containers; an unknown runtime handler fails; each
  sandbox not in the host network gets a pod IP (10.88.0.0/16); labels, annotations and metadata
  are echoed. Unknown ids: PodSandboxStatus answers NotFound, RemovePodSandbox succeeds.
* **containers**: CREATED → RUNNING → EXITED; the name ``<container>_<pod>_<ns>_<uid>_<attempt>``
  is reserved until removal; CreateContainer needs the sandbox and a local image (NotFound
  otherwise); StartContainer only from CREATED, in a READY sandbox, with every mount source
  present — any failure leaves the container EXITED with exit code 128 and reason
  ``StartError``, and a caller cancelled during the start leaves it so with "context canceled";
  StopContainer sends the stop signal (the config's, else the image's STOPSIGNAL, else SIGTERM),
  waits ``timeout`` seconds, then SIGKILLs; a stopped container is no error; RemoveContainer of a
  running container force-stops it first (containerd since 1.5; "is in starting state, can't be
  removed" during a start); unknown ids: ContainerStatus and StartContainer answer NotFound,
  RemoveContainer succeeds. Exit code 0 is ``Completed``, others ``Error``, an OOM kill
  ``OOMKilled`` (137). ContainerStatus reports the image's first tag and repo digest, the full log
  path (the sandbox's log directory + the container's log_path) and the mounts.
* **processes** are simulated from the command (:mod:`conformance.memruntime.process`), with the
  PID 1 signal rule (``sleep 3600`` ignores SIGTERM; a trap is honoured); output goes to the CRI
  log file at the container's log path in the CRI format (``<time> stdout F <line>``).
* **lists** filter by id (prefix), state, pod sandbox id and label selector (all must match).
* **images**: names normalised as docker references; PullImage of an unknown name fails NotFound
  with containerd's words, an image needing credentials fails without them; ImageStatus of an
  absent image answers no image (not an error); RemoveImage removes every tag of the image and
  an absent image is no error; ImageFsInfo reports the images' bytes.
* **Version** (``runtime_api_version`` v1), **Status** (RuntimeReady, NetworkReady),
  **RuntimeConfig** (cgroupfs; or Unimplemented as containerd 1.6), **GetContainerEvents** (every
  transition of sandboxes and containers, with the sandbox status and its containers'),
  **ExecSync** (the same interpreter, in the container's files and env; a timeout is
  DeadlineExceeded; a non-running container fails), **ReopenContainerLog** (fails unless running).

What is simplified:

* no real processes, namespaces, cgroups, networking or filesystems: a container's files are its
  mounts (read from the host) plus an in-memory layer; DNS, ports and hostPorts are not served;
  sysctls, security contexts, resources, devices and CDI devices are stored, not applied;
* Exec, Attach and PortForward answer Unimplemented (no streaming server);
* stats are zeros except memory, which a test sets (:meth:`MemoryRuntime.set_memory`);
* a rotated log is continued in the new file at once (containerd waits for ReopenContainerLog);
* the event stream drops events for a subscriber that does not keep up (containerd's does too,
  by a different rule); state lives in memory only: a restart of the gRPC server
  (:meth:`MemoryRuntime.restart`) keeps it, as containerd's shims keep containers running, but a
  new MemoryRuntime starts empty.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import grpc

from conformance.memruntime.faults import Call, Fault, Faults
from conformance.memruntime.images import Image, make_image, normalise, preloaded
from conformance.memruntime.objects import Container, Sandbox
from conformance.memruntime.process import SigtermMode
from conformance.memruntime.runtime import CriFailure, Flavour, RuntimeState
from conformance.memruntime.service import ImageService, RuntimeService, _Calls
from cri._generated import api_pb2_grpc as api_grpc


def _default_images() -> list[Image]:
    from devenv.images import BUSYBOX_NAMES, PAUSE_NAMES

    return preloaded(BUSYBOX_NAMES, PAUSE_NAMES)


class MemoryRuntime:
    """One runtime: its state, its faults, and (while :meth:`serving`) its gRPC server."""

    def __init__(self, root: Path | None = None, *, runtime_name: str = "memory", runtime_version: str = "1.0.0",
                 sigterm: SigtermMode = "pid1", images: Iterable[Image] | None = None,
                 runtime_config: bool = True, handlers: Iterable[str] = ("runc",), flavour: Flavour = "2.x") -> None:
        """``images`` are present at start and pullable (default: devenv's busybox and pause
        names, as the test containerd has them); ``sigterm`` is how processes take SIGTERM
        (``pid1``: as PID 1 of a container; see conformance.memruntime.process)."""
        self._own_root = root is None
        # A unix socket path must stay under 108 bytes: a short directory of our own.
        self.root = Path(tempfile.mkdtemp(prefix="memcri-", dir="/tmp")) if root is None else root
        self.state = RuntimeState(self.root, sigterm=sigterm, handlers=tuple(handlers), flavour=flavour)
        self.faults = Faults()
        self.socket = self.root / "cri.sock"
        for image in (list(images) if images is not None else _default_images()):
            self.state.images.add(image)
            self.state.images.publish(image)
        calls = _Calls(self.state, self.faults)
        self.runtime_service = RuntimeService(calls, name=runtime_name, version=runtime_version,
                                              runtime_config=runtime_config)
        self.image_service = ImageService(calls)
        self._server: grpc.aio.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    # --- running ---------------------------------------------------------------------------

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[MemoryRuntime]:
        """Serve on :attr:`socket` until the block ends; then stop every simulated process."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            async with anyio.create_task_group() as tg:
                self.state.task_group = tg
                await self._start_server()
                try:
                    yield self
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._stop_server()
                    tg.cancel_scope.cancel()
        finally:
            self.state.task_group = None
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)

    async def _start_server(self) -> None:
        server = grpc.aio.server()
        api_grpc.add_RuntimeServiceServicer_to_server(self.runtime_service, server)  # type: ignore[no-untyped-call]
        api_grpc.add_ImageServiceServicer_to_server(self.image_service, server)  # type: ignore[no-untyped-call]
        self.socket.unlink(missing_ok=True)
        server.add_insecure_port(f"unix:{self.socket}")
        await server.start()
        self._server = server

    async def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
        self.socket.unlink(missing_ok=True)

    async def restart(self, down_seconds: float = 0.0) -> None:
        """Stop answering (callers see Unavailable) for ``down_seconds``, then serve again with
        the same state — containerd restarted while its shims keep the containers running."""
        await self._stop_server()
        await anyio.sleep(down_seconds)
        await self._start_server()

    # --- what a test does to it -------------------------------------------------------------

    def calls(self, method: str | None = None, pod: str | None = None) -> list[Call]:
        """The calls served, in order (``pod``: those concerning one pod UID)."""
        return self.faults.calls(method, pod)

    def exit(self, container_id: str, code: int = 0, reason: str = "", message: str = "") -> None:
        """The container's process exits now with ``code`` (reason: Completed/Error unless given)."""
        self.state.exit(container_id, code, reason, message)

    def oom_kill(self, container_id: str) -> None:
        self.state.oom_kill(container_id)

    def kill_sandbox(self, sandbox_id: str) -> None:
        """The sandbox dies: its containers are killed and it is NOTREADY."""
        self.state.kill_sandbox(sandbox_id)

    def set_sigterm(self, container_id: str, mode: SigtermMode) -> None:
        container = self.state.container(container_id)
        container.sigterm = mode
        if container.process is not None:
            container.process.ctx.sigterm = mode

    def set_memory(self, container_id: str, used_bytes: int) -> None:
        self.state.container(container_id).memory_bytes = used_bytes

    def add_image(self, *names: str, credentials: tuple[str, str] | None = None, present: bool = False,
                  **config: object) -> Image:
        """Make an image pullable under ``names`` (with ``credentials`` only, if given), and
        present at once when ``present``."""
        image = make_image(names, **config)
        self.state.images.publish(image, credentials)
        if present:
            self.state.images.add(image)
        return image

    def sandboxes(self, uid: str | None = None) -> list[Sandbox]:
        return [s for s in self.state.sandboxes.values() if uid is None or s.uid == uid]

    def containers(self, uid: str | None = None) -> list[Container]:
        return [c for c in self.state.containers.values() if uid is None or c.pod_uid == uid]


__all__ = ["Call", "Container", "CriFailure", "Fault", "Faults", "Flavour", "Image", "MemoryRuntime", "Sandbox",
           "SigtermMode", "make_image", "normalise"]
