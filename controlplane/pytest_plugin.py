"""The `control_plane` pytest fixture: a real control plane for the test session.

Register it once for the whole suite (so every module shares one control
plane) with, in tests/conftest.py:

    pytest_plugins = ["controlplane.pytest_plugin"]

or import the fixture into a single test module (`from controlplane.pytest_plugin
import control_plane`); a session fixture imported into several modules would
start one control plane per module.

If the binaries are not in the cache the fixture builds them (minutes when
cold, announced on the terminal); it never skips.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import build as _build
from controlplane.cluster import ControlPlane


def _announce(config: pytest.Config, line: str) -> None:
    """Print past pytest's output capture, so the line shows during the run."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        print(line)
        return
    with capman.global_and_fixture_disabled():
        print(line)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on 127.0.0.1.

    Yields a started ControlPlane: `.kubeconfig_admin`, `.node_kubeconfig(name)`,
    `.server_url`, `.ca_file`, `.kubectl(*args, kubeconfig=...)`,
    `.stop_component(name)` / `.start_component(name)`, logs in `.log_dir`.
    The directory is deleted at the end unless a test failed.
    """
    config = request.config
    missing = [n for n in _build.COMPONENTS if not _build.is_built(n)]
    if missing:
        _announce(config, f"\ncontrol plane: building {', '.join(missing)} into "
                          f"{_build.bin_dir()} (cold: minutes; see docs/cluster-mode.md)")
        t0 = time.monotonic()
        _build.build()
        _announce(config, f"control plane: built in {time.monotonic() - t0:.0f}s")
    base = Path(tempfile.mkdtemp(prefix="nodeagent-cp-", dir="/tmp"))
    cp = ControlPlane(base)
    _announce(config, f"\ncontrol plane logs: {cp.log_dir}")
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()
        if request.session.testsfailed == 0:
            shutil.rmtree(base, ignore_errors=True)
