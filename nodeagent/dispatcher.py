"""The dispatcher: routes wanted-pod facts to one worker per pod UID and owns the workers.

It is the bus subscriber that turns ``PodSpecObserved`` / ``PodDeletionRequested`` /
``OrphanFound`` into calls on the pod's worker mailbox. Those calls never block, so the
dispatcher never slows the bus down.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import structlog
from anyio.abc import TaskGroup
from pydantic import ValidationError

from nodeagent import events as ev
from nodeagent.backoff import Backoff
from nodeagent.model import Pod
from nodeagent.supervisor import failing_stray_cancellations, restart_backoff
from nodeagent.worker import PodWorker, Services

WORKER_TASK = "pod-worker"
"""The supervisor's name for a pod worker that failed (one metric label for all pods)."""

log = structlog.get_logger("nodeagent.dispatcher")


class Dispatcher:
    def __init__(self, services: Services, task_group: TaskGroup,
                 contain: Callable[[str, Exception], None] | None = None) -> None:
        self._services = services
        self._tg = task_group
        self._contain = contain or (lambda task, exc: log.error("task failed", task=task, error=repr(exc)))
        self.workers: dict[str, PodWorker] = {}
        self._respawns: dict[str, Backoff] = {}

    async def handle(self, event: ev.Event) -> None:
        """One fact of the dispatcher's inbox (nodeagent.bus.consume feeds them)."""
        if isinstance(event, ev.PodSpecObserved):
            await self._observed(event)
        elif isinstance(event, ev.PodDeletionRequested):
            worker = self.workers.get(event.pod.uid)
            if worker is not None:
                worker.kill(event.grace_period_seconds, event.id)
        elif isinstance(event, ev.OrphanFound):
            self._orphan(event)

    async def _observed(self, event: ev.PodSpecObserved) -> None:
        try:
            pod = Pod.model_validate(event.pod_spec)
        except ValidationError as exc:  # sources validate first; this is the last line of defence
            # Where and what, never the input: a spec's values may be secrets (env values).
            problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_input=False)]
            log.error("invalid pod spec", pod=str(event.pod), errors=problems)
            return
        worker = self.workers.get(pod.uid)
        if worker is not None:
            worker.update(pod, event.id)
            return
        predecessor = next(
            (w for w in self.workers.values() if w.pod.full_name == pod.full_name and not w.done.is_set()),
            None,
        )
        self._spawn(PodWorker(event.pod, pod, self._services, event.id, predecessor))

    def _orphan(self, event: ev.OrphanFound) -> None:
        if event.pod.uid in self.workers:
            return
        # The runtime runs a pod nobody wants: rebuild a minimal pod from its labels so that the
        # stages' teardown (which works from what the runtime shows) can run.
        pod = Pod.model_validate(
            {
                "metadata": {"name": event.pod.name, "namespace": event.pod.namespace, "uid": event.pod.uid},
                "spec": {"containers": [{"name": "orphan", "image": "orphan"}], "terminationGracePeriodSeconds": 2},
            }
        )
        worker = PodWorker(event.pod, pod, self._services, event.id)
        worker.orphan = True
        worker.kill(None, event.id)
        self._spawn(worker)

    def _spawn(self, worker: PodWorker) -> None:
        self.workers[worker.ref.uid] = worker

        async def run_and_forget() -> None:
            try:
                with failing_stray_cancellations():  # would silently cancel every other pod's worker
                    await worker.run()
            except Exception as exc:  # noqa: BLE001 - a worker bug must not stop the agent
                self._contain(WORKER_TASK, exc)
                await self._respawn(worker)
            else:
                self._respawns.pop(worker.ref.uid, None)
            finally:
                if self.workers.get(worker.ref.uid) is worker:
                    del self.workers[worker.ref.uid]

        self._tg.start_soon(run_and_forget, name=f"pod:{worker.ref}")

    async def _respawn(self, failed: PodWorker) -> None:
        """A worker that raised left its pod in a state nobody knows: a new worker takes the pod
        over as after an agent restart (every stage adopts what the runtime already has), with
        what the old one's mailbox holds — a pending kill stays sticky. Back-off per pod, so a
        pod that crashes its worker every time does not spin."""
        backoff = self._respawns.setdefault(failed.ref.uid, restart_backoff())
        await self._services.clock.sleep(backoff.next())
        if self.workers.get(failed.ref.uid) is not failed:
            return  # replaced meanwhile (a new spec made a new worker)
        pod = failed.pending or failed.pod
        worker = PodWorker(failed.ref, pod, self._services, failed.cause)
        if failed.kill_requested:
            worker.kill(failed.kill_grace, failed.cause, forget=failed.forget_requested)
        elif failed.eviction is not None:
            # Failed by the node: it must not run again; the status keeps the failure.
            worker.kill(failed.eviction.grace_seconds, failed.cause, forget=False)
        log.warning("pod worker restarted after a failure", pod=str(failed.ref), uid=failed.ref.uid)
        self._spawn(worker)

    async def wait_idle(self) -> None:
        """For tests: until every worker has finished."""
        while self.workers:
            await anyio.sleep(0.05)
