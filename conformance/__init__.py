"""Conformance for stage plugins: the contract suite and the harness it runs on.

- :mod:`conformance.contract`: :class:`~conformance.contract.StageContract`, the tests every stage
  plugin inherits (``class TestMine(StageContract): plugin = "mine"``);
- :mod:`conformance.harness`: the real agent with a plugin in its profile, on a CRI runtime, for the
  contract and for a plugin's own integration tests; also a pytest plugin
  (``pytest_plugins = ["conformance.harness"]``) that provides the ``containerd`` fixture;
- :mod:`conformance.recorder`: what the harness sees of the agent (phase calls, runtime calls) and
  where it makes a pod's deletion arrive;
- :mod:`conformance.memruntime`: an in-memory CRI runtime faithful to containerd where the agent
  depends on it, so that all of this runs without root or containerd.
"""

import pytest

# The contract's asserts explain themselves only when pytest rewrites them.
pytest.register_assert_rewrite("conformance.contract", "conformance.harness", "conformance.recorder")
