"""The upstream storage test suites against nodeagent's CSI node side (issue 18).

test/e2e/storage/testsuites (provisioning, volumes, volumeMode, subPath, multiVolume,
ephemeral, fsGroupChangePolicy, volume-expand, volumeIO, ...) run against any CSI driver
already installed in the cluster when e2e.test is given a driver definition
(``--storage.testdriver``, test/e2e/storage/external): the tests are then named
``External Storage [Driver: <name>] [Testpattern: ...] ...``. Ours is the hostpath CSI test
driver (drivers/csihostpath, storage-driver.yaml), run on the node: its node service
registered through the node's ``pluginsRegistryDir``, its provisioner and resizer loops on the
admin credentials (stand-ins for the external-provisioner and external-resizer sidecars, which
the Go module proxy does not serve; docs/VOLUMES.md). So the suites exercise what a real
cluster would: the PV controller, the scheduler's volume binding, the ephemeral-volume
controller, and the node's stage/publish, fsGroup, block devices and expansion.

Selected (``--storage-suites``): every such test but those tagged [Feature:...] (optional
features the driver lacks: snapshots, cloning, VolumeAttributesClass, ...), [Disruptive]
(they restart the kubelet through the host's service manager) and [Slow]; and the PVC
Protection tests, which provision through the default StorageClass the run makes for the
driver, PV Protection, Ephemeralstorage and the suites on in-tree emptyDir and hostPath
volumes (``OTHERS``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from conformance.e2e.selection import Spec
from drivers.csihostpath import DRIVER_NAME

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DRIVER_FILE = HERE / "storage-driver.yaml"
SKIP_FILE = HERE / "storage-skip.yaml"
"""Tests of these suites that cannot run on this host (skip.yaml's format and rule)."""
PREFIX = f"External Storage [Driver: {DRIVER_NAME}] "
EXCLUDED = re.compile(r"\[Feature:|\[Disruptive\]|\[Slow\]")

CSIDRIVER = f"""apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: {DRIVER_NAME}
spec:
  attachRequired: false
  podInfoOnMount: true
  fsGroupPolicy: File
  volumeLifecycleModes: [Persistent, Ephemeral]
"""


DEFAULT_CLASS = f"""apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: csi-hostpath-default
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: {DRIVER_NAME}
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
"""
"""The cluster's default StorageClass, for the tests that provision through it (PVC
Protection skips itself without one)."""

OTHERS = re.compile(r"^\[sig-storage\] (PVC Protection|PV Protection|Ephemeralstorage"
                    r"|In-tree Volumes \[Driver: (emptydir|hostPath|hostPathSymlink)\]) ")
"""The other storage tests one node runs that are neither [Conformance] nor [NodeConformance]:
PVC Protection provisions through the default StorageClass; PV Protection (the finalizer of a
hostPath PV), Ephemeralstorage (a pod whose configMap, secret or projected volume does not
exist can be deleted) and the same suites on the in-tree emptyDir and hostPath volumes need no
driver. (The other in-tree drivers are clouds', NFS, iSCSI, or the local one: see
docs/conformance-report.md.)"""


def e2e_args() -> list[str]:
    """What e2e.test needs, for listing and for running, to know the suites."""
    return [f"--storage.testdriver={DRIVER_FILE}"]


def is_selected(spec: Spec) -> bool:
    return (spec.name.startswith(PREFIX) or OTHERS.search(spec.name) is not None) \
        and not EXCLUDED.search(spec.name)


def node_config(user_config: Path | None, registry: Path) -> str:
    """The node's configuration file: the user's (``--nodeagent-arg=--config=...``) with the
    plugin registry the driver registers in (not the machine-wide default, which another
    agent on this host may watch)."""
    data: dict[str, Any] = (yaml.safe_load(user_config.read_text()) or {}) if user_config else {}
    data["pluginsRegistryDir"] = str(registry)
    text: str = yaml.safe_dump(data, sort_keys=False)
    return text


class StorageDriver:
    """The test driver process for one run: started once the node is Ready, stopped with the
    environment. Its CSIDriver object is applied first (the node reads fsGroupPolicy,
    podInfoOnMount and the lifecycle modes from it), with the default StorageClass."""

    def __init__(self, work: Path, registry: Path, node_name: str) -> None:
        self.work = work
        self.registry = registry
        self.node_name = node_name
        self.log_path = work / "csihostpath.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, cp: Any, timeout: float = 60.0) -> None:
        cp.kubectl("apply", "-f", "-", input=CSIDRIVER + "---\n" + DEFAULT_CLASS)
        argv = [sys.executable, "-m", "drivers.csihostpath", "--driver-name", DRIVER_NAME,
                "--registry-dir", str(self.registry), "--plugin-dir", str(self.work / "plugin"),
                "--state-dir", str(self.work / "state"), "--node-id", self.node_name,
                "--kubeconfig", str(cp.kubeconfig_admin)]
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=REPO, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the hostpath CSI test driver exited with {self.proc.returncode} "
                                   f"(see {self.log_path})")
            done = cp.kubectl("get", "csinode", self.node_name, "-o",
                              "jsonpath={.spec.drivers[*].name}", check=False)
            if DRIVER_NAME in done.stdout.split():
                return
            time.sleep(1)
        raise RuntimeError(f"driver {DRIVER_NAME} not in the CSINode of {self.node_name} within "
                           f"{timeout:.0f}s (see {self.log_path})")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def release(work: Path) -> None:
    """Detach the loop devices over the driver's Block volume images that a run left (an
    interrupted one, or pods the node had no time to tear down): each holds its image open."""
    for image in (work / "state").glob("**/*.img"):
        found = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True, check=False)
        for line in found.stdout.splitlines():
            subprocess.run(["losetup", "-d", line.split(":", 1)[0]], capture_output=True, check=False)
