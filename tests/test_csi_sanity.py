"""csi-sanity (github.com/kubernetes-csi/csi-test/v5, built from the Go module proxy as
``csi-sanity``) against the hostpath CSI test driver: the driver the CSI tests of nodeagent
stand on must itself keep the spec (idempotent calls, the right error codes), in Filesystem and
in Block mode."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from controlplane import build as cp_build
from drivers.csihostpath import HostPathDriver
from nodeagent.mounttable import mounts_under

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def csi_sanity() -> Path:
    if not cp_build.is_built("csi-sanity"):
        cp_build.build(["csi-sanity"])
    return cp_build.binary("csi-sanity")


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="csi-s-", dir="/tmp"))
    try:
        yield path
    finally:
        assert not mounts_under(path), "csi-sanity or the driver left mounts behind"
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("access", ["mount", "block"])
async def test_the_test_driver_passes_csi_sanity(csi_sanity: Path, base: Path, access: str) -> None:
    driver = HostPathDriver(registry_dir=base / "registry", plugin_dir=base / "plugin", state_dir=base / "state",
                            node_id="sanity-node", attach_required=True)
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        result = await anyio.run_process(
            [str(csi_sanity), f"--csi.endpoint={driver.endpoint}", f"--csi.mountdir={base / 'target'}",
             f"--csi.stagingdir={base / 'staging'}", "--csi.testvolumesize=1048576",
             f"--csi.testvolumeaccesstype={access}", "--ginkgo.no-color"], check=False)
        tg.cancel_scope.cancel()
    output = result.stdout.decode(errors="replace")
    assert result.returncode == 0, output[-6000:]
    summary = re.search(r"SUCCESS! -- (\d+) Passed \| 0 Failed", output)
    assert summary is not None and int(summary.group(1)) >= 40, output[-3000:]
    # The Node service was exercised, not skipped: volumes were staged and published.
    assert driver.count("NodeStageVolume") > 0 and driver.count("NodePublishVolume") > 0
    assert driver.count("ControllerPublishVolume") > 0
