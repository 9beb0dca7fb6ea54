"""devenv's runtime choice: containerd 2.x built from the Go module proxy (the default) or
Debian's containerd 1.6, each with its native config and the crun handler, each running its
own binaries (devenv.runtime, devenv.containerd).

The session's `containerd` is the runtime $NODEAGENT_RUNTIME selects; the switch test starts
both (the 2.x binaries are built first when missing: minutes, once per machine).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import build as gobuild
from devenv import BUSYBOX_IMAGE, Containerd, hostclean
from devenv.packages import CRUN
from devenv.rawcri import RUNTIME, RawCRI, bytes_field, fields, string_field
from devenv.runtime import (
    CONTAINERD2,
    CONTAINERD2_VERSION,
    CONTAINERD16,
    RUNTIME_ENV,
    containerd2_bin_dir,
    runc_bin_dir,
    selected,
)

pytestmark = pytest.mark.containerd


# --- selection and configuration (no daemon) ---------------------------------------------


def test_containerd2_is_the_default_and_the_variable_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNTIME_ENV, raising=False)
    default = selected()
    assert default.name == CONTAINERD2 and default.config_version == 3
    assert default.bin_dir == containerd2_bin_dir()
    assert default.command("ctr") == str(containerd2_bin_dir() / "ctr")
    monkeypatch.setenv(RUNTIME_ENV, CONTAINERD16)
    old = selected()
    assert old.name == CONTAINERD16 and old.config_version == 2 and old.bin_dir is None
    assert old.command("containerd") == "containerd"  # Debian's, on PATH
    assert selected(CONTAINERD2).name == CONTAINERD2  # an explicit name wins
    monkeypatch.setenv(RUNTIME_ENV, "containerd1.7")
    with pytest.raises(ValueError, match="containerd2, containerd1.6"):
        selected()


def test_each_runtime_gets_its_native_config_with_the_same_settings(tmp_path: Path) -> None:
    v3 = tomllib.loads(Containerd(tmp_path / "a", runtime=selected(CONTAINERD2)).config_text())
    v2 = tomllib.loads(Containerd(tmp_path / "b", runtime=selected(CONTAINERD16)).config_text())
    assert v3["version"] == 3 and v2["version"] == 2
    images, runtime = v3["plugins"]["io.containerd.cri.v1.images"], v3["plugins"]["io.containerd.cri.v1.runtime"]
    old = v2["plugins"]["io.containerd.grpc.v1.cri"]
    assert images["pinned_images"]["sandbox"] == old["sandbox_image"] == "registry.k8s.io/pause:3.10"
    assert runtime["restrict_oom_score_adj"] is old["restrict_oom_score_adj"] is True
    assert runtime["cni"]["bin_dirs"] == [old["cni"]["bin_dir"]] == ["/usr/lib/cni"]
    assert runtime["cni"]["conf_dir"] == str(tmp_path / "a" / "cni" / "net.d")
    assert runtime["cdi_spec_dirs"] == [str(tmp_path / "a" / "cdi")]
    assert "sandbox_image" not in v3["plugins"]["io.containerd.grpc.v1.cri"]  # 2.x: only the server
    assert v3["plugins"]["io.containerd.nri.v1.nri"]["disable"] is True  # its socket is global
    for handlers, base in ((runtime["containerd"]["runtimes"], tmp_path / "a"),
                           (old["containerd"]["runtimes"], tmp_path / "b")):
        assert set(handlers) == {"runc", "crun"}
        assert handlers["crun"]["options"] == {"BinaryName": str(base / "bin" / "crun"), "Root": str(base / "crun")}
    # 2.x's runc is our build (user namespaces need runc >= 1.2); 1.6 runs Debian's from PATH.
    assert runtime["containerd"]["runtimes"]["runc"]["options"] == {
        "BinaryName": str(runc_bin_dir() / "runc"), "Root": str(tmp_path / "a" / "runc")}
    assert old["containerd"]["runtimes"]["runc"]["options"] == {"Root": str(tmp_path / "b" / "runc")}
    # 2.x's handlers name our shim by path; 1.6 finds Debian's on PATH.
    shim = str(containerd2_bin_dir() / "containerd-shim-runc-v2")
    assert {h["runtime_path"] for h in runtime["containerd"]["runtimes"].values()} == {shim}
    assert not any("runtime_path" in h for h in old["containerd"]["runtimes"].values())


# --- the session's daemon ------------------------------------------------------------------

def _sandbox_config(name: str, log_dir: str) -> bytes:
    meta = string_field(1, name) + string_field(2, f"uid-{name}") + string_field(3, "default")
    return bytes_field(1, meta) + string_field(2, name) + string_field(3, log_dir)


def _run_sandbox(cri: RawCRI, name: str, log_dir: str, handler: str = "") -> str:
    request = bytes_field(1, _sandbox_config(name, log_dir)) + (string_field(2, handler) if handler else b"")
    pod = dict(fields(cri.call(RUNTIME + "RunPodSandbox", request, timeout=60)))[1]
    assert isinstance(pod, bytes)
    return pod.decode()


def _start_sleeper(cri: RawCRI, pod_id: str, name: str, log_dir: str) -> str:
    """A busybox `sleep 3600` container in the pod; returns its id."""
    container = (bytes_field(1, string_field(1, "sleep")) + bytes_field(2, string_field(1, BUSYBOX_IMAGE))
                 + string_field(3, "sleep") + string_field(4, "3600") + string_field(11, "sleep.log"))
    request = string_field(1, pod_id) + bytes_field(2, container) + bytes_field(3, _sandbox_config(name, log_dir))
    cid = dict(fields(cri.call(RUNTIME + "CreateContainer", request, timeout=60)))[1]
    assert isinstance(cid, bytes)
    cri.call(RUNTIME + "StartContainer", string_field(1, cid.decode()), timeout=60)
    return cid.decode()


def _remove_sandbox(cri: RawCRI, pod_id: str) -> None:
    for method in ("StopPodSandbox", "RemovePodSandbox"):
        cri.call(RUNTIME + method, string_field(1, pod_id), timeout=60)


def _listed(binary: str, root: Path) -> str:
    """What the OCI runtime itself knows under its state root (the shim passes ROOT/NAMESPACE)."""
    done = subprocess.run([binary, "--root", str(root / "k8s.io"), "list"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, check=False)
    return done.stdout


def test_the_session_runs_the_selected_runtime_with_its_own_binaries(containerd: Containerd,
                                                                     tmp_path: Path) -> None:
    runtime = selected()
    assert containerd.runtime == runtime
    version = containerd.version()["runtime_version"]
    if runtime.name == CONTAINERD2:
        assert version == CONTAINERD2_VERSION  # our build, with upstream's version variables
    else:
        assert version.startswith("1.6.")
    pid = containerd.pid()
    assert pid is not None and hostclean.pid_cmdline(pid)[0] == runtime.command("containerd")
    with RawCRI(containerd.socket_path) as cri:
        pod_id = _run_sandbox(cri, "which-shim", str(tmp_path))
        try:
            shims = [argv[0] for argv in hostclean.shims_of(containerd.socket_path).values()]
            # 2.x's shim from the cache, never Debian's 1.6 one found on PATH (and vice versa)
            want = runtime.command("containerd-shim-runc-v2") if runtime.bin_dir else \
                "/usr/bin/containerd-shim-runc-v2"
            assert shims and set(shims) == {want}, shims
        finally:
            _remove_sandbox(cri, pod_id)


def test_the_crun_handler_runs_a_pod_under_crun(containerd: Containerd, tmp_path: Path) -> None:
    """The runtime handler `crun` (for RuntimeClass) really uses crun: crun's own state has the
    sandbox and its running container, runc's has neither; the default handler is runc."""
    with RawCRI(containerd.socket_path) as cri:
        crun_pod = _run_sandbox(cri, "on-crun", str(tmp_path), handler="crun")
        runc_pod = _run_sandbox(cri, "on-runc", str(tmp_path))
        try:
            sleeper = _start_sleeper(cri, crun_pod, "on-crun", str(tmp_path))
            crun_state, runc_state = _listed(CRUN.probe, containerd.crun_root), \
                _listed(str(containerd.runtime.runc or "runc"), containerd.runc_root)
            assert crun_pod in crun_state and crun_pod not in runc_state
            assert any(line.startswith(sleeper) and " running " in line for line in crun_state.splitlines()), \
                crun_state
            assert sleeper not in runc_state
            assert runc_pod in runc_state and runc_pod not in crun_state
        finally:
            _remove_sandbox(cri, crun_pod)
            _remove_sandbox(cri, runc_pod)
        assert crun_pod not in _listed(CRUN.probe, containerd.crun_root)


