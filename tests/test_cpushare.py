"""benchmarks/cpushare.py: the CPU of a short window, split by class of process."""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks import cpushare


def test_shims_are_found_by_the_socket_their_command_line_names(tmp_path: Path) -> None:
    def process(pid: int, *argv: str) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")

    process(10, "/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-address", "/tmp/a/containerd.sock")
    process(11, "/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-address", "/tmp/b/containerd.sock")
    process(12, "/bin/containerd", "--address", "/tmp/a/containerd.sock")  # the daemon, not a shim
    process(13, "sleep", "3600")
    (tmp_path / "self").mkdir()
    assert cpushare.shims_of(["unix:///tmp/a/containerd.sock"], tmp_path) == [10]
    assert sorted(cpushare.shims_of(["/tmp/a/containerd.sock", "/tmp/b/containerd.sock"], tmp_path)) == [10, 11]


def test_a_window_counts_what_each_class_used_in_it_and_nothing_for_a_gone_process() -> None:
    before = cpushare.snapshot({"me": [os.getpid()], "gone": [2**22 + 7]})
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    used = cpushare.shares(before, cpushare.snapshot({"me": [os.getpid()], "gone": [2**22 + 7]}))
    assert 0.15 <= used["me"] <= used["window"] + 0.02, used
    assert used["gone"] == 0.0
    assert used["machine_cores"] > 0.5, used
