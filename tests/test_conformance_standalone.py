"""The standalone conformance suite (conformance/standalone): a fast, stable slice of the ported
upstream tests against the session's containerd, and the suite's own machinery.

The slice runs concurrently on one in-process agent, as ``python -m conformance standalone``
runs all of them (that command is the full run; docs/conformance-standalone.md has its result).
Each sliced case is its own pytest test, named by the catalogue key, failing with the case's
own message.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conformance.standalone import mounttest as mt
from conformance.standalone import report
from conformance.standalone.framework import Case, all_cases, munge
from conformance.standalone.lifecycle_harness import exec_command, parse, prepare_pod
from conformance.standalone.runner import CaseResult, open_node, run_cases

pytestmark = pytest.mark.anyio

# Chosen for coverage at a low cost: each finishes in seconds and leaves no pod with a long
# grace period to wait out. Termination messages, env expansion, the downward API, init
# containers, the lifecycle harness (init failure, blocking postStart), capabilities,
# /etc/hosts and hostname, emptyDir on tmpfs, hostPath subPath, CRI log paths, sysctls.
SLICE = ("RT3", "RT4", "E1", "D1", "D4", "I1", "CL2", "CL5", "SC5", "K3", "FQ3", "ED-root-0644-tmpfs", "HP3", "LP2",
         "SY1")


def _cases() -> dict[str, Case]:
    return {c.key: c for c in all_cases()}


@pytest.fixture(scope="module")
async def slice_results(containerd: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CaseResult]:
    cases = _cases()
    async with open_node(containerd.endpoint, tmp_path_factory.mktemp("conformance")) as node:
        results = await run_cases(node, [cases[key] for key in SLICE])
    return {r.case.key: r for r in results}


@pytest.mark.parametrize("key", SLICE)
async def test_upstream_case(slice_results: dict[str, CaseResult], key: str) -> None:
    result = slice_results[key]
    assert result.outcome == "pass", f"{result.case.name}\n{result.message}"


# --- the suite's machinery ---------------------------------------------------------------

def test_every_row_of_section_16_is_ported_once_with_its_upstream_name() -> None:
    cases = all_cases()
    numbers = [c.number for c in cases]
    assert sorted(n for n in numbers if n.isdigit()) == sorted(str(i) for i in range(1, 41))
    assert len(set(numbers)) == len(numbers)
    for c in cases:
        assert c.name.startswith(("[sig-node] ", "[sig-storage] ")), c.name
        assert "[NodeConformance]" in c.name, c.name
        assert c.upstream.startswith("test/e2e"), c.upstream
        assert re.search(r"\bMirrors\b", c.doc) and "Port" in c.doc, f"{c.key}: docstring must say what it mirrors and what the port changed"


def test_munge_is_node_e2e_mungespec() -> None:
    pod = munge({"metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "i", "image": "x"}],
        "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x", "imagePullPolicy": "Always"}],
    }}, "ns-1", "node-a")
    assert pod["metadata"]["namespace"] == "ns-1"
    assert pod["spec"]["nodeName"] == "node-a" and pod["spec"]["dnsPolicy"] == "Default"
    assert [c.get("imagePullPolicy") for c in pod["spec"]["containers"]] == ["Never", "Always"]
    assert "imagePullPolicy" not in pod["spec"]["initContainers"][0]


def _busybox(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["busybox", "sh", "-c", script], check=False, capture_output=True, text=True, timeout=30)


def test_lifecycle_harness_stamps_parse_and_order(tmp_path: Path) -> None:
    # The harness script runs under the host's busybox with /persistent and /proc/1/fd/1 swapped
    # for local files; its stamps must parse and keep their order.
    log = tmp_path / "out"
    script = exec_command("init-1", delay=0)[2].replace("/persistent", str(tmp_path)).replace("/proc/1/fd/1", str(log))
    assert _busybox(f"cd {tmp_path} && {script}").returncode == 0
    script = exec_command("regular-1", exit_code=3)[2].replace("/persistent", str(tmp_path)).replace(
        "/proc/1/fd/1", str(log))
    assert _busybox(f"cd {tmp_path} && {script}").returncode == 3
    timeline = parse(log.read_text())
    assert [(s.container, s.command) for s in timeline] == [
        ("init-1", "Starting"), ("init-1", "Started"), ("init-1", "Delaying"), ("init-1", "Exiting"),
        ("regular-1", "Starting"), ("regular-1", "Started"), ("regular-1", "Delaying"), ("regular-1", "Exiting"),
    ]
    timeline.starts_before("init-1", "regular-1")
    timeline.exits_before("init-1", "regular-1")
    timeline.has_not_restarted("init-1")
    with pytest.raises(AssertionError, match="couldn't find that init-1 ever restarted"):
        timeline.has_restarted("init-1")
    with pytest.raises(AssertionError, match="find regular-1 started, but didn't expect to"):
        timeline.doesnt_start("regular-1")
    with pytest.raises(AssertionError, match="couldn't find that init-1 started after regular-1"):
        timeline.starts_before("regular-1", "init-1")


def test_prepare_pod_gives_every_container_the_persistent_volume() -> None:
    pod = prepare_pod({"spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "c"}],
                                "volumes": [{"name": "other"}]}})
    for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        assert c["volumeMounts"] == [{"name": "persistent", "mountPath": "/persistent"}]
        assert c["resources"] == {"requests": {"memory": "15Mi"}, "limits": {"memory": "35Mi"}}
    assert pod["spec"]["volumes"] == [{"name": "persistent", "emptyDir": {}}]


def test_mounttest_lines_match_agnhost(tmp_path: Path) -> None:
    d = tmp_path / "vol"
    d.mkdir()
    d.chmod(0o1777)
    f = d / "test-file"
    out = _busybox(mt.script(mt.new_file(str(f), 0o644), mt.file_perm(str(f)), mt.file_perm(str(d)),
                             mt.file_mode(str(f)))[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f'content of file "{f}": mount-tester new file',
        f'perms of file "{f}": -rw-r--r--',
        f'perms of file "{d}": -rwxrwxrwx',  # Perm() drops the sticky bit and the type
        f'mode of file "{f}": -rw-r--r--',
    ]
    missing = _busybox(mt.file_content_in_loop(str(d / "absent"), 1))
    assert missing.returncode == 1 and "Error reading file" in missing.stdout


def test_report_table_summary_junit_and_markdown(tmp_path: Path) -> None:
    cases = _cases()
    results = [CaseResult(cases["K2a"], "pass", 1.5), CaseResult(cases["RT1"], "fail", 300.0, "timed out\nmore"),
               CaseResult(cases["SY1"], "skip", 0.0, "in a user namespace")]
    assert report.summary(results) == "1 passed, 1 failed, 1 skipped"
    table = report.table(results).splitlines()
    assert table[0].split() == ["test", "result", "seconds", "reason"]
    assert any(line.startswith(cases["RT1"].name) and "fail" in line and "timed out" in line for line in table)
    path = tmp_path / "junit.xml"
    report.write_junit(path, results, 301.0)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    failed = [tc for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failed] == [cases["RT1"].name]
    assert failed[0].find("failure").get("message") == "timed out"  # type: ignore[union-attr]
    text = report.markdown(results, wall_seconds=301.0, commit="abc1234", date="Mon Jan 01 00:00:00 UTC 2024")
    assert "abc1234" in text and "Mon Jan 01 00:00:00 UTC 2024" in text
    assert "| 1 | " + cases["RT1"].name + " | fail | 300.0 | timed out |" in text
