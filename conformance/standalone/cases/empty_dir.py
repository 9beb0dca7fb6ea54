"""test/e2e/common/storage/empty_dir.go: ``[sig-storage] EmptyDir volumes``.

Pods from ``testPodWithVolume``: ``pod-<uuid>``, container ``test-container`` with volume
``test-volume`` at /test-volume, pod seLinuxOptions level s0, restartPolicy Never; agnhost
mounttest is replaced by its busybox equivalent (:mod:`conformance.standalone.mounttest`).
"""

from __future__ import annotations

import uuid
from typing import Any

from conformance.standalone import mounttest as mt
from conformance.standalone.framework import BUSYBOX, POD_START, Framework, case

FILE = "test/e2e/common/storage/empty_dir.go"
PREFIX = "[sig-storage] EmptyDir volumes"
FRAMEWORK = "emptydir"
VOLUME = "/test-volume"


def volume_pod(medium: str, command: list[str], uid: int = 0) -> dict[str, Any]:
    """testPodWithVolume(uid, "/test-volume", emptyDir{medium})."""
    security: dict[str, Any] = {"seLinuxOptions": {"level": "s0"}}
    if uid:
        security["runAsUser"] = uid
    return {"metadata": {"name": f"pod-{uuid.uuid4()}"}, "spec": {
        "containers": [{"name": "test-container", "image": BUSYBOX, "command": command,
                        "volumeMounts": [{"name": "test-volume", "mountPath": VOLUME}]}],
        "securityContext": security,
        "restartPolicy": "Never",
        "volumes": [{"name": "test-volume", "emptyDir": {"medium": medium} if medium else {}}],
    }}


@case(f"{PREFIX} should support (root,0644,tmpfs) [LinuxOnly] [NodeConformance] [Conformance]",
      key="ED-root-0644-tmpfs", number="36", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def root_0644_tmpfs(f: Framework) -> None:
    """Mirrors "should support (root,0644,tmpfs)" (doTest0644, uid 0, medium Memory): mounttest
    ``--fs_type --new_file_0644 --file_perm`` must print the tmpfs mount type, the file's
    ``-rw-r--r--`` perms and its content. Port: mounttest in busybox shell (section 11.0)."""
    path = f"{VOLUME}/test-file"
    await f.container_output(volume_pod("Memory", mt.script(mt.fs_type(VOLUME), mt.new_file(path, 0o644),
                                                            mt.file_perm(path))), 0, [
        'perms of file "/test-volume/test-file": -rw-r--r--',
        'content of file "/test-volume/test-file": mount-tester new file',
        'mount type of "/test-volume": tmpfs',
    ])


@case(f"{PREFIX} volume on tmpfs should have the correct mode [LinuxOnly] [NodeConformance] [Conformance]",
      key="ED-mode-tmpfs", number="36a", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def tmpfs_mode(f: Framework) -> None:
    """Mirrors "volume on tmpfs should have the correct mode" (doTestVolumeMode, Memory):
    ``--fs_type --file_perm`` on the volume must print tmpfs and ``-rwxrwxrwx``. Port:
    mounttest in busybox shell."""
    await f.container_output(volume_pod("Memory", mt.script(mt.fs_type(VOLUME), mt.file_perm(VOLUME))), 0, [
        'perms of file "/test-volume": -rwxrwxrwx',
        'mount type of "/test-volume": tmpfs',
    ])


@case(f"{PREFIX} volume on default medium should have the correct mode [LinuxOnly] [NodeConformance] [Conformance]",
      key="ED-mode-default", number="36b", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def default_medium_mode(f: Framework) -> None:
    """Mirrors "volume on default medium should have the correct mode" (doTestVolumeMode, node
    default medium): the volume's perms are ``-rwxrwxrwx``. Port: mounttest in busybox shell."""
    await f.container_output(volume_pod("", mt.script(mt.fs_type(VOLUME), mt.file_perm(VOLUME))), 0, [
        'perms of file "/test-volume": -rwxrwxrwx',
    ])
