"""What the contract sees of a running agent: every phase call of every stage, the runtime calls
each made, and the places where a test makes a kill arrive.

The agent under test is the real one: its worker, admission cycle and registry call the stages.
:class:`Recorder` only wraps each stage's phase methods *on the instance* after the registry
validated and ordered them, so that every call is recorded with its pod, its answer or exception,
and whether it was cancelled; it can run the plugin's undo phases twice (the idempotence
promise) and hold a phase at its entry until the pod's kill cancels it. :class:`TracingRuntime`
is the runtime client the stages get (the relister keeps the agent's own): it attributes each
CRI call to the stage and phase that made it — through a context variable the phase wrapper
sets — and holds the n-th one at a :data:`CancelPoint` until the kill arrives.
"""

from __future__ import annotations

import contextvars
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import grpc

from cri import RuntimeClient
from cri.errors import DeadlineExceeded
from nodeagent.additions import ALL_CONTAINERS, ContainerAdditions, PodAdditions
from nodeagent.registry import Pipeline
from nodeagent.stages import Phase, Result, Stage, Verdict, phases_of

CancelPoint = Literal["as-it-begins", "in-flight", "answer-lost"]
"""Where in a runtime call the kill arrives:

- ``as-it-begins``: before the request leaves the client (the runtime never sees it);
- ``in-flight``: while the runtime handles it (the memory runtime holds the call before acting,
  so the cancellation reaches the runtime and nothing is done; on containerd the call and the kill
  race);
- ``answer-lost``: the runtime did the work and answered, but the stage never sees the answer
  (what a client-side timeout does to a sandbox the runtime did create).
"""
CANCEL_POINTS: tuple[CancelPoint, ...] = ("as-it-begins", "in-flight", "answer-lost")

SETUP_PHASES: tuple[Phase, ...] = (Phase.ADMIT, Phase.RESERVE, Phase.PREPARE, Phase.PERMIT, Phase.START)
UNDO_PHASES: tuple[Phase, ...] = (Phase.STOP, Phase.UNPREPARE, Phase.CLEANUP, Phase.UNRESERVE)
MUTATIONS = frozenset({"run_pod_sandbox", "stop_pod_sandbox", "remove_pod_sandbox", "create_container",
                       "start_container", "stop_container", "remove_container", "update_container_resources",
                       "update_pod_sandbox_resources"})
"""Runtime calls that change a pod's sandboxes or containers."""

HOLD_LIMIT_SECONDS = 30.0
"""A held call or phase that no kill cancels within this is a failure (the kill did not reach it)."""
SHIELDED_CALLS = frozenset({"start_container"})
"""Calls the agent never abandons half-way (plugins/runtime/sync.py: a start cancelled on our side
still completes in containerd): a kill cannot cancel them, so their holds are bounded instead."""
ANSWER_LOST_AFTER_SECONDS = 2.0
"""How long a shielded call is held: it then goes out (as-it-begins) or its answer is lost and
the caller gets DeadlineExceeded, as from the client's deadline (answer-lost)."""


@dataclass(frozen=True)
class Caller:
    uid: str
    stage: str
    phase: Phase


CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("contract_caller", default=None)


@dataclass
class PhaseCall:
    """One call of one stage's phase method, as the worker (or admission cycle) made it."""

    stage: str
    phase: Phase
    uid: str
    repeat: int = 0
    """0: the worker's call; 1: the recorder's second run of an undo phase."""
    result: object = None
    error: BaseException | None = None
    cancelled: bool = False
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self.result.verdict if isinstance(self.result, Result) else None

    def describe(self) -> str:
        what = ("cancelled" if self.cancelled else f"raised {self.error!r}" if self.error is not None
                else repr(self.result))
        again = " (second run)" if self.repeat else ""
        return f"{self.stage}.{self.phase.value}(){again} for pod {self.uid[:8]}: {what}"


@dataclass
class CriCall:
    uid: str
    stage: str
    phase: Phase
    method: str
    index: int
    """Its place among the pod's attributed runtime calls (0-based)."""
    cancelled: bool = False


@dataclass
class Hold:
    """Make a pod's kill arrive at one place of its setup; ``reached`` is set when it does."""

    uid: str
    point: CancelPoint | Literal["phase-entry"]
    select: Callable[[CriCall | PhaseCall], bool]
    ordinal: int
    reached: anyio.Event = field(default_factory=anyio.Event)
    seen: int = 0
    where: str = ""
    """What was held, for messages (``runtime.prepare: run_pod_sandbox``)."""


