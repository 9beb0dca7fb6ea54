"""Conformance for stage plugins: the contract suite and the harness it runs on.

- :mod:`conformance.contract`: :class:`~conformance.contract.StageContract`, the tests every stage
  plugin inherits (``class TestMine(StageContract): plugin = "mine"``);
- :mod:`conformance.harness`: a stage wired to a real containerd as the agent wires it, for the
  contract and for a plugin's own integration tests; also a pytest plugin
  (``pytest_plugins = ["conformance.harness"]``) that provides the ``containerd`` fixture.
"""

import pytest

# The contract's asserts explain themselves only when pytest rewrites them.
pytest.register_assert_rewrite("conformance.contract", "conformance.harness")
