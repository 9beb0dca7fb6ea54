"""A slice of Kubernetes' node e2e suite (k8s.io/kubernetes v1.37.2 test/e2e_node,
conformance/node_e2e/ci-slice.yaml) with nodeagent as the node under test, exactly as
``python -m conformance.node_e2e run --slice ci`` runs it: the suite's own API server
(`e2e_node.test --run-services-mode`), nodeagent registered to it with the suite's bearer token,
then the specs (docs/node-e2e.md).

One pytest test per upstream spec, failing with the upstream failure's first line; the report
stays in the run's directory when anything failed. The suite's ports are fixed (6443 for its API
server, 10250/10248/10255 where its specs dial the node): the file is marked
``serial``, so `make test` runs it alone after the two workers, and a port still taken then fails
it with what holds it, never skips it.
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

from conformance.node_e2e import harness, runner, selection

pytestmark = pytest.mark.serial

SLICE = selection.load_slice()
RUN_TIMEOUT_SECONDS = 15 * 60


@pytest.fixture(scope="module")
def slice_results() -> dict[str, dict[str, Any]]:
    busy = [p for p in harness.PORTS if not runner._port_free(p)]
    assert not busy, f"port(s) {busy} taken: another node e2e run, a kubelet or a nodeagent on this machine"
    harness.build()  # seconds with Go's cache warm from e2e.test; minutes on a fresh machine
    workdir = Path(tempfile.mkdtemp(prefix="na-ne2e-", dir="/tmp"))  # short: containerd's socket path
    command = [sys.executable, "-m", "conformance.node_e2e", "run", "--slice", "ci", "--workdir", str(workdir)]
    proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=RUN_TIMEOUT_SECONDS)
    results_file = workdir / "report" / "results.json"
    assert results_file.exists(), f"the run wrote no results (exit {proc.returncode}):\n{proc.stdout[-3000:]}" \
                                  f"\n{proc.stderr[-3000:]}"
    results = json.loads(results_file.read_text())
    if results["summary"].startswith(f"{len(SLICE)} passed"):
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"\nnode e2e slice: {results['summary']}; report kept in {workdir / 'report'}")
    return {case["name"]: case for case in results["cases"]}


@pytest.mark.parametrize("name", SLICE)
def test_node_e2e(slice_results: dict[str, dict[str, Any]], name: str) -> None:
    case = slice_results.get(name)
    assert case is not None, f"not in the run's report: {name}"
    assert case["status"] == "passed", f"{case['status']}: {case['reason']}"


def test_skip_list_files_exist() -> None:
    """Every file skip.yaml names still defines a spec (a renamed file would silently run)."""
    specs = selection.list_specs(harness.build()[0])
    files = {s.file.split("/", 2)[2] for s in specs if s.file.startswith("k8s.io/kubernetes@")}
    for skip in selection.load_skips():
        assert skip.files <= files, f"skip.yaml names files without specs: {sorted(skip.files - files)}"
