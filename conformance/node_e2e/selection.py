"""Which node e2e specs run: the selection and the skip list (skip.yaml).

The selection is every spec of `e2e_node.test --list-tests` tagged [NodeConformance] (v1.37.2:
614; 226 defined in test/e2e_node, 388 in test/e2e/common), narrowed by --focus (a Python regex
on the full name). The listing's format is e2e.test's (`file:line: full name`), so its parser is
conformance/e2e/selection.py's.

skip.yaml removes specs that cannot run here, by file (most: the file restarts the kubelet
through systemd) or by a pattern on the name, each with its reason; skipped specs are reported,
never hidden.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from conformance.e2e.selection import SelectionError, Spec, focus_regex, list_specs

HERE = Path(__file__).resolve().parent
SKIP_FILE = HERE / "skip.yaml"
SLICE_FILE = HERE / "ci-slice.yaml"

__all__ = ["SKIP_FILE", "Skip", "SelectionError", "Spec", "focus_regex", "list_specs", "load_skips",
           "select", "skip_reasons", "load_slice", "apply_slice"]


@dataclass(frozen=True)
class Skip:
    reason: str
    files: frozenset[str]              # paths below the module root: test/e2e_node/x_test.go
    regex: re.Pattern[str] | None      # searched in the full name

    def matches(self, spec: Spec) -> bool:
        if self.regex is not None and self.regex.search(spec.name):
            return True
        # spec.file is "k8s.io/kubernetes@v1.37.2/test/e2e_node/x_test.go"
        rel = spec.file.split("/", 2)[2] if spec.file.startswith("k8s.io/kubernetes@") else spec.file
        return rel in self.files


def load_skips(path: Path = SKIP_FILE) -> list[Skip]:
    data = yaml.safe_load(path.read_text()) or []
    skips = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not entry.get("reason") or not (entry.get("files") or entry.get("pattern")):
            raise SelectionError(f"{path}: entry {i} needs a 'reason' and 'files' or 'pattern'")
        try:
            regex = re.compile(entry["pattern"]) if entry.get("pattern") else None
        except re.error as e:
            raise SelectionError(f"{path}: entry {i}: bad pattern {entry['pattern']!r}: {e}") from e
        skips.append(Skip(" ".join(str(entry["reason"]).split()), frozenset(entry.get("files") or ()), regex))
    return skips


def select(specs: list[Spec], focus: str | None = None, *, node_only: bool = False) -> list[Spec]:
    """``node_only``: only the specs defined in test/e2e_node (not the test/e2e/common ones
    e2e_node.test also carries, which conformance/e2e runs through e2e.test already)."""
    chosen = [s for s in specs if "[NodeConformance]" in s.name and (not node_only or "/test/e2e_node/" in s.file)]
    if focus:
        rx = re.compile(focus)
        chosen = [s for s in chosen if rx.search(s.name)]
    return sorted(chosen, key=lambda s: s.name)


def skip_reasons(selected: list[Spec], skips: list[Skip]) -> dict[str, str]:
    """{name: reason} for the selected specs the skip list removes."""
    out = {}
    for s in selected:
        for sk in skips:
            if sk.matches(s):
                out[s.name] = sk.reason
                break
    return out


def load_slice(path: Path = SLICE_FILE) -> list[str]:
    """ci-slice.yaml: {tests: [exact full names]} -- specs that pass here in seconds."""
    data = yaml.safe_load(path.read_text()) or {}
    tests = data.get("tests") if isinstance(data, dict) else data
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise SelectionError(f"{path}: 'tests' must be a list of exact spec names")
    return tests


def apply_slice(selected: list[Spec], wanted: list[str]) -> list[Spec]:
    by_name = {s.name: s for s in selected}
    missing = [n for n in wanted if n not in by_name]
    if missing:
        raise SelectionError(f"the slice names specs that are not in the selection (renamed upstream?): {missing}")
    return [by_name[n] for n in wanted]
