"""Read the JUnit XML e2e.test writes; write our report of the selected tests.

e2e.test --report-dir DIR writes DIR/junit_01.xml (ginkgo's JUnit, one
<testcase name="[It] <full name>" status="passed|failed|skipped|..."> per
spec of the whole suite, suite nodes like [SynchronizedBeforeSuite] too).
The report covers exactly the selected tests:

- passed / failed / skipped, with for failures (and skips) the first line of
  the reason; a selected test that the run never reached (suite aborted,
  setup failed) counts as failed with reason "not run: ...";
- tests removed by the skip list are skipped with the skip list's reason;
- outputs: report.md (a table), junit.xml (selected tests only), results.json,
  and the summary line "N passed, M failed, K skipped" (summary.txt).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
# ginkgo spec states -> ours
_STATE = {"passed": PASSED, "skipped": SKIPPED, "pending": SKIPPED,
          "failed": FAILED, "panicked": FAILED, "interrupted": FAILED,
          "aborted": FAILED, "timedout": FAILED}


@dataclass
class Case:
    name: str
    status: str                # passed | failed | skipped
    reason: str = ""           # first line of the failure / skip message
    seconds: float = 0.0
    state: str = ""            # ginkgo's own state (failed, timedout, ...) or "skip-list"/"not-run"
    location: str = ""


@dataclass
class SuiteCase:
    """A non-test node of the suite ([SynchronizedBeforeSuite], ...) that did not pass."""
    name: str
    state: str
    reason: str


@dataclass
class Parsed:
    cases: dict[str, Case] = field(default_factory=dict)
    suite_failures: list[SuiteCase] = field(default_factory=list)


def first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:400]
    return ""


def _reason(tc: ET.Element) -> str:
    for tag in ("failure", "error"):
        el = tc.find(tag)
        if el is not None:
            # ginkgo's text starts "[FAILED] " / "[PANICKED] " / "[TIMEDOUT] ..."
            return first_line(el.text or el.get("message") or "")
    el = tc.find("skipped")
    if el is not None:
        # "skipped" alone, or "skipped - <why>" when the test skipped itself
        msg = el.get("message") or el.text or ""
        return first_line(msg.removeprefix("skipped").removeprefix(" - "))
    return ""


_VERSION_LABEL = re.compile(r" \[[a-z]+: \[[^\]]*\]\]$")


def parse_junit(paths: Iterable[Path]) -> Parsed:
    """Merge ginkgo JUnit files (a parallel pass and a serial pass, or runs of parts of the
    selection), in the order given."""
    out = Parsed()
    for path in paths:
        root = ET.parse(path).getroot()
        for tc in root.iter("testcase"):
            raw = tc.get("name", "")
            state = tc.get("status", "")
            if not state:
                state = ("failed" if tc.find("failure") is not None or tc.find("error") is not None
                         else "skipped" if tc.find("skipped") is not None else "passed")
            seconds = float(tc.get("time") or 0)
            if raw.startswith("[It] "):
                # ginkgo appends a semantic-version constraint label (" [kubelet: [>=1.36]]") to
                # the JUnit name that --list-tests does not print.
                name = _VERSION_LABEL.sub("", raw[len("[It] "):])
                prev = out.cases.get(name)
                case = Case(name, _STATE.get(state, FAILED), "" if state == "passed" else _reason(tc),
                            seconds, state)
                # The same spec in two files: one pass skipped it by focus, one ran it; or a
                # later run (given later) ran it again: what ran last counts. A skip by focus
                # (no reason) never hides a test's own skip (its reason) from another pass.
                if prev is None or case.status != SKIPPED or (prev.status == SKIPPED and not prev.reason):
                    out.cases[name] = case
            elif state not in ("passed", "skipped"):
                out.suite_failures.append(SuiteCase(raw, state, _reason(tc)))
    return out


_LOG_HEADER = re.compile(r"^(?:•|S|P) (?:\[(?P<state>[A-Z]+)\] )?\[(?P<secs>[0-9.]+) seconds\]$")
_LOG_REASON = re.compile(r"^\s+\[(FAILED|TIMEDOUT|PANICKED|INTERRUPTED|SKIPPED)\] (?!in \[)(?P<msg>.*)$")


def parse_log(path: Path, names: Iterable[str]) -> Parsed:
    """Per-test results out of ginkgo's verbose output (e2e.log), for a pass that
    wrote no JUnit (a parallel run that was killed). Each finished spec prints
    a block: "• [STATE] [N seconds]", its name (with " [It] " before the leaf
    text when it did not pass, and its labels appended), its location, and
    for failures the message after its timeline."""
    by_len = sorted(set(names), key=len, reverse=True)
    out = Parsed()
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        m = _LOG_HEADER.match(line)
        if not m or i + 1 >= len(lines):
            continue
        text = lines[i + 1].replace(" [It] ", " ")
        name = next((n for n in by_len if text == n or text.startswith(n + " [")), None)
        if name is None:
            continue
        state = (m["state"] or "PASSED").lower()
        reason = ""
        if state != "passed":
            for nxt in lines[i + 2:]:
                if nxt.startswith("------------------------------"):
                    break
                r = _LOG_REASON.match(nxt)
                if r:
                    reason = f"[{r.group(1)}] {r['msg']}".strip()
                    break
        out.cases[name] = Case(name, _STATE.get(state, FAILED), reason[:400], float(m["secs"]),
                               state)
    return out


def merge(primary: Parsed, fallback: Parsed) -> Parsed:
    """JUnit results first; the log's for tests the JUnit files do not have."""
    cases = dict(fallback.cases)
    cases.update(primary.cases)
    return Parsed(cases, primary.suite_failures + fallback.suite_failures)