def _handlers(cri: RawCRI) -> dict[str, dict[int, int | bytes]]:
    """StatusResponse.runtime_handlers (field 3): name -> RuntimeHandlerFeatures' fields."""
    found = {}
    for number, value in fields(cri.call(RUNTIME + "Status", b"", timeout=10)):
        if number == 3 and isinstance(value, bytes):
            handler = dict(fields(value))
            name, features = handler.get(1, b""), handler.get(2, b"")
            assert isinstance(name, bytes) and isinstance(features, bytes)
            found[name.decode()] = dict(fields(features))
    return found


def test_user_namespaces_come_with_our_runc_on_2x_and_not_on_16(containerd: Containerd) -> None:
    """containerd 2.x says user_namespaces for a handler only when its runc has idmapped mounts:
    the default handler (our runc 1.5) does, crun 1.8 does not; 1.6 reports no handlers."""
    with RawCRI(containerd.socket_path) as cri:
        handlers = _handlers(cri)
    if containerd.runtime.name == CONTAINERD16:
        assert handlers == {}
        return
    assert containerd.runtime.runc == runc_bin_dir() / "runc"
    version = subprocess.run([str(containerd.runtime.runc), "--version"], capture_output=True, text=True,
                             check=True).stdout
    assert version.startswith("runc version 1.5."), version
    assert set(handlers) == {"", "runc", "crun"}
    assert handlers[""].get(2) == 1 and handlers["runc"].get(2) == 1  # user_namespaces: true
    assert not handlers["crun"].get(2)


