"""The stage contract (conformance.contract) against the built-in stages, on the real containerd."""

from __future__ import annotations

from conformance.contract import StageContract


class TestRuntimeContract(StageContract):
    plugin = "runtime"


class TestNodeResourcesContract(StageContract):
    plugin = "noderesources"


class TestStatusContract(StageContract):
    plugin = "status"


class TestTaintTolerationContract(StageContract):
    plugin = "tainttoleration"