def build_cases(selected: list[tuple[str, str]], skip_reasons: dict[str, str],
                parsed: Parsed | None, not_run_reason: str) -> list[Case]:
    """One Case per selected test (name, location), in selection order."""
    cases = []
    for name, location in selected:
        if name in skip_reasons:
            cases.append(Case(name, SKIPPED, "skip list: " + skip_reasons[name], 0.0, "skip-list",
                              location))
            continue
        got = parsed.cases.get(name) if parsed else None
        # Every test handed to e2e.test is in its --focus: one it skipped without a
        # word was never reached (suite interrupted, timed out, or its setup failed).
        # A test that skips itself (e2eskipper) says why.
        if got is None or (got.state == "skipped" and not got.reason):
            cases.append(Case(name, FAILED, f"not run: {not_run_reason}", 0.0, "not-run", location))
            continue
        got.location = location
        cases.append(got)
    return cases


def summary_line(cases: list[Case]) -> str:
    n = {s: sum(1 for c in cases if c.status == s) for s in (PASSED, FAILED, SKIPPED)}
    return f"{n[PASSED]} passed, {n[FAILED]} failed, {n[SKIPPED]} skipped"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_junit(path: Path, cases: list[Case], suite: str = "nodeagent upstream e2e") -> None:
    n_fail = sum(1 for c in cases if c.status == FAILED)
    n_skip = sum(1 for c in cases if c.status == SKIPPED)
    total = sum(c.seconds for c in cases)
    root = ET.Element("testsuites", tests=str(len(cases)), failures=str(n_fail),
                      time=f"{total:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)),
                       failures=str(n_fail), skipped=str(n_skip), errors="0",
                       time=f"{total:.3f}")
    for c in cases:
        tc = ET.SubElement(ts, "testcase", name=c.name, classname=suite, time=f"{c.seconds:.3f}",
                           status=c.status)
        if c.status == FAILED:
            ET.SubElement(tc, "failure", message=c.reason, type=c.state or "failed").text = c.reason
        elif c.status == SKIPPED:
            ET.SubElement(tc, "skipped", message=c.reason)
    ET.indent(root)
    path.write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n")


@dataclass
class RunInfo:
    """What the report header states."""
    title: str = "Upstream node conformance against nodeagent"
    date: str = ""
    nodeagent_commit: str = ""
    kubernetes: str = ""
    command: str = ""
    node: str = ""
    selection: str = ""
    notes: list[str] = field(default_factory=list)
    suite_failures: list[SuiteCase] = field(default_factory=list)
    wall_seconds: float = 0.0


def write_markdown(path: Path, cases: list[Case], info: RunInfo) -> None:
    summary = summary_line(cases)
    passed = sum(1 for c in cases if c.status == PASSED)
    lines = [
        f"# {info.title}",
        "",
        f"- Date: {info.date or dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- nodeagent commit: {info.nodeagent_commit or 'unknown'}",
        f"- Kubernetes tests: {info.kubernetes}",
        f"- Selection: {info.selection}",
        f"- Command: `{info.command}`",
    ]
    if info.node:
        lines.append(f"- Node: {info.node}")
    if info.wall_seconds:
        lines.append(f"- Wall time: {info.wall_seconds / 60:.1f} min")
    lines += ["", f"**{summary}** — {passed} of {len(cases)} selected tests pass.", ""]
    for note in info.notes:
        lines.append(f"- {note}")
    if info.notes:
        lines.append("")
    if info.suite_failures:
        lines += ["Suite-level failures (these stop tests from running):", ""]
        for sf in info.suite_failures:
            lines.append(f"- `{sf.name}` ({sf.state}): {_md_cell(sf.reason)}")
        lines.append("")
    lines += ["| # | result | test | seconds | reason (first line) |",
              "|---|---|---|---|---|"]
    for i, c in enumerate(cases, 1):
        lines.append(f"| {i} | {c.status} | {_md_cell(c.name)} | {c.seconds:.0f} | "
                     f"{_md_cell(c.reason)} |")
    lines += ["", summary, ""]
    path.write_text("\n".join(lines))


