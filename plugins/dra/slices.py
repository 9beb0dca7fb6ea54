"""The kubelet's ResourceSlice housekeeping for its node (cluster mode).

Drivers publish ResourceSlices; the scheduler allocates from them. A driver that died without
cleaning up would leave devices behind that the scheduler keeps handing out, and pods that can
never be prepared. So, as the kubelet's DRA plugin manager does:

* when the agent starts, every ResourceSlice of the node is deleted: whatever was published
  before may be stale, and live drivers publish again (the kubeletplugin helper recreates a
  slice it sees deleted; ours checks every few seconds);
* when a driver is deregistered and has no other registration, its slices of the node are
  deleted ``delay`` seconds later (the kubelet's 30 s), unless it registers again before.

The node's credentials allow exactly this: list and watch with a ``spec.nodeName`` field
selector (a view of the object store) and delete of the node's own slices. Failures are retried
with back-off (1 s doubling to 5 min, as the kubelet) and never stop anything else.
"""

from __future__ import annotations

from typing import Any

import anyio
import structlog

from nodeagent.objects import ObjectError, View, kinds

log = structlog.get_logger("nodeagent.dra")

WIPE_DELAY_SECONDS = 30.0
RETRY_INITIAL_SECONDS = 1.0
RETRY_MAX_SECONDS = 300.0


class SliceWiper:
    def __init__(self, objects: Any, node: str, delay: float = WIPE_DELAY_SECONDS) -> None:
        self.objects = objects
        self.node = node
        self._view: View | None = None
        self.delay = delay
        self._tg: anyio.abc.TaskGroup | None = None
        self._pending: dict[str, anyio.CancelScope] = {}
        """Driver → the scope of its scheduled wipe (cancelled when it registers again)."""

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._wipe, None, 0.0, anyio.CancelScope())
            task_status.started()
            await anyio.sleep_forever()

    def registered(self, driver: str) -> None:
        scope = self._pending.pop(driver, None)
        if scope is not None:
            log.info("DRA driver back before its ResourceSlices were wiped", driver=driver)
            scope.cancel()

    def deregistered(self, driver: str) -> None:
        if self._tg is None or driver in self._pending:
            return
        scope = self._pending[driver] = anyio.CancelScope()
        self._tg.start_soon(self._wipe, driver, self.delay, scope)

    async def _wipe(self, driver: str | None, delay: float, scope: anyio.CancelScope) -> None:
        with scope:
            await anyio.sleep(delay)
            retry = RETRY_INITIAL_SECONDS
            while True:
                try:
                    names = await self._delete(driver)
                    if names:
                        log.info("ResourceSlices wiped", node=self.node, driver=driver or "(all)", slices=names)
                    break
                except Exception as exc:  # noqa: BLE001 - the API server away, or refusing: retried
                    log.warning("wiping ResourceSlices failed; retrying", driver=driver or "(all)", error=str(exc),
                                retry_in=retry)
                    await anyio.sleep(retry)
                    retry = min(retry * 2, RETRY_MAX_SECONDS)
        if driver is not None and self._pending.get(driver) is scope:
            del self._pending[driver]

    async def _delete(self, driver: str | None) -> list[str]:
        if self._view is None:
            self._view = self.objects.view(kinds.RESOURCE_SLICE, fields={"spec.nodeName": self.node})
        if not await self._view.wait_synced(timeout=30):
            raise ObjectError(f"the node's ResourceSlices could not be listed: {self._view.error or 'no answer'}",
                              None)
        names = [str(s["metadata"]["name"]) for s in self._view.items()
                 if driver is None or (s.get("spec") or {}).get("driver") == driver]
        for name in names:
            try:
                await self.objects.delete(kinds.RESOURCE_SLICE, name)
            except ObjectError as exc:
                if exc.code != 403:  # gone meanwhile (403: the authorizer no longer knows it)
                    raise
        return names


__all__ = ["WIPE_DELAY_SECONDS", "SliceWiper"]
