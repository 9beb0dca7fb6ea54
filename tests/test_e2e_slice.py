"""The CI slice of the upstream node-conformance run: Kubernetes' own e2e tests
(k8s.io/kubernetes v1.37.2 test/e2e, conformance/e2e/ci-slice.yaml) against nodeagent as the
only node of a real control plane, exactly as ``python -m conformance.e2e run --slice ci``
runs them (the full run is that command without ``--slice``; docs/conformance-report.md).

One pytest test per upstream test, failing with the upstream failure's first line; the whole
report (e2e.log, the node's log) stays in the run's directory when anything failed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from conformance.e2e import selection
from controlplane import build as cpbuild

SLICE = selection.load_slice("ci")
# Other kubelet ports than the defaults, so that the slice's node never clashes with a
# developer's agent or another run on the same machine.
NODE_CONFIG = "port: 10291\nhealthzPort: 10292\n"
RUN_TIMEOUT_SECONDS = 40 * 60  # the slice's ginkgo timeout is 30 min; bring-up and teardown on top


@pytest.fixture(scope="module")
def slice_results() -> dict[str, dict[str, Any]]:
    # Built here when missing (`make deps` leaves them to this file): minutes on a fresh machine,
    # beside the other worker's tests; a stamp check when cached.
    cpbuild.build(["e2e.test", "agnhost", "nonewprivs"])
    # Short: containerd's socket path under it must stay below 108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="na-e2e-", dir="/tmp"))
    config = workdir.parent / f"{workdir.name}.yaml"
    config.write_text(NODE_CONFIG)
    command = [sys.executable, "-m", "conformance.e2e", "run", "--slice", "ci", "--workdir", str(workdir),
               f"--nodeagent-arg=--config={config}"]
    proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=RUN_TIMEOUT_SECONDS)
    results_file = workdir / "report" / "results.json"
    assert results_file.exists(), f"the run wrote no results (exit {proc.returncode}):\n{proc.stdout[-3000:]}" \
                                  f"\n{proc.stderr[-3000:]}"
    results = json.loads(results_file.read_text())
    cases = {case["name"]: case for case in results["cases"]}
    if results["summary"].startswith(f"{len(SLICE)} passed"):
        shutil.rmtree(workdir, ignore_errors=True)
        config.unlink(missing_ok=True)
    else:
        print(f"\nupstream e2e slice: {results['summary']}; report kept in {workdir / 'report'}")
    return cases


@pytest.mark.parametrize("name", SLICE)
def test_upstream(slice_results: dict[str, dict[str, Any]], name: str) -> None:
    case = slice_results.get(name)
    assert case is not None, f"not in the run's report: {name}"
    assert case["status"] == "passed", f"{case['status']}: {case['reason']}"
