"""test/e2e/common/storage/host_path.go: ``[sig-storage] HostPath``.

Pod ``pod-host-path-test`` from ``testPodWithHostVol``: containers ``test-container-1`` and
``test-container-2`` (agnhost mounttest, replaced by its busybox equivalent) each mounting
volume ``test-volume`` = hostPath /tmp at /test-volume, ``privileged`` as the case says,
restartPolicy Never. Upstream's BeforeEach removes the host's /tmp/test-file first.
"""

from __future__ import annotations

import os
from typing import Any

from conformance.standalone import mounttest as mt
from conformance.standalone.framework import BUSYBOX, POD_START, Framework, case

FILE = "test/e2e/common/storage/host_path.go"
PREFIX = "[sig-storage] HostPath"
FRAMEWORK = "hostpath"
VOLUME = "/test-volume"


def host_vol_pod(privileged: bool, commands: list[list[str]]) -> dict[str, Any]:
    """testPodWithHostVol("/test-volume", hostPath{/tmp}, privileged)."""
    return {"metadata": {"name": "pod-host-path-test"}, "spec": {
        "containers": [
            {"name": name, "image": BUSYBOX, "command": command,
             "volumeMounts": [{"name": "test-volume", "mountPath": VOLUME}],
             "securityContext": {"privileged": privileged}}
            for name, command in zip(("test-container-1", "test-container-2"), commands, strict=True)
        ],
        "restartPolicy": "Never",
        "volumes": [{"name": "test-volume", "hostPath": {"path": "/tmp"}}],
    }}


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


@case(f"{PREFIX} should support subPath [NodeConformance]",
      key="HP3", number="37", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def sub_path(f: Framework) -> None:
    """Mirrors "should support subPath": container 1 mounts the volume with subPath
    ``sub-path`` (which the agent must create on the host) and writes /test-volume/test-file;
    container 2 reads /test-volume/sub-path/test-file in a loop (retry 180 s) and its output
    must show the content. Port: mounttest in busybox shell; besides upstream's removal of
    /tmp/test-file, the port also removes a /tmp/sub-path/test-file an earlier run left, which
    would otherwise let the reader pass before the writer ran."""
    _remove("/tmp/test-file")
    _remove("/tmp/sub-path/test-file")
    writer, reader = f"{VOLUME}/test-file", f"{VOLUME}/sub-path/test-file"
    pod = host_vol_pod(True, [mt.script(mt.new_file(writer, 0o644), mt.file_mode(writer)),
                              mt.script(mt.file_content_in_loop(reader, 180))])
    pod["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = "sub-path"
    await f.container_output(pod, 1, [f'content of file "{reader}": mount-tester new file'])


@case(f"{PREFIX} should support r/w [NodeConformance]",
      key="HP2", number="37a", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def read_write(f: Framework) -> None:
    """Mirrors "should support r/w": container 1 writes /test-volume/test-file (0644),
    container 2 reads it in a loop; the content must show in container 2's output. Port:
    mounttest in busybox shell."""
    _remove("/tmp/test-file")
    path = f"{VOLUME}/test-file"
    pod = host_vol_pod(True, [mt.script(mt.new_file(path, 0o644), mt.file_mode(path)),
                              mt.script(mt.file_content_in_loop(path, 180))])
    await f.container_output(pod, 1, [f'content of file "{path}": mount-tester new file'])
