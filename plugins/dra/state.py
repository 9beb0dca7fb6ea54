"""What is prepared on this node: one entry per ResourceClaim, the pods that use it, the devices
its drivers returned — and the checkpoint that keeps it across agent restarts.

The checkpoint has the kubelet's shape (pkg/kubelet/cm/dra/state): ``{"Data": <JSON text>,
"Checksum": <CRC32-IEEE of Data>}``, Data being a ``DRACheckpoint`` with one entry per claim. It
is written *before* a driver is called (the intent: after a crash the agent still knows to call
NodeUnprepareResources for a claim whose preparation may have happened) and again after the
answer, always by atomic replace, so a reader finds the old or the new file, never half of one.
nodeagent adds ``Prepared`` to each entry, so that a restarted agent can adopt a claim a running
pod uses instead of preparing it a second time.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.statefile import write_atomic
from plugins.dra.api import Claim, Device

KIND = "DRACheckpoint"
API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"


class CheckpointError(Exception):
    pass


@dataclass
class ClaimEntry:
    uid: str
    name: str
    namespace: str
    pod_uids: set[str] = field(default_factory=set)
    drivers: dict[str, list[Device]] = field(default_factory=dict)
    """Driver → the devices it returned (the keys are known before the driver answered)."""
    prepared: bool = False
    """Every driver answered NodePrepareResources without error for this claim."""
    restored: bool = False
    """Loaded from the checkpoint: prepared by an earlier agent process."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def claim(self) -> Claim:
        return Claim(namespace=self.namespace, uid=self.uid, name=self.name)

    def devices(self) -> list[Device]:
        return [d for devices in self.drivers.values() for d in devices]


class ClaimCache:
    """Entries by claim UID; persisted by :meth:`save` to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, ClaimEntry] = {}

    def by_name(self, namespace: str, name: str) -> ClaimEntry | None:
        return next((e for e in self.entries.values() if (e.namespace, e.name) == (namespace, name)), None)

    def of_pod(self, pod_uid: str) -> list[ClaimEntry]:
        return [e for e in self.entries.values() if pod_uid in e.pod_uids]

    # --- the file -------------------------------------------------------------------------

    def load(self) -> None:
        """Read the checkpoint; a missing file is an empty one. Raises CheckpointError when the
        file is unreadable or its checksum does not match."""
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise CheckpointError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            outer = json.loads(raw)
            data = outer["Data"]
            if zlib.crc32(data.encode()) != outer["Checksum"]:
                raise CheckpointError(f"{self.path}: checksum mismatch (the file is corrupted)")
            inner = json.loads(data)
            if inner.get("kind") != KIND or inner.get("apiVersion") != API_VERSION:
                raise CheckpointError(f"{self.path}: not a {API_VERSION} {KIND}")
            self.entries = {e.uid: e for e in (_entry(x) for x in inner.get("Entries") or [])}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{self.path}: malformed checkpoint: {exc!r}") from None

    def save(self) -> None:
        data = json.dumps({"kind": KIND, "apiVersion": API_VERSION,
                           "Entries": [_state(e) for e in sorted(self.entries.values(), key=lambda e: e.uid)]},
                          separators=(",", ":"))
        text = json.dumps({"Data": data, "Checksum": zlib.crc32(data.encode())})
        self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        write_atomic(self.path, text)


def _state(e: ClaimEntry) -> dict[str, Any]:
    def device(d: Device) -> dict[str, Any]:
        out: dict[str, Any] = {"PoolName": d.pool_name, "DeviceName": d.device_name,
                               "RequestNames": list(d.request_names), "CDIDeviceIDs": list(d.cdi_device_ids)}
        if d.share_id is not None:
            out["ShareID"] = d.share_id
        return out

    return {"ClaimUID": e.uid, "ClaimName": e.name, "Namespace": e.namespace, "PodUIDs": sorted(e.pod_uids),
            "DriverState": {name: {"Devices": [device(d) for d in devices]} for name, devices in e.drivers.items()},
            "Prepared": e.prepared}


def _entry(x: dict[str, Any]) -> ClaimEntry:
    drivers = {
        name: [Device(pool_name=d.get("PoolName", ""), device_name=d.get("DeviceName", ""),
                      request_names=tuple(d.get("RequestNames") or ()),
                      cdi_device_ids=tuple(d.get("CDIDeviceIDs") or ()),
                      share_id=d.get("ShareID"))
               for d in (state or {}).get("Devices") or []]
        for name, state in (x.get("DriverState") or {}).items()
    }
    return ClaimEntry(uid=x["ClaimUID"], name=x["ClaimName"], namespace=x["Namespace"],
                      pod_uids=set(x.get("PodUIDs") or ()), drivers=drivers, prepared=bool(x.get("Prepared")),
                      restored=True)
