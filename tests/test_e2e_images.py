"""The images for the upstream e2e run exist under the exact names the e2e binary asks for.

The e2e binary (k8s.io/kubernetes v1.37.2 test/e2e, `python -m controlplane
build e2e.test`) is built by the fixture when missing -- many minutes on a
cold machine, well under a second when cached -- and never skipped: the point
is to check our names against the binary's own `--list-images`.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from conformance.e2e import images, selection
from controlplane import build as cpbuild
from devenv import Containerd
from devenv.images import ImageArchive
from devenv.rawcri import RawCRI


def _announce(config: pytest.Config, line: str) -> None:
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        print(line, file=sys.stderr)
        return
    with capman.global_and_fixture_disabled():
        print(line, file=sys.stderr)


@pytest.fixture(scope="module")
def e2e_test(request: pytest.FixtureRequest) -> Path:
    if not cpbuild.is_built("e2e.test"):
        _announce(request.config, "\nbuilding the upstream e2e.test binary "
                                  "(`python -m controlplane build e2e.test`; minutes when cold) ...")
    cpbuild.build(["e2e.test"])
    return cpbuild.binary("e2e.test")


@pytest.fixture(scope="module")
def listed(e2e_test: Path) -> set[str]:
    out = subprocess.run([str(e2e_test), "--list-images"], capture_output=True, text=True,
                         check=True, stdin=subprocess.DEVNULL, timeout=120)
    names = set(out.stdout.split())
    assert names, out.stderr
    return names


@pytest.fixture(scope="module")
def archives() -> list[ImageArchive]:
    return images.build_all()  # builds agnhost / nnp binaries when missing (cached)


def _index(archive: Path) -> dict[str, Any]:
    with tarfile.open(archive) as tar:
        f = tar.extractfile("index.json")
        assert f is not None
        return json.load(f)  # type: ignore[no-any-return]


def _blob(archive: Path, digest: str) -> bytes:
    with tarfile.open(archive) as tar:
        f = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
        assert f is not None
        return f.read()


def _image(archive: Path) -> tuple[dict[str, object], dict[str, tarfile.TarInfo], dict[str, bytes]]:
    """(image config, layer members by path, regular files' contents) of a one-layer archive."""
    index = _index(archive)
    manifest = json.loads(_blob(archive, index["manifests"][0]["digest"]))
    config = json.loads(_blob(archive, manifest["config"]["digest"]))
    with tarfile.open(fileobj=io.BytesIO(_blob(archive, manifest["layers"][0]["digest"]))) as layer:
        members = {m.name: m for m in layer.getmembers()}
        files = {m.name: layer.extractfile(m).read()  # type: ignore[union-attr]
                 for m in members.values() if m.isfile() and m.name.startswith("etc/")}
    return config, members, files


def test_every_built_name_is_one_the_binary_lists(listed: set[str],
                                                  archives: list[ImageArchive]) -> None:
    built = images.names_of(archives)
    assert sorted(built) == sorted(images.BUILT_NAMES)
    assert [n for n in built if n not in listed] == []
    # the tags that matter most, pinned: v1.37.2 asks for these
    for name in ("registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
                 "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
                 "registry.k8s.io/pause:3.10.2"):
        assert name in listed and name in built


def test_archives_carry_their_names(archives: list[ImageArchive]) -> None:
    for a in archives:
        entries = _index(a.path)["manifests"]
        assert [e["annotations"]["io.containerd.image.name"] for e in entries] == list(a.names)


def test_agnhost_is_laid_out_like_upstream(archives: list[ImageArchive]) -> None:
    agn = next(a for a in archives if images.AGNHOST in a.names)
    config, members, files = _image(agn.path)
    assert config["config"]["Entrypoint"] == ["/agnhost"]  # type: ignore[index]
    assert config["config"]["Cmd"] == ["pause"]  # type: ignore[index]
    assert members["agnhost-2"].issym() and members["agnhost-2"].linkname == "agnhost"
    for path in ("agnhost", "bin/sh", "bin/bash", "usr/bin/curl", "usr/bin/nc", "localhost.crt",
                 "localhost.key", "uploads", "var/registry/pause/manifests/testing",
                 "lib64/ld-linux-x86-64.so.2"):
        assert path in members, path
    assert b"group-defined-in-image:x:50000:" in files["etc/group"]


def test_nonewprivs_binary_is_setuid_root(archives: list[ImageArchive]) -> None:
    nnp = next(a for a in archives if images.NONEWPRIVS in a.names)
    _, members, _ = _image(nnp.path)
    m = members["usr/local/bin/nnp"]
    assert m.uid == 0 and m.mode & 0o4000


def test_images_import_and_show_in_cri(containerd: Containerd,
                                       archives: list[ImageArchive]) -> None:
    containerd.import_images(archives)
    # CRI's image list follows containerd's image events, a moment after `ctr images import`
    # returns: an image imported just now (one another test on this worker's containerd had
    # removed, as image GC does) can be missing from a listing made at once.
    deadline = time.monotonic() + 10
    with RawCRI(containerd.socket_path) as cri:
        while True:
            tags = set(cri.image_tags())
            if all(n in tags for n in images.BUILT_NAMES) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert [n for n in images.BUILT_NAMES if n not in tags] == []


def test_selection_skip_list_and_ci_slice(e2e_test: Path) -> None:
    selected = selection.select(selection.list_specs(e2e_test))
    names = {s.name for s in selected}
    assert len(selected) > 100
    assert all("[NodeConformance]" in n or "[Conformance]" in n or selection.FEATURES.search(n) for n in names)
    skips = selection.load_skips()
    # every skip entry removes at least one selected test (no stale entries)
    assert [s.pattern for s in skips if not any(s.matches(n) for n in names)] == []
    ci = selection.apply_slice(selected, "ci")  # raises if a name is not selected
    assert 20 <= len(ci) <= 40
    assert [s.name for s in ci if selection.skip_reason(s.name, skips)] == []


def test_selection_holds_the_user_namespace_and_runtime_handler_feature_tests(e2e_test: Path) -> None:
    """Issue 15: the upstream tests of what nodeagent implements behind a runtime's abilities
    (hostUsers: false, RuntimeClass handlers) run with the rest."""
    names = {s.name for s in selection.select(selection.list_specs(e2e_test))}
    userns = [n for n in names if "[Feature:UserNamespacesSupport]" in n]
    handlers = [n for n in names if "[Feature:RuntimeHandler]" in n]
    assert len(userns) == 7 and any("must create the user namespace if set to false" in n for n in userns)
    assert any("metrics should report count of started and failed user namespaced pods" in n for n in userns)
    assert len(handlers) == 2 and any("with an unconfigured handler" in n for n in handlers)
    # Only those of test/e2e/common: the other features stay out (the kubelet-in-userns one).
    assert not [n for n in names if "[Feature:KubeletInUserNamespace]" in n]


def test_selection_holds_the_storage_conformance_tests_one_node_runs(e2e_test: Path) -> None:
    """Issue 18: the [Conformance] storage tests of test/e2e/storage a one-node cluster runs are
    selected; the CSI and PVC tests that need driver images or the host's mount namespace are
    not (docs/conformance-report.md says why)."""
    names = {s.name for s in selection.select(selection.list_specs(e2e_test))}
    storage = sorted(n for n in names if n.startswith("[sig-storage] ") and "[Conformance]" in n
                     and any(k in n for k in ("CSI", "PersistentVolumes", "StorageClass", "VolumeAttachment")))
    assert storage == [
        "[sig-storage] CSIInlineVolumes should run through the lifecycle of a CSIDriver [Conformance]",
        "[sig-storage] CSIInlineVolumes should support CSIVolumeSource in Pod API [Conformance]",
        "[sig-storage] CSINodes CSI Conformance should run through the lifecycle of a csinode [Conformance]",
        "[sig-storage] CSIStorageCapacity should support CSIStorageCapacities API operations [Conformance]",
        "[sig-storage] PersistentVolumes CSI Conformance should apply changes to a pv/pvc status [Conformance]",
        ("[sig-storage] PersistentVolumes CSI Conformance should run through the lifecycle of a PV and a PVC "
         "[Conformance]"),
        ("[sig-storage] StorageClasses CSI Conformance should run through the lifecycle of a StorageClass "
         "[Conformance]"),
        "[sig-storage] VolumeAttachment Conformance should apply changes to a volumeattachment status [Conformance]",
        ("[sig-storage] VolumeAttachment Conformance should run through the lifecycle of a VolumeAttachment "
         "[Conformance]"),
    ]
    assert not [n for n in names if "CSI Mock" in n or "PersistentVolumes-local" in n or "[Driver: " in n]


def test_storage_suites_select_the_external_driver_tests(e2e_test: Path) -> None:
    """--storage-suites: e2e.test knows the External Storage suites only when given the driver
    definition; they are selected without the optional, disruptive and slow ones."""
    from conformance.e2e import storage
    assert not [s for s in selection.list_specs(e2e_test) if s.name.startswith(storage.PREFIX)]
    chosen = [s.name for s in selection.list_specs(e2e_test, storage.e2e_args()) if storage.is_selected(s)]
    suites = [n for n in chosen if n.startswith(storage.PREFIX)]
    assert len(suites) > 40 and len(chosen) > len(suites)
    assert not [n for n in chosen if storage.EXCLUDED.search(n)]
    for suite in ("provisioning", "volumes", "volumeMode", "ephemeral", "volume-expand", "subPath"):
        assert any(f"] {suite} " in n for n in suites), suite
    skips = selection.load_skips(storage.SKIP_FILE)
    assert [s.pattern for s in skips if not any(s.matches(n) for n in chosen)] == []  # none stale


def test_report_counts_every_selected_test(tmp_path: Path) -> None:
    """The report covers exactly the selection, from ginkgo's JUnit (no binary needed)."""
    from conformance.e2e import report
    junit = tmp_path / "junit_01.xml"
    junit.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="Kubernetes e2e suite">'
        '<testcase name="[SynchronizedBeforeSuite]" status="passed" time="1"/>'
        '<testcase name="[It] [sig-node] a [NodeConformance]" status="passed" time="2.5"/>'
        '<testcase name="[It] [sig-node] b [NodeConformance]" status="failed" time="300">'
        '<failure type="failed">[FAILED] Timed out after 300.001s.\nmore</failure></testcase>'
        '<testcase name="[It] [sig-node] c [NodeConformance]" status="skipped" time="0">'
        '<skipped message="skipped - Only supported for providers [gce]"/></testcase>'
        '<testcase name="[It] [sig-node] f [NodeConformance]" status="skipped" time="0">'
        '<skipped message="skipped"/></testcase>'
        '<testcase name="[It] [sig-node] not selected" status="skipped" time="0"/>'
        '</testsuite></testsuites>')
    parsed = report.parse_junit([junit])
    selected = [(f"[sig-node] {x} [NodeConformance]", "f.go:1") for x in "abcdef"]
    cases = report.build_cases(selected, {"[sig-node] d [NodeConformance]": "no internet"},
                               parsed, "the run did not reach it")
    by = {c.name.split()[1]: c for c in cases}
    assert [by[x].status for x in "abcdef"] == ["passed", "failed", "skipped", "skipped", "failed",
                                                 "failed"]
    assert by["c"].reason == "Only supported for providers [gce]"
    assert by["f"].reason.startswith("not run:")  # skipped without a word: never reached
    assert by["b"].reason == "[FAILED] Timed out after 300.001s."
    assert by["d"].reason == "skip list: no internet"
    assert by["e"].reason.startswith("not run:")
    assert report.summary_line(cases) == "1 passed, 3 failed, 2 skipped"
    report.write_all(tmp_path / "out", cases, report.RunInfo())
    assert (tmp_path / "out" / "summary.txt").read_text() == "1 passed, 3 failed, 2 skipped\n"
    assert "| 2 | failed | [sig-node] b [NodeConformance]" in (tmp_path / "out" / "report.md").read_text()