def _uid_of(args: tuple[Any, ...]) -> str:
    first = args[0] if args else None
    ref = getattr(first, "ref", None)
    if ref is not None:
        return str(ref.uid)
    return str(getattr(first, "uid", ""))


def _additions_of(ctx: object) -> dict[str, list[str]] | None:
    """What the pod's stages still add to its containers, from a stage's context (the
    worker's PodAdditions behind ``ctx.additions``); None when the context has none."""
    worker = getattr(ctx, "_worker", None)
    pod_additions = getattr(worker, "additions", None)
    pod = getattr(ctx, "pod", None)
    if not isinstance(pod_additions, PodAdditions) or pod is None:
        return None
    names = [ALL_CONTAINERS, *(c.name for c in pod.all_containers())]
    entries = {f"{stage}/{name}": entry for stage in pod_additions.stages() for name in names
               if (entry := pod_additions.get(stage, name)) is not None}
    return {key: additions_left({key: entry}).get(key) or ["an entry (empty) not withdrawn"]
            for key, entry in entries.items()}


def additions_left(table: dict[str, ContainerAdditions]) -> dict[str, list[str]]:
    """Entry (``stage/container``) → what is still contributed (empty entries left out)."""
    out: dict[str, list[str]] = {}
    for container, entry in table.items():
        parts = []
        if entry.mounts:
            parts.append(f"mounts {[m.container_path for m in entry.mounts]}")
        if getattr(entry, "binds", None):
            parts.append(f"binds {[b.container_path for b in entry.binds]}")
        if entry.devices:
            parts.append(f"devices {[d.container_path for d in entry.devices]}")
        if entry.cdi_devices:
            parts.append(f"CDI devices {[d.name for d in entry.cdi_devices]}")
        if entry.envs:
            parts.append(f"env {sorted(entry.envs)}")
        if entry.annotations:
            parts.append(f"annotations {sorted(entry.annotations)}")
        if entry.api_env is not None:
            parts.append("API env")
        if parts:
            out[container] = parts
    return out


