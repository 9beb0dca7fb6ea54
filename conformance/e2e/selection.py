"""Which upstream tests run: the selection, the skip list and the CI slice.

The selection (issue 8) is, from the tests the e2e binary knows
(`e2e.test --list-tests`, which prints `file:line: full name`):

- every test tagged [NodeConformance], wherever it lives; and
- every [Conformance] test defined under test/e2e/common/ (node and storage):
  those run on one node; and
- the feature tests of test/e2e/common/ for what nodeagent implements and
  the kubelet gates on a runtime's abilities (issue 15): [Feature:UserNamespacesSupport]
  (hostUsers: false) and [Feature:RuntimeHandler] (RuntimeClass handlers); and
- the [Conformance] storage tests of test/e2e/storage that one node can run
  (issue 18): CSIDriver, CSINode, CSI inline volumes in the Pod API, PV and PVC
  lifecycles and status, CSIStorageCapacity, StorageClass, VolumeAttachment. docs/conformance-report.md says
  why each other CSI and PVC test cannot run here (PersistentVolumes-local and
  the in-tree local driver enter the host's mount namespace through
  /proc/1/ns/mnt, which this host refuses; CSI Mock, CSI Volumes and the
  external-driver suites need images and a driver deployment).

The skip list (skip.yaml, one file) removes tests from the run, each with a
reason; they are reported as skipped with that reason, never hidden. The CI
slice (ci-slice.yaml) is a fixed list of exact names out of the selection.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SKIP_FILE = HERE / "skip.yaml"
SLICES = {"ci": HERE / "ci-slice.yaml"}

_LINE = re.compile(r"^\s+(?P<loc>\S+:\d+): (?P<name>.+)$")
COMMON_DIRS = ("test/e2e/common/node/", "test/e2e/common/storage/", "test/e2e/common/")


class SelectionError(RuntimeError):
    pass


@dataclass(frozen=True)
class Spec:
    name: str       # the full ginkgo text, as --focus matches it and JUnit names it
    location: str   # file:line in the k8s.io/kubernetes module

    @property
    def file(self) -> str:
        return self.location.rsplit(":", 1)[0]


@dataclass(frozen=True)
class Skip:
    pattern: str
    reason: str
    regex: re.Pattern[str]

    def matches(self, name: str) -> bool:
        return self.regex.search(name) is not None


def list_specs(e2e_test: Path, extra_args: list[str] | None = None) -> list[Spec]:
    """Every test the binary contains (`--list-tests`: no cluster needed; ``extra_args`` such
    as a storage driver definition add the tests they define)."""
    out = subprocess.run([str(e2e_test), "--list-tests", *(extra_args or [])], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=300, check=False)
    if out.returncode != 0:
        raise SelectionError(f"{e2e_test} --list-tests failed ({out.returncode}): "
                             f"{out.stderr.strip()[-2000:]}")
    specs = []
    for line in out.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            specs.append(Spec(m["name"], m["loc"]))
    if not specs:
        raise SelectionError(f"{e2e_test} --list-tests printed no test")
    return specs


STORAGE = re.compile(
    r"^\[sig-storage\] (CSIInlineVolumes|CSINodes CSI Conformance|PersistentVolumes CSI Conformance|"
    r"CSIStorageCapacity|StorageClasses CSI Conformance|VolumeAttachment Conformance) .*\[Conformance\]")
"""[Conformance] storage tests outside test/e2e/common that one node can run (see above)."""


FEATURES = re.compile(r"\[Feature:(UserNamespacesSupport|RuntimeHandler)\]")
"""Feature-tagged tests of test/e2e/common for features nodeagent implements (see above)."""


def is_selected(spec: Spec) -> bool:
    if "[NodeConformance]" in spec.name:
        return True
    if STORAGE.search(spec.name):
        return True
    if FEATURES.search(spec.name) and "test/e2e/common/" in spec.file:
        return True
    return "[Conformance]" in spec.name and "test/e2e/common/" in spec.file


def select(specs: list[Spec]) -> list[Spec]:
    return sorted((s for s in specs if is_selected(s)), key=lambda s: s.name)


def load_skips(path: Path = SKIP_FILE) -> list[Skip]:
    """skip.yaml: a list of {pattern: <regex on the full name>, reason: <why>}."""
    data = yaml.safe_load(path.read_text()) or []
    skips = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not entry.get("pattern") or not entry.get("reason"):
            raise SelectionError(f"{path}: entry {i} needs both 'pattern' and 'reason'")
        try:
            regex = re.compile(entry["pattern"])
        except re.error as e:
            raise SelectionError(f"{path}: entry {i}: bad pattern {entry['pattern']!r}: {e}") from e
        skips.append(Skip(entry["pattern"], " ".join(str(entry["reason"]).split()), regex))
    return skips


def skip_reason(name: str, skips: list[Skip]) -> str | None:
    for s in skips:
        if s.matches(name):
            return s.reason
    return None


def load_slice(name: str) -> list[str]:
    path = SLICES.get(name)
    if path is None:
        raise SelectionError(f"unknown slice {name!r}; known: {', '.join(SLICES)}")
    data = yaml.safe_load(path.read_text()) or {}
    tests = data.get("tests") if isinstance(data, dict) else data
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise SelectionError(f"{path}: 'tests' must be a list of exact test names")
    return tests


def apply_slice(selected: list[Spec], slice_name: str) -> list[Spec]:
    wanted = load_slice(slice_name)
    by_name = {s.name: s for s in selected}
    missing = [n for n in wanted if n not in by_name]
    if missing:
        raise SelectionError(f"slice {slice_name!r} names tests that are not in the selection "
                             f"(renamed upstream?): {missing}")
    return [by_name[n] for n in wanted]


def go_regex_escape(text: str) -> str:
    """Escape for Go's RE2: only its metacharacters (Python's re.escape also
    escapes spaces, which RE2 rejects as an invalid escape)."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def focus_regex(names: list[str]) -> str:
    """A ginkgo --focus that matches exactly these tests.

    Ginkgo matches against "<suite description> <full name>" ("Kubernetes
    e2e suite [sig-node] ..."): anchored at both ends, with the description
    as any text without a '[' (every test name starts with "[sig-").
    """
    if not names:
        raise SelectionError("nothing to run")
    return r"^[^\[]* (?:" + "|".join(go_regex_escape(n) for n in sorted(set(names))) + ")$"
