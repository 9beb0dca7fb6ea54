"""Which attachable volumes the Node's status has told the API server are in use.

The attach-detach controller detaches a volume no pod on the node wants any more at once unless
node.status.volumesInUse lists it (then it waits for the node to drop it, or for its 6-minute
maxWaitForUnmountDuration). So, as the kubelet's reconciler does (VerifyControllerAttachedVolume:
"Volume has not been added to the list of VolumesInUse in the node's volume status"), a volume
that needs attaching is mounted only after a Node status write carrying its name has succeeded:
otherwise a pod deleted while its volume is being mounted could have the volume detached under
the mount.

One store: the Node status writer (nodeagent.cluster.node) records what each successful
write carried and is woken by :meth:`ReportedVolumes.request`, so that a new volume waits one
write round trip rather than the status period; the csi stage asks through its handle.
"""

from __future__ import annotations

from collections.abc import Iterable

import anyio


class ReportedVolumes:
    def __init__(self) -> None:
        self._names: frozenset[str] = frozenset()
        self._requested = anyio.Event()

    def mark(self, names: Iterable[str]) -> None:
        """What the last successful Node status write carried in volumesInUse."""
        self._names = frozenset(names)

    def has(self, name: str) -> bool:
        return name in self._names

    def request(self) -> None:
        """Ask the Node status writer for a write now (a volume waits to be reported)."""
        self._requested.set()

    def take_request(self) -> None:
        """The writer is about to compute the status: a request made before now is served."""
        if self._requested.is_set():
            self._requested = anyio.Event()

    async def wait_requested(self) -> None:
        await self._requested.wait()


__all__ = ["ReportedVolumes"]
