"""Session-wide fixtures: the real containerd (devenv) and the anyio backend.

Other fixtures belong in their own conftest files; this one only provides
the environment every integration test stands on.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pluggy
import pytest

from devenv import Containerd, build_images, ensure_packages

# The real control plane (etcd, kube-apiserver, controller-manager, scheduler) as a session
# fixture `control_plane`, shared by every module that asks for it.
pytest_plugins = ["controlplane.pytest_plugin"]

def spurious_grpc_poller_error(context: dict[str, object]) -> bool:
    """grpc.aio's poller is process-wide and binds itself to every event loop that used gRPC
    (grpc/grpc#23377). A test session runs one loop per test: when an earlier test's (closed)
    loop still has a completion due, the poller's callback on the current loop raises "Event
    loop is closed" in the current test, which did nothing wrong. An agent process has one loop
    for its whole life, so only tests meet this."""
    exc = context.get("exception")
    return (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
            and "PollerCompletionQueue._handle_events" in repr(context.get("handle")))


_call_exception_handler = asyncio.BaseEventLoop.call_exception_handler


def _filtered_call_exception_handler(self: asyncio.BaseEventLoop, context: dict[str, object]) -> None:
    if spurious_grpc_poller_error(context):
        return
    _call_exception_handler(self, context)


# Before anyio's test runner collects loop exceptions into the test's result.
asyncio.BaseEventLoop.call_exception_handler = _filtered_call_exception_handler  # type: ignore[method-assign]

# Where the session's Containerd is kept for the report hook below.
_ENV_KEY = pytest.StashKey[Containerd]()


def _announce(config: pytest.Config, line: str) -> None:
    """Print past pytest's output capture, so the line shows during the run."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        print(line)
        return
    with capman.global_and_fixture_disabled():
        print(line)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True, scope="session")
def _entry_points_of_this_checkout() -> Iterator[None]:
    """The built-in plugins pyproject.toml declares, discoverable even when the installed
    package's metadata is older than this checkout (an editable install made from another
    worktree): a no-op once the package is reinstalled from here."""
    import tomllib
    from importlib.metadata import EntryPoint

    from nodeagent import registry

    declared = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    wanted = declared["project"]["entry-points"][registry.GROUP]
    real = registry.entry_points
    missing = [EntryPoint(name, value, registry.GROUP) for name, value in wanted.items()
               if not any(ep.name == name for ep in real(group=registry.GROUP))]
    if not missing:
        yield
        return

    def with_missing(**kwargs: object) -> object:
        found = list(real(**kwargs))  # type: ignore[arg-type]
        return [*found, *missing] if kwargs.get("group") == registry.GROUP else found

    registry.entry_points = with_missing  # type: ignore[assignment]
    try:
        yield
    finally:
        registry.entry_points = real  # type: ignore[assignment]


@pytest.fixture(scope="session")
def containerd(request: pytest.FixtureRequest) -> Iterator[Containerd]:
    """A private containerd (CRI, bridge CNI, busybox and pause images) for the session.

    Which containerd: $NODEAGENT_RUNTIME (devenv.runtime), containerd 2.x unless it
    says containerd1.6; the session's first line after the log names it and its version.

    Lives under /tmp because a unix socket path must stay under 108 bytes.
    Its pod subnet and bridge are derived from its directory, so it can run
    next to `make env` and other sessions. The directory is deleted at the end
    unless a test failed: then containerd.log stays for reading.
    """
    ensure_packages()
    archives = build_images()
    base = Path(tempfile.mkdtemp(prefix="nodeagent-test-", dir="/tmp"))
    env = Containerd(base)  # the runtime $NODEAGENT_RUNTIME selects (containerd 2.x by default)
    request.config.stash[_ENV_KEY] = env
    _announce(request.config, f"\ncontainerd log: {env.log_path} (endpoint {env.endpoint})")
    try:
        env.start()
        v = env.version()
        _announce(request.config, f"runtime {env.runtime.name}: {v.get('runtime_name')} "
                                  f"{v.get('runtime_version')} (CRI {v.get('runtime_api_version')})")
        env.import_images(archives)
        env.wait_image_stats()  # so ImageFsInfo is settled for the first test
        yield env
    finally:
        env.stop()
        if request.session.testsfailed == 0:
            shutil.rmtree(base, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """Name containerd's log in the report of a failing test that used it
    (directly or through another fixture)."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "containerd" in getattr(item, "fixturenames", ()):
        env = item.config.stash.get(_ENV_KEY, None)
        if env is not None:
            report.sections.append(("containerd", f"containerd log: {env.log_path}"))
