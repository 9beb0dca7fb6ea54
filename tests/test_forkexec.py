"""Our processes fork only to exec: gRPC's fork handlers are off in the agent and in everything
the test environment runs (a child forked while another thread was inside gRPC ran them and
aborted before its exec). Each entry package sets it before gRPC loads, in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["nodeagent", "devenv"])
def test_importing_an_entry_package_turns_grpcs_fork_handlers_off(package: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", f"import {package}, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "false"


def test_a_setting_of_the_operator_is_kept() -> None:
    env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "true"}
    out = subprocess.run([sys.executable, "-c", "import nodeagent, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "true"
