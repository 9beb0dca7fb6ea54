"""Where CSI volumes live on the node, laid out as the kubelet lays them out under rootDir
(pkg/volume/csi), and the ``vol_data.json`` files that say what each directory is.

================================  ===========================================================================
staging (NodeStage), Filesystem   ``plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount``
its record                        ``plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/vol_data.json``
publish target (NodePublish)      ``pods/<uid>/volumes/kubernetes.io~csi/<specName>/mount``
its record                        ``pods/<uid>/volumes/kubernetes.io~csi/<specName>/vol_data.json``
staging, Block                    ``plugins/kubernetes.io/csi/volumeDevices/staging/<specName>``
publish target, Block (a file)    ``plugins/kubernetes.io/csi/volumeDevices/publish/<specName>/<uid>``
its record                        ``plugins/kubernetes.io/csi/volumeDevices/<specName>/data/vol_data.json``
the pod's device link, Block      ``pods/<uid>/volumeDevices/kubernetes.io~csi/<specName>`` → publish target
================================  ===========================================================================

``specName`` is the PV's name, or the pod's volume name for an inline volume. A record is
written *before* the driver is called, so that an agent killed during the call still finds
what it may have to undo; the driver's work itself is proven by the mount table (a target or
staging path that is a mount point was done), else the call is made again — the CSI calls
are idempotent, as the kubelet's reconstruction relies on.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from nodeagent import hostpaths

PLUGIN_NAME = "kubernetes.io/csi"
PLUGIN_DIR = "kubernetes.io~csi"  # the plugin's name escaped for a path component
DATA_FILE = "vol_data.json"
BLOCK_DIR = "volumeDevices"


def unique_name(driver: str, handle: str) -> str:
    """``kubernetes.io/csi/<driver>^<volumeHandle>``: how node.status.volumesInUse and
    volumesAttached name a CSI volume."""
    return f"{PLUGIN_NAME}/{driver}^{handle}"


def attachment_name(handle: str, driver: str, node: str) -> str:
    """The VolumeAttachment the attach-detach controller makes for a volume on a node."""
    return "csi-" + hashlib.sha256(f"{handle}{driver}{node}".encode()).hexdigest()


def inline_volume_id(pod_uid: str, volume: str) -> str:
    """The volume_id of a CSI inline ephemeral volume (the kubelet's makeVolumeHandle)."""
    return "csi-" + hashlib.sha256(f"{pod_uid}{volume}".encode()).hexdigest()


def spec_component(spec_name: str) -> str:
    """A spec name as one path element (``/`` escaped as ``~``, as the kubelet escapes
    qualified names), checked and fitted like every name from pod data."""
    return hostpaths.component(spec_name.replace("/", "~"), "volume name")


@dataclass(frozen=True)
class Record:
    """What a ``vol_data.json`` says (the kubelet's keys; ``volumeMode`` and
    ``stagingPath`` are ours, to undo a Block volume or an unstage without the spec)."""

    specVolID: str
    volumeHandle: str
    driverName: str
    nodeName: str = ""
    volumeLifecycleMode: str = "Persistent"
    attachmentID: str = ""
    volumeMode: str = "Filesystem"
    stagingPath: str = ""

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({k: v for k, v in asdict(self).items() if v != ""}))
        os.replace(tmp, path)

    @staticmethod
    def read(path: Path) -> Record | None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not data.get("volumeHandle") or not data.get("driverName"):
            return None
        fields = Record.__dataclass_fields__
        return Record(**{k: str(v) for k, v in data.items() if k in fields and v is not None})


@dataclass(frozen=True)
class Layout:
    root_dir: Path

    @property
    def plugin_dir(self) -> Path:
        return self.root_dir / "plugins" / PLUGIN_NAME

    # --- Filesystem ------------------------------------------------------------------------

    def staging_dir(self, driver: str, handle: str) -> Path:
        return self.plugin_dir / hostpaths.component(driver, "CSI driver name") / hashlib.sha256(
            handle.encode()).hexdigest()

    def staging_path(self, driver: str, handle: str) -> Path:
        return self.staging_dir(driver, handle) / "globalmount"

    def staging_record(self, driver: str, handle: str) -> Path:
        return self.staging_dir(driver, handle) / DATA_FILE

    @staticmethod
    def volume_dir(pod_dir: Path, spec_name: str) -> Path:
        return pod_dir / hostpaths.VOLUMES / PLUGIN_DIR / spec_component(spec_name)

    @classmethod
    def target_path(cls, pod_dir: Path, spec_name: str) -> Path:
        return cls.volume_dir(pod_dir, spec_name) / "mount"

    @classmethod
    def publish_record(cls, pod_dir: Path, spec_name: str) -> Path:
        return cls.volume_dir(pod_dir, spec_name) / DATA_FILE

    # --- Block ------------------------------------------------------------------------------

    @property
    def block_dir(self) -> Path:
        return self.plugin_dir / BLOCK_DIR

    def block_staging_path(self, spec_name: str) -> Path:
        return self.block_dir / "staging" / spec_component(spec_name)

    def block_target_path(self, spec_name: str, pod_uid: str) -> Path:
        return self.block_dir / "publish" / spec_component(spec_name) / hostpaths.component(pod_uid, "pod uid")

    def block_record(self, spec_name: str) -> Path:
        return self.block_dir / spec_component(spec_name) / "data" / DATA_FILE

    @staticmethod
    def device_link(pod_dir: Path, spec_name: str) -> Path:
        return pod_dir / BLOCK_DIR / PLUGIN_DIR / spec_component(spec_name)

    # --- what is on disk --------------------------------------------------------------------

    def pod_volumes(self, pod_dir: Path) -> list[Published]:
        """The CSI volumes published (or being published) for the pod in ``pod_dir``, read
        from their records: Filesystem volumes from the pod's volume directory, Block volumes
        from its device links."""
        found: list[Published] = []
        base = pod_dir / hostpaths.VOLUMES / PLUGIN_DIR
        try:
            entries = sorted(base.iterdir())
        except OSError:
            entries = []
        for entry in entries:
            record = Record.read(entry / DATA_FILE)
            if record is not None:
                found.append(Published(record, entry / "mount", entry, None))
        links = pod_dir / BLOCK_DIR / PLUGIN_DIR
        try:
            link_entries = sorted(links.iterdir())
        except OSError:
            link_entries = []
        for link in link_entries:
            record = Record.read(self.block_dir / link.name / "data" / DATA_FILE)
            if record is not None:
                found.append(Published(record, self.block_dir / "publish" / link.name / pod_dir.name, None, link))
        return found

    def pod_dirs(self) -> list[Path]:
        try:
            return sorted(p for p in (self.root_dir / hostpaths.PODS).iterdir() if p.is_dir())
        except OSError:
            return []


@dataclass(frozen=True)
class Published:
    """One pod's publication of a volume, as found on disk."""

    record: Record
    target: Path
    volume_dir: Path | None
    """Filesystem: ``pods/<uid>/volumes/kubernetes.io~csi/<specName>`` (removed after unpublish)."""
    device_link: Path | None
    """Block: the pod's link to the target (removed after unpublish)."""

    @property
    def block(self) -> bool:
        return self.device_link is not None


__all__ = [
    "DATA_FILE",
    "PLUGIN_DIR",
    "PLUGIN_NAME",
    "Layout",
    "Published",
    "Record",
    "attachment_name",
    "inline_volume_id",
    "spec_component",
    "unique_name",
]
