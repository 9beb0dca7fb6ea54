"""What a run leaves behind: the console table, a JUnit XML file, and the markdown report
committed as docs/conformance-standalone.md."""

from __future__ import annotations

import platform
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from conformance.standalone.runner import CaseResult

SUITE_NAME = "nodeagent standalone node conformance"
PRIMARY_ROWS = 40
"""The numbered rows of conformance.md section 16; siblings a row names come on top."""
FAILURE_LINES = 8
MARKDOWN_REASON = 160
"""Lines of each failure message the markdown report quotes."""


def summary(results: Sequence[CaseResult]) -> str:
    """``N passed, M failed, K skipped`` (the line CI and people grep for)."""
    counts = {o: sum(1 for r in results if r.outcome == o) for o in ("pass", "fail", "skip")}
    return f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"


def table(results: Sequence[CaseResult], reason_width: int = 100) -> str:
    """The console table: test, result, seconds, first line of the failure reason."""
    width = max([len("test")] + [len(r.case.name) for r in results])
    lines = [f"{'test':<{width}}  result  seconds  reason", f"{'-' * width}  ------  -------  ------"]
    for r in results:
        reason = r.reason if len(r.reason) <= reason_width else r.reason[: reason_width - 1] + "…"
        lines.append(f"{r.case.name:<{width}}  {r.outcome:<6}  {r.seconds:7.1f}  {reason}")
    return "\n".join(lines)


def junit(results: Sequence[CaseResult], wall_seconds: float) -> ET.ElementTree:
    suite = ET.Element("testsuite", {
        "name": SUITE_NAME,
        "tests": str(len(results)),
        "failures": str(sum(1 for r in results if r.outcome == "fail")),
        "skipped": str(sum(1 for r in results if r.outcome == "skip")),
        "errors": "0",
        "time": f"{wall_seconds:.3f}",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
    })
    for r in results:
        case = ET.SubElement(suite, "testcase", {
            # classname is the upstream file: tools group the cases the way upstream does.
            "classname": r.case.upstream,
            "name": r.case.name,
            "time": f"{r.seconds:.3f}",
        })
        if r.outcome == "fail":
            ET.SubElement(case, "failure", {"message": r.reason, "type": "Failure"}).text = r.message
        elif r.outcome == "skip":
            ET.SubElement(case, "skipped", {"message": r.reason})
    root = ET.Element("testsuites")
    root.append(suite)
    tree = ET.ElementTree(root)
    ET.indent(tree)
    return tree


def write_junit(path: Path, results: Sequence[CaseResult], wall_seconds: float) -> None:
    junit(results, wall_seconds).write(path, encoding="utf-8", xml_declaration=True)


def git_commit(repo: Path) -> str:
    """``<short hash>`` plus `` with uncommitted changes`` when the tree is dirty."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "--short", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit + (" with uncommitted changes" if dirty else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: Sequence[CaseResult], *, wall_seconds: float, commit: str, date: str,
             runtime: str = "") -> str:
    """The committed report: when, on what, how many pass, and the table."""
    primary = [r for r in results if r.case.number.isdigit()]
    siblings = [r for r in results if not r.case.number.isdigit()]
    passed = sum(1 for r in results if r.outcome == "pass")
    primary_passed = sum(1 for r in primary if r.outcome == "pass")
    lines = [
        "# Standalone node conformance: nodeagent against the upstream tests",
        "",
        "The upstream Kubernetes node-conformance tests that a standalone agent can run (section 16",
        "of the shared reference `conformance.md`: 40 numbered rows, plus the 7 sibling tests four of",
        "those rows name), ported to static pods, busybox and nodeagent's own status and log files.",
        "Each case keeps the upstream full test name; its docstring in `conformance/standalone/cases/`",
        "says which upstream test it mirrors and what the port changed.",
        "",
        "Run it (as root): `python -m conformance standalone [--junit FILE] [--report FILE] [--filter REGEX]",
        "[--list] [--endpoint unix:///...] [--parallel N] [--keep]`. It starts a private containerd",
        "(devenv) unless `--endpoint` names one, and one in-process agent; the cases run concurrently,",
        "each bounded by its upstream timeouts, so a run takes about as long as the slowest case (4 min:",
        "the liveness test that must see no restart for 4 minutes). This file is its `--report`.",
        "A fast slice (15 cases, about 20 s) runs in CI: `tests/test_conformance_standalone.py`.",
        "",
        "## Result",
        "",
        f"- Date: {date}",
        f"- Commit: {commit}",
        f"- Host: {platform.system()} {platform.release()} ({platform.machine()})" + (f", {runtime}" if runtime else ""),
        f"- Wall time: {wall_seconds:.0f} s for {len(results)} cases run concurrently",
        f"- **{primary_passed} of {len(primary)} numbered cases pass**"
        + (f"; {passed} of {len(results)} with the {len(siblings)} siblings" if siblings else ""),
        f"- {summary(results)}",
        "",
        "| # | test | result | seconds | reason (first line) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        reason = r.reason if len(r.reason) <= MARKDOWN_REASON else r.reason[: MARKDOWN_REASON - 1] + "…"
        lines.append(f"| {r.case.number} | {_cell(r.case.name)} | {r.outcome} | {r.seconds:.1f} | {_cell(reason)} |")
    failures = [r for r in results if r.outcome == "fail"]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            detail = "\n".join(r.message.strip().splitlines()[:FAILURE_LINES])
            lines += [f"**{r.case.number} {r.case.key}** ({r.case.upstream})", "", "```", detail, "```", ""]
    lines += [
        "",
        "## What the port changes",
        "",
        "- Create is writing a static manifest `<namespace>-<name>.yaml` after node-e2e's `mungeSpec`",
        "  (dnsPolicy Default, imagePullPolicy Never); delete is removing it, so the pod's own",
        "  terminationGracePeriodSeconds applies where upstream often deletes with grace 0. Static pods",
        "  are named `<name>-<node>`: expectations built from the pod name use that name.",
        "- Status comes from the agent's status writer (the same status it writes to",
        "  `<rootDir>/pod-status/`), logs from the CRI log files, exec from CRI ExecSync. Upstream",
        "  watches are polled every 0.2 s.",
        "- agnhost helpers are replaced by busybox as conformance.md sections 11.0 and 18 say",
        "  (mounttest by `stat`/`cat`, `etc-hosts` by `cat /etc/hosts`; pause is devenv's pause image);",
        "  the container-lifecycle harness stamps times with ash's `$EPOCHREALTIME` because the",
        "  image's busybox has no `nmeter`.",
        "- Events are not available: the sysctl test waits for the container to start instead of",
        "  the `Started` event.",
        "- Where upstream's cleanup deletes a pod with grace 0 (the liveness tests), the cleanup stops",
        "  its containers through CRI once the agent is terminating the pod; nothing is asserted on",
        "  that deletion. Deletions a test asserts on (RT1, CL8, OOMKiller) are plain manifest removals.",
        "",
        "## Left out",
        "",
        "Nothing of section 16: all 40 rows are ported. Not ported are the tests section 17 lists as",
        "needing an API server (ConfigMap/Secret objects, pod updates, Events, watch, Services,",
        "websocket streaming, finalizers, mirror pods) and the next wave of section 16 (slower, or",
        "needing plumbing this suite does not have yet).",
        "",
    ]
    return "\n".join(lines)


__all__ = ["PRIMARY_ROWS", "SUITE_NAME", "git_commit", "junit", "markdown", "summary", "table", "write_junit"]