class Recorder:
    """Shared by every agent a harness runs (an agent restart keeps the record)."""

    def __init__(self, plugin: str, *, undo_twice: bool = True) -> None:
        self.plugin = plugin
        self.undo_twice = undo_twice
        self.phases: list[PhaseCall] = []
        self.cri: list[CriCall] = []
        self.holds: list[Hold] = []
        self.additions: dict[str, dict[str, list[str]]] = {}
        """Pod UID → the container additions left after its last unprepare call."""
        self.pipeline: Pipeline | None = None

    # --- installing ------------------------------------------------------------------------

    def install(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        for stage in pipeline.stages.values():
            for phase in phases_of(stage):
                if phase is Phase.NODE:
                    continue  # a node-wide task (run), not a call per pod
                method = getattr(stage, phase.value)
                setattr(stage, phase.value, self._wrap(stage, phase, method))

    def _wrap(self, stage: Stage, phase: Phase, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        twice = phase in UNDO_PHASES and stage.name == self.plugin and self.undo_twice

        async def call(*args: Any) -> Any:
            uid = _uid_of(args)
            result = await self._call(stage.name, phase, uid, method, args, 0)
            if twice:
                # The second run sees what the first left: it must succeed and change nothing.
                await self._call(stage.name, phase, uid, method, args, 1)
            return result

        call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
        return call

    async def _call(self, stage: str, phase: Phase, uid: str, method: Callable[..., Awaitable[Any]],
                    args: tuple[Any, ...], repeat: int) -> Any:
        record = PhaseCall(stage, phase, uid, repeat)
        self.phases.append(record)
        token = CALLER.set(Caller(uid, stage, phase))
        try:
            if repeat == 0 and phase in SETUP_PHASES:
                await self._hold_phase(record)
            record.result = await method(*args)
            return record.result
        except anyio.get_cancelled_exc_class():
            record.cancelled = True
            raise
        except BaseException as exc:
            record.error = exc
            raise
        finally:
            record.ended = time.monotonic()
            CALLER.reset(token)
            if phase is Phase.UNPREPARE and args:
                left = _additions_of(args[0])
                if left is not None:
                    self.additions[uid] = left

    async def _hold_phase(self, record: PhaseCall) -> None:
        for hold in self.holds:
            if hold.uid != record.uid or hold.point != "phase-entry" or not hold.select(record):
                continue
            hold.seen += 1
            if hold.seen - 1 == hold.ordinal:
                hold.where = f"{record.stage}.{record.phase.value}()"
                hold.reached.set()
                await _until_killed(hold.where)

    # --- holds -------------------------------------------------------------------------------

    def hold(self, uid: str, point: CancelPoint | Literal["phase-entry"], ordinal: int,
             select: Callable[[Any], bool] = lambda _: True) -> Hold:
        """Hold pod ``uid``'s ``ordinal``-th selected runtime call (or phase call) at ``point``."""
        hold = Hold(uid, point, select, ordinal)
        self.holds.append(hold)
        return hold

    # --- reading -------------------------------------------------------------------------------

    def of(self, uid: str) -> list[PhaseCall]:
        return [p for p in self.phases if p.uid == uid]

    def cri_of(self, uid: str) -> list[CriCall]:
        return [c for c in self.cri if c.uid == uid]


async def _until_killed(where: str) -> None:
    with anyio.fail_after(HOLD_LIMIT_SECONDS):
        await anyio.sleep_forever()
    raise AssertionError(f"{where} was held for the pod's kill, which never cancelled it")  # pragma: no cover


class TracingRuntime:
    """The runtime client stages get: the agent's, with every call attributed and holdable."""

    def __init__(self, inner: RuntimeClient, recorder: Recorder,
                 in_flight: Callable[[str, str], anyio.Event | None] | None = None) -> None:
        self._inner = inner
        self._recorder = recorder
        self._in_flight = in_flight
        """(gRPC method, pod UID) → an event the runtime sets once it holds that call, or None
        when the runtime cannot hold calls (then the kill races the call)."""
        self.calls: list[tuple[Caller | None, str]] = []
        """Every call, attributed or not, in order."""

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr) and not inspect.isasyncgenfunction(attr):
            return attr
        if inspect.isasyncgenfunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            caller = CALLER.get()
            self.calls.append((caller, name))
            if caller is None or caller.phase not in SETUP_PHASES:
                return await attr(*args, **kwargs)
            record = CriCall(caller.uid, caller.stage, caller.phase, name,
                             index=len(self._recorder.cri_of(caller.uid)))
            self._recorder.cri.append(record)
            hold = self._hold_for(record)
            if hold is None:
                return await attr(*args, **kwargs)
            hold.where = f"{caller.stage}.{caller.phase.value}(): {name}"
            try:
                return await self._held(hold, attr, args, kwargs)
            except anyio.get_cancelled_exc_class():
                record.cancelled = True
                raise

        return call

    def _hold_for(self, record: CriCall) -> Hold | None:
        for hold in self._recorder.holds:
            if hold.uid != record.uid or hold.point == "phase-entry" or not hold.select(record):
                continue
            hold.seen += 1
            if hold.seen - 1 == hold.ordinal:
                return hold
        return None

    async def _held(self, hold: Hold, attr: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        shielded = attr.__name__ in SHIELDED_CALLS
        if hold.point == "as-it-begins":
            hold.reached.set()
            if not shielded:
                await _until_killed(hold.where)
            # The kill cannot reach a shielded call: after a while it goes out as any call does.
            await anyio.sleep(ANSWER_LOST_AFTER_SECONDS)
            return await attr(*args, **kwargs)
        if hold.point == "answer-lost":
            with anyio.CancelScope(shield=True):
                result = await attr(*args, **kwargs)
            hold.reached.set()
            if not shielded:
                await _until_killed(hold.where)
                return result  # pragma: no cover - the kill cancels the wait
            # A shielded caller waits for the answer; a lost one reaches it as the client's deadline.
            await anyio.sleep(ANSWER_LOST_AFTER_SECONDS)
            raise DeadlineExceeded(grpc_method(attr.__name__), getattr(self._inner, "endpoint", ""),
                                   grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "the answer was lost (the contract suite's answer-lost hold)")
        held = self._in_flight(grpc_method(attr.__name__), hold.uid) if self._in_flight else None
        if held is None:
            hold.reached.set()
            return await attr(*args, **kwargs)

        async with anyio.create_task_group() as tg:
            async def announce() -> None:
                await held.wait()
                hold.reached.set()

            tg.start_soon(announce)
            try:
                return await attr(*args, **kwargs)
            finally:
                tg.cancel_scope.cancel()


def grpc_method(name: str) -> str:
    special = {"pod_sandbox_status": "PodSandboxStatus", "exec_sync": "ExecSync", "image_fs_info": "ImageFsInfo"}
    return special.get(name, "".join(part.capitalize() for part in name.split("_")))


__all__ = ["CALLER", "CANCEL_POINTS", "MUTATIONS", "SETUP_PHASES", "UNDO_PHASES", "CancelPoint", "Caller",
           "CriCall", "Hold", "PhaseCall", "Recorder", "TracingRuntime", "additions_left", "grpc_method"]
