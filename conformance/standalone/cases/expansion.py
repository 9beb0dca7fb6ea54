"""test/e2e/common/node/expansion.go: ``[sig-node] Variable Expansion``.

Every case is TestContainerOutput on pod ``var-expansion-<uuid>`` (label ``name=<pod>``,
restartPolicy Never) with one busybox container ``dapi-container``.
"""

from __future__ import annotations

import uuid
from typing import Any

from conformance.standalone.framework import BUSYBOX, POD_START, Framework, case

FILE = "test/e2e/common/node/expansion.go"
PREFIX = "[sig-node] Variable Expansion"
FRAMEWORK = "var-expansion"


def expansion_pod(container: dict[str, Any]) -> dict[str, Any]:
    pod_name = f"var-expansion-{uuid.uuid4()}"
    return {"metadata": {"name": pod_name, "labels": {"name": pod_name}}, "spec": {
        "containers": [{"name": "dapi-container", "image": BUSYBOX, **container}],
        "restartPolicy": "Never",
    }}


@case(f"{PREFIX} should allow composing env vars into new env vars [NodeConformance] [Conformance]",
      key="E1", number="9", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def compose_env(f: Framework) -> None:
    """Mirrors expansion.go "should allow composing env vars into new env vars": FOO, BAR and
    FOOBAR=``$(FOO);;$(BAR)``; ``env`` must print FOO=foo-value, BAR=bar-value and
    FOOBAR=foo-value;;bar-value. Port: as upstream."""
    await f.container_output(expansion_pod({
        "command": ["sh", "-c", "env"],
        "env": [{"name": "FOO", "value": "foo-value"}, {"name": "BAR", "value": "bar-value"},
                {"name": "FOOBAR", "value": "$(FOO);;$(BAR)"}],
    }), 0, ["FOO=foo-value", "BAR=bar-value", "FOOBAR=foo-value;;bar-value"])


@case(f"{PREFIX} should allow substituting values in a container's command [NodeConformance] [Conformance]",
      key="E2", number="10", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def substitute_in_command(f: Framework) -> None:
    """Mirrors expansion.go "should allow substituting values in a container's command": the
    command ``TEST_VAR=wrong echo "$(TEST_VAR)"`` is expanded by the agent (not the shell), so
    the output is ``test-value``. Port: as upstream."""
    await f.container_output(expansion_pod({
        "command": ["sh", "-c", 'TEST_VAR=wrong echo "$(TEST_VAR)"'],
        "env": [{"name": "TEST_VAR", "value": "test-value"}],
    }), 0, ["test-value"])


@case(f"{PREFIX} should allow substituting values in a container's args [NodeConformance] [Conformance]",
      key="E3", number="11", upstream=FILE, framework=FRAMEWORK, timeout=POD_START + 60)
async def substitute_in_args(f: Framework) -> None:
    """Mirrors expansion.go "should allow substituting values in a container's args": the same
    expansion in ``args`` (command ``sh -c``); output ``test-value``. Port: as upstream."""
    await f.container_output(expansion_pod({
        "command": ["sh", "-c"],
        "args": ['TEST_VAR=wrong echo "$(TEST_VAR)"'],
        "env": [{"name": "TEST_VAR", "value": "test-value"}],
    }), 0, ["test-value"])