def test_side_by_side_reads_a_report_back_and_names_what_only_the_kubelet_passes(tmp_path: Path) -> None:
    """The kubelet column: a run's report.md read back (a pipe in a name or reason survives),
    then per test both results and each side's failures."""
    from conformance.e2e import report
    ours = [report.Case("[sig-node] a | b", "passed", "", 2.0), report.Case("[sig-node] c", "failed", "[FAILED] x|y"),
            report.Case("[sig-node] d", "passed"), report.Case("[sig-node] e", "skipped", "no netdev")]
    report.write_markdown(tmp_path / "report.md", ours, report.RunInfo())
    back = report.read_cases(tmp_path / "report.md")
    assert [(c.name, c.status, c.reason) for c in back] == [(c.name, c.status, c.reason) for c in ours]
    theirs = [report.Case("[sig-node] a | b", "passed"), report.Case("[sig-node] c", "passed"),
              report.Case("[sig-node] d", "failed", "timed out"), report.Case("[sig-node] e", "skipped", "no netdev")]
    report.write_all(tmp_path / "kubelet", theirs, report.RunInfo())
    diff = report.differences(back, report.read_cases(tmp_path / "kubelet" / "results.json"))
    assert diff.theirs_only == ["[sig-node] c"] and diff.ours_only == ["[sig-node] d"] and diff.missing == []
    text = "\n".join(report.side_by_side_lines(back, theirs))
    assert "- passed by kubelet and not by nodeagent: **1**; by nodeagent and not by kubelet: **1**" in text
    assert "| [sig-node] c | failed | [FAILED] x\\|y |" in text
    assert "| 3 | passed | failed | [sig-node] d | timed out |" in text
    assert "| 1 | passed | passed | [sig-node] a \\| b |  |" in text
    info = report.RunInfo(date="2026-12-02 15:00 UTC", nodeagent_commit="abc1234", command="python -m x run",
                          node="kubelet on containerd 2.4.2", wall_seconds=90, notes=["interrupted"])
    report.write_all(tmp_path / "run", theirs, info)
    assert report.run_lines("kubelet", tmp_path / "run" / "results.json") == [
        "- **kubelet** (2026-12-02 15:00 UTC, commit abc1234, 1.5 min): 2 passed, 1 failed, 1 skipped",
        "  - command: `python -m x run`", "  - node: kubelet on containerd 2.4.2", "  - interrupted"]


