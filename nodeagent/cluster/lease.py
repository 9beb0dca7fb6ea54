"""The node's heartbeat: a Lease in ``kube-node-lease`` renewed every quarter of its duration.

The node lifecycle controller reads ``renewTime``; a node whose Lease is older than the
controller's grace period becomes NotReady (Unknown), then its pods are evicted. As the
kubelet: name and holderIdentity are the node's name, leaseDurationSeconds 40, renewed every
10 s, owned by the Node object (so it goes when the Node goes). Renewal is an update of the last
object we saw (optimistic concurrency); on a conflict or a missing Lease we fetch or create it
again. Failures are retried sooner than the period and never stop the agent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import structlog
from lightkube.resources.coordination_v1 import Lease

from nodeagent.clock import Clock, SystemClock
from nodeagent.cluster.apicalls import describe, is_conflict, is_not_found

log = structlog.get_logger("nodeagent.cluster.lease")

NAMESPACE = "kube-node-lease"
RETRY_INITIAL_SECONDS = 0.2
"""The kubelet retries a failed renewal at 200 ms, doubling, below the renewal period."""


class NodeLease:
    def __init__(self, api: Any, node_name: str, duration_seconds: int = 40,
                 node_uid: Callable[[], str | None] = lambda: None, clock: Clock | None = None) -> None:
        self._api = api
        self._node = node_name
        self.duration = duration_seconds
        self.interval = duration_seconds / 4
        self._node_uid = node_uid
        self._clock = clock or SystemClock()
        self._lease: dict[str, Any] | None = None
        self.renewals = 0
        self.last_renewed: float | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        delay = RETRY_INITIAL_SECONDS
        while True:
            try:
                await self.renew()
                delay = RETRY_INITIAL_SECONDS
                await self._clock.sleep(self.interval)
            except Exception as exc:  # noqa: BLE001 - never fatal: logged and retried
                log.warning("lease renewal failed; retrying", error=describe(exc), retry_in=delay)
                self._lease = None  # fetch it afresh: it may have changed or gone
                await self._clock.sleep(delay)
                delay = min(delay * 2, self.interval)

    async def renew(self) -> None:
        if self._lease is None:
            self._lease = await self._get_or_create()
        lease = self._lease
        spec = lease.setdefault("spec", {})
        spec.update(holderIdentity=self._node, leaseDurationSeconds=self.duration,
                    renewTime=self._renew_time())
        self._own(lease)
        try:
            updated = await self._api.replace(Lease.from_dict(lease))
        except Exception as exc:
            if is_conflict(exc) or is_not_found(exc):
                self._lease = None  # someone else wrote it, or it went: start over at once
                lease = self._lease = await self._get_or_create()
                lease.setdefault("spec", {}).update(holderIdentity=self._node, leaseDurationSeconds=self.duration,
                                                    renewTime=self._renew_time())
                self._own(lease)
                updated = await self._api.replace(Lease.from_dict(lease))
            else:
                raise
        self._lease = updated.to_dict()
        self.renewals += 1
        self.last_renewed = self._clock.now()

    async def _get_or_create(self) -> dict[str, Any]:
        try:
            return dict((await self._api.get(Lease, self._node, namespace=NAMESPACE)).to_dict())
        except Exception as exc:
            if not is_not_found(exc):
                raise
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._node, "namespace": NAMESPACE},
            "spec": {"holderIdentity": self._node, "leaseDurationSeconds": self.duration,
                     "renewTime": self._renew_time()},
        }
        self._own(body)
        try:
            created = await self._api.create(Lease.from_dict(body))
        except Exception as exc:
            if not is_conflict(exc):
                raise
            created = await self._api.get(Lease, self._node, namespace=NAMESPACE)  # created meanwhile
        return dict(created.to_dict())

    def _renew_time(self) -> str:
        now = self._clock.now()
        # lightkube's models print a whole second without its fraction, which the API server's
        # MicroTime refuses ("…:05Z"): never send a zero fraction.
        micros = int(now * 1_000_000) % 1_000_000 or 1
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{micros:06d}Z"

    def _own(self, lease: dict[str, Any]) -> None:
        """Owned by the Node once we know its UID (the Node may register after the first renewal)."""
        uid = self._node_uid()
        meta = lease.setdefault("metadata", {})
        owners = meta.get("ownerReferences") or []
        if uid is None or any(r.get("kind") == "Node" and r.get("uid") == uid for r in owners):
            return
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": uid}]
