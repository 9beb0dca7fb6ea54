"""This package's tests run on nodeagent's conformance harness: it provides the session fixture
``containerd`` (a private containerd with the busybox and pause images)."""

import pytest

pytest_plugins = ["conformance.harness"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"  # the CRI client (grpc.aio) runs on asyncio only