def test_report_of_several_runs_takes_what_ran_last(tmp_path: Path) -> None:
    """Runs of parts of the selection (or a re-run) merge: the later run's result of a test
    counts, a test a run skipped by focus keeps the result of the run that ran it."""
    from conformance.e2e import report

    def junit(name: str, cases: str) -> Path:
        path = tmp_path / name
        path.write_text('<?xml version="1.0"?><testsuites><testsuite name="Kubernetes e2e suite">'
                        + cases + "</testsuite></testsuites>")
        return path

    versioned = junit("c.xml", '<testcase name="[It] z [NodeConformance] [kubelet: [&gt;=1.36]]" status="passed" time="1"/>')
    assert "z [NodeConformance]" in report.parse_junit([versioned]).cases  # the --list-tests name
    first = junit("a.xml", '<testcase name="[It] x" status="failed" time="1"><failure>[FAILED] boom</failure>'
                           '</testcase><testcase name="[It] y" status="passed" time="1"/>')
    second = junit("b.xml", '<testcase name="[It] x" status="passed" time="1"/>'
                            '<testcase name="[It] y" status="skipped" time="0"><skipped message="skipped"/></testcase>')
    parsed = report.parse_junit([first, second])
    assert {n: c.status for n, c in parsed.cases.items()} == {"x": "passed", "y": "passed"}
    # A test that skipped itself (with its reason) in one pass keeps that skip when another
    # pass (the [Serial] one) lists it as skipped by focus, without a reason.
    own = junit("d.xml", '<testcase name="[It] w" status="skipped" time="0">'
                         '<skipped message="skipped - getsubids binary not found in PATH"/></testcase>')
    focus = junit("e.xml", '<testcase name="[It] w" status="skipped" time="0"><skipped message="skipped"/></testcase>')
    kept = report.parse_junit([own, focus]).cases["w"]
    assert (kept.status, kept.reason) == ("skipped", "getsubids binary not found in PATH")


def test_focus_regex_is_valid_re2_and_exact() -> None:
    names = ["[sig-node] Pods should get a host IP [Conformance] [NodeConformance]",
             "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs (x.y)"]
    rx = selection.focus_regex(names)
    assert "\\ " not in rx  # RE2 rejects an escaped space
    import re
    for n in names:
        assert re.search(rx, "Kubernetes e2e suite " + n)
        assert not re.search(rx, "Kubernetes e2e suite " + n + " more")
        assert not re.search(rx, "Kubernetes e2e suite [sig-x] prefix " + n)