# --- switching one base dir between runtimes -------------------------------------------------

@pytest.fixture
def base_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="na-rt-", dir="/tmp"))
    try:
        yield base
    finally:
        Containerd(base).destroy()


def test_a_base_dir_changes_runtime_only_when_stopped_and_then_starts_fresh(base_dir: Path) -> None:
    old = Containerd(base_dir, runtime=selected(CONTAINERD16))
    old.start()
    assert old.version()["runtime_version"].startswith("1.6.")
    planted = old.root_dir / "left-by-1.6"
    planted.write_text("")
    new = Containerd(base_dir, runtime=selected(CONTAINERD2))
    with pytest.raises(RuntimeError, match="is not containerd2"):
        new.start()  # the 1.6 daemon still runs there: refused, not silently reused
    assert old.is_running()
    old.stop()
    new.start()
    try:
        assert new.version()["runtime_version"] == CONTAINERD2_VERSION
        assert not planted.exists()  # 1.6's root was not handed to 2.x
        assert (base_dir / "runtime").read_text().strip() == CONTAINERD2
    finally:
        new.stop()


# --- the build unit ---------------------------------------------------------------------------

def test_go_build_units_are_stamped_and_idempotent(tmp_path: Path) -> None:
    """The stamped unit devenv builds containerd 2.x with (shared with the control plane): built
    once, skipped while its stamp matches, rebuilt when it changes or a binary is missing."""
    module = tmp_path / "mod"
    for name in ("one", "two"):
        (module / name).mkdir(parents=True)
        (module / name / "main.go").write_text(f'package main\n\nfunc main() {{ println("{name}") }}\n')
    (module / "go.mod").write_text("module example.com/units\n\ngo 1.26\n")
    out = tmp_path / "bin"
    env = {**gobuild.go_env(), "GOFLAGS": "-buildvcs=false"}
    logs: list[str] = []
    unit = gobuild.GoBuild("pair", module, ("./one", "./two"), out, "stamp-1")
    with gobuild.build_lock(out, logs.append):
        assert unit.run(env, logs.append).built
        assert not unit.run(env, logs.append).built  # up to date: nothing compiled
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["one", "two"]
    assert subprocess.run([str(out / "two")], capture_output=True, text=True).stderr == "two\n"
    assert gobuild.GoBuild("pair", module, ("./one", "./two"), out, "stamp-2").run(env, logs.append).built
    os.unlink(out / "one")
    assert not unit.up_to_date()  # stamp 1 is gone anyway; and a missing binary is never up to date
    assert gobuild.GoBuild("pair", module, ("./one", "./two"), out, "stamp-2").run(env, logs.append).built
    assert not [p for p in out.iterdir() if ".tmp." in p.name]  # no temporary output left
