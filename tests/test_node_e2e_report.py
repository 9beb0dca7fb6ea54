"""docs/node-conformance-report.md's rendering: two runs' results.json, spec by spec."""

from __future__ import annotations

from pathlib import Path

from conformance.e2e import report
from conformance.node_e2e.__main__ import main


def test_the_report_puts_both_runs_and_every_spec_side_by_side(tmp_path: Path) -> None:
    ours = [report.Case("[sig-node] a [NodeConformance]", "passed"),
            report.Case("[sig-node] b [NodeConformance]", "failed", "[FAILED] no cgroup"),
            report.Case("[sig-node] c [NodeConformance]", "skipped", "skip.yaml: restarts the kubelet")]
    theirs = [report.Case("[sig-node] a [NodeConformance]", "passed"),
              report.Case("[sig-node] b [NodeConformance]", "passed"),
              report.Case("[sig-node] c [NodeConformance]", "skipped", "skip.yaml: restarts the kubelet")]
    report.write_all(tmp_path / "na", ours, report.RunInfo(nodeagent_commit="abc1234", command="run"))
    report.write_all(tmp_path / "k", theirs, report.RunInfo(nodeagent_commit="abc1234", command="run --node kubelet"))
    out = tmp_path / "node-conformance-report.md"
    assert main(["report", str(tmp_path / "na" / "results.json"), str(tmp_path / "k" / "results.json"),
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "- **nodeagent** (" in text and "commit abc1234" in text and "`run --node kubelet`" in text
    assert "- **nodeagent: 1 passed, 1 failed, 1 skipped** of 3" in text
    assert "- passed by kubelet and not by nodeagent: **1**; by nodeagent and not by kubelet: **0**" in text
    assert "| 2 | failed | passed | [sig-node] b [NodeConformance] | [FAILED] no cgroup |" in text
