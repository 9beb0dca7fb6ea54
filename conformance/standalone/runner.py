"""Running ported cases against one in-process nodeagent, concurrently.

:func:`open_node` starts the agent (the composition root, as ``nodeagent run`` does) on a
containerd endpoint with its own static pod directory, root and log directories;
:func:`run_cases` runs every case in its own task, each bounded by its upstream timeout, so the
suite takes about as long as its slowest case. A case's pods are removed when it ends (its
namespace deletion, upstream) and waited for, so the runtime is left empty.

:func:`run_suite` is the whole run for the command line: a private containerd (devenv) unless an
endpoint is given, the agent, the cases, and the results.
"""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from conformance.standalone.framework import Case, Framework, Node, Outcome, Skipped
from cri import RuntimeClient
from nodeagent import labels as L
from nodeagent.agent import Agent
from nodeagent.config import AgentConfig

# Teardown of the agent's last pods at the end of a run (their cases already waited once).
FINAL_DRAIN_SECONDS = 90.0


@dataclass(frozen=True)
class CaseResult:
    case: Case
    outcome: Outcome
    seconds: float
    """Wall time of the test body (cleanup excluded, as upstream's It excludes namespace deletion)."""
    message: str = ""
    cleanup_seconds: float = 0.0

    @property
    def reason(self) -> str:
        """The first line of the failure (or skip) message."""
        return self.message.strip().splitlines()[0] if self.message.strip() else ""


def agent_config(workdir: Path, endpoint: str, node_name: str | None = None) -> AgentConfig:
    manifests = workdir / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    return AgentConfig(
        # Short: static pod names get "-<node>" appended and FQDN cases need room under 64 bytes.
        node_name=node_name or f"cfm-{uuid.uuid4().hex[:4]}",
        static_pod_path=manifests,
        container_runtime_endpoint=endpoint,
        root_dir=workdir / "root",
        pod_logs_dir=workdir / "pods-logs",
        container_logs_symlink_dir=workdir / "containers-logs",
        healthz_port=0,
        file_check_frequency=5.0,
        node_ip="127.0.0.1",
    )


@asynccontextmanager
async def open_node(endpoint: str, workdir: Path, node_name: str | None = None) -> AsyncIterator[Node]:
    """An agent running on ``endpoint`` for the duration of the block."""
    config = agent_config(workdir, endpoint, node_name)
    agent = Agent(config, verbose=False)
    async with RuntimeClient(endpoint) as client, anyio.create_task_group() as tg:
        await tg.start(agent.run)
        node = Node(agent, config, client)
        try:
            yield node
        finally:
            with anyio.CancelScope(shield=True):
                await _drain(node)
            tg.cancel_scope.cancel()


async def _drain(node: Node) -> None:
    """Remove any manifest left and wait (bounded) until the runtime holds nothing of the node."""
    for path in node.manifests.iterdir():
        path.unlink(missing_ok=True)
    with anyio.move_on_after(FINAL_DRAIN_SECONDS):
        while True:
            sandboxes = [s for s in await node.client.list_pod_sandbox() if s.labels.get(L.MANAGED_BY) == node.name]
            if not sandboxes and not node.agent.status.all():
                return
            await anyio.sleep(0.5)


async def run_case(node: Node, case: Case) -> CaseResult:
    """One case: its body under its upstream timeout, then its cleanup (shielded)."""
    f = Framework(node, case)
    begin = time.monotonic()
    outcome: Outcome = "pass"
    message = ""
    try:
        with anyio.fail_after(case.timeout):
            await case.run(f)
    except Skipped as exc:
        outcome, message = "skip", str(exc)
    except TimeoutError:
        outcome = "fail"
        message = f"timed out after {case.timeout:g}s (the upstream bound); last step: " + (
            f.steps[-1] if f.steps else "-")
    except AssertionError as exc:
        outcome, message = "fail", str(exc) or "assertion failed"
    except Exception as exc:  # noqa: BLE001 — a bug in the case or in the agent's answers: a failure, with its trace
        outcome = "fail"
        message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    seconds = time.monotonic() - begin
    with anyio.CancelScope(shield=True):
        cleanup_begin = time.monotonic()
        stuck = await f.cleanup()
        cleanup_seconds = time.monotonic() - cleanup_begin
    if stuck and outcome == "pass":
        outcome = "fail"
        message = (f"cleanup: pod(s) {', '.join(stuck)} still known to the agent after their grace period "
                   f"+ 60 s (namespace deletion would have failed)")
    return CaseResult(case, outcome, seconds, message, cleanup_seconds)


async def run_cases(node: Node, cases: Sequence[Case], *, parallel: int | None = None,
                    on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Run ``cases`` concurrently (at most ``parallel`` at a time if given); results in case order."""
    results: dict[str, CaseResult] = {}
    limit = anyio.Semaphore(parallel) if parallel else None

    async def one(case: Case) -> None:
        if limit is not None:
            async with limit:
                result = await run_case(node, case)
        else:
            result = await run_case(node, case)
        results[case.name] = result
        if on_result is not None:
            on_result(result)

    async with anyio.create_task_group() as tg:
        for case in cases:
            tg.start_soon(one, case, name=f"case:{case.key}")
    return [results[c.name] for c in cases]


@dataclass
class SuiteRun:
    results: list[CaseResult]
    wall_seconds: float
    workdir: Path
    endpoint: str


def run_suite(cases: Sequence[Case], workdir: Path, *, endpoint: str | None = None,
              parallel: int | None = None, on_result: Callable[[CaseResult], None] | None = None) -> SuiteRun:
    """The command line's run: a private containerd under ``workdir`` unless ``endpoint`` names
    one (its images must include busybox and pause, as devenv's do), one agent, the cases.
    ``workdir`` must be short (containerd's socket path stays under 108 bytes)."""
    containerd = None
    if endpoint is None:
        from devenv import Containerd, build_images, ensure_packages

        ensure_packages()
        archives = build_images()
        containerd = Containerd(workdir / "ctd")
        containerd.start()
        containerd.import_images(archives)
        containerd.wait_image_stats()
        endpoint = containerd.endpoint

    async def main() -> list[CaseResult]:
        assert endpoint is not None
        async with open_node(endpoint, workdir / "agent") as node:
            return await run_cases(node, cases, parallel=parallel, on_result=on_result)

    begin = time.monotonic()
    try:
        results = anyio.run(main)
    finally:
        if containerd is not None:
            containerd.stop()
    return SuiteRun(results, time.monotonic() - begin, workdir, endpoint)


__all__ = ["CaseResult", "SuiteRun", "agent_config", "open_node", "run_case", "run_cases", "run_suite"]