def write_all(out_dir: Path, cases: list[Case], info: RunInfo) -> str:
    """report.md, junit.xml, results.json, summary.txt in out_dir; return the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_markdown(out_dir / "report.md", cases, info)
    write_junit(out_dir / "junit.xml", cases)
    summary = summary_line(cases)
    (out_dir / "summary.txt").write_text(summary + "\n")
    (out_dir / "results.json").write_text(json.dumps(
        {"summary": summary, "info": asdict(info), "cases": [asdict(c) for c in cases]},
        indent=1) + "\n")
    return summary


def read_cases(path: Path) -> list[Case]:
    """The cases of an earlier run: its results.json, or the per-test table of a report.md
    (:func:`write_markdown`'s, and so docs/conformance-report.md's) when only that was kept."""
    if path.suffix == ".json":
        return [Case(**c) for c in json.loads(path.read_text())["cases"]]
    cases = []
    for line in path.read_text().splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and cells[0].isdigit() and cells[1] in (PASSED, FAILED, SKIPPED):
            cases.append(Case(cells[2], cells[1], cells[4], float(cells[3] or 0)))
    if not cases:
        raise ValueError(f"{path}: no per-test table (| # | result | test | seconds | reason |)")
    return cases


def run_lines(label: str, path: Path) -> list[str]:
    """One run's facts, as a markdown list item, from its results.json (a report.md has none)."""
    if path.suffix != ".json":
        return [f"- **{label}**: {path}"]
    data = json.loads(path.read_text())
    info, summary = data.get("info", {}), data.get("summary", "")
    wall = info.get("wall_seconds") or 0
    facts = [f"{info.get('date') or '?'}", f"commit {info.get('nodeagent_commit') or '?'}",
             *([f"{wall / 60:.1f} min"] if wall else [])]
    lines = [f"- **{label}** ({', '.join(facts)}): {summary}", f"  - command: `{info.get('command', '?')}`"]
    if info.get("node"):
        lines.append(f"  - node: {' '.join(info['node'].split())}")  # one line: a wrapper script has several
    lines += [f"  - {note}" for note in info.get("notes", [])]
    return lines


@dataclass
class Differences:
    """Two runs of one selection, test by test."""
    ours_only: list[str]
    """Passed on the first node, not on the second."""
    theirs_only: list[str]
    """Passed on the second node, not on the first: each a defect or a reasoned exception."""
    missing: list[str]
    """In one run's selection and not in the other's."""


def differences(ours: list[Case], theirs: list[Case]) -> Differences:
    a = {c.name: c for c in ours}
    b = {c.name: c for c in theirs}
    both = [c.name for c in ours if c.name in b]
    return Differences(
        ours_only=[n for n in both if a[n].status == PASSED and b[n].status != PASSED],
        theirs_only=[n for n in both if b[n].status == PASSED and a[n].status != PASSED],
        missing=sorted(a.keys() ^ b.keys()))


def side_by_side_lines(ours: list[Case], theirs: list[Case], labels: tuple[str, str] = ("nodeagent", "kubelet"),
                       ) -> list[str]:
    """Markdown: both summaries, the tests whose results differ (with the failing side's
    reason), then every test with both results, in the first run's order."""
    first, second = labels
    b = {c.name: c for c in theirs}
    diff = differences(ours, theirs)
    lines = [f"- **{first}: {summary_line(ours)}** of {len(ours)}",
             f"- **{second}: {summary_line(theirs)}** of {len(theirs)}",
             f"- passed by {second} and not by {first}: **{len(diff.theirs_only)}**; "
             f"by {first} and not by {second}: **{len(diff.ours_only)}**", ""]
    if diff.missing:
        lines += [f"In one selection only (left out of the comparison): {len(diff.missing)}", ""]
    ours_by_name = {c.name: c for c in ours}
    for title, names, failing in ((f"Passed by {second}, not by {first}", diff.theirs_only, ours_by_name),
                                  (f"Passed by {first}, not by {second}", diff.ours_only, b)):
        if not names:
            continue
        lines += [f"{title}:", "", "| test | result there | reason (first line) |", "|---|---|---|"]
        lines += [f"| {_md_cell(n)} | {failing[n].status} | {_md_cell(failing[n].reason)} |" for n in names]
        lines.append("")
    lines += [f"| # | {first} | {second} | test | reason (first line, of the side that did not pass) |",
              "|---|---|---|---|---|"]
    for i, c in enumerate(ours, 1):
        other = b.get(c.name)
        reason = c.reason if c.status != PASSED else (other.reason if other and other.status != PASSED else "")
        lines.append(f"| {i} | {c.status} | {other.status if other else '–'} | {_md_cell(c.name)} | "
                     f"{_md_cell(reason)} |")
    return lines
