"""The real test environment itself: images, idempotent `up`, pods, clean stop."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devenv import (
    ALL_IMAGE_NAMES,
    BUSYBOX_IMAGE,
    BUSYBOX_NAMES,
    PAUSE_IMAGE,
    PAUSE_NAMES,
    Containerd,
    hostclean,
    up,
)
from devenv.rawcri import RUNTIME, RawCRI, bytes_field, fields, string_field

pytestmark = pytest.mark.containerd

REPO = Path(__file__).resolve().parents[1]


def test_images_are_listed_under_every_name(containerd: Containerd) -> None:
    images = containerd.images()
    for name in ALL_IMAGE_NAMES:
        assert name in images, f"{name} missing from `ctr images ls`: {sorted(images)}"
    assert len({images[n] for n in BUSYBOX_NAMES}) == 1  # one image, several names
    assert len({images[n] for n in PAUSE_NAMES}) == 1


def test_cri_sees_the_images(containerd: Containerd) -> None:
    with RawCRI(containerd.socket_path) as cri:
        assert cri.version()["runtime_api_version"] == "v1"
        tags = cri.image_tags()
        assert cri.image_fs_used_bytes() > 0  # the fixture waited for the stats sweep
    assert BUSYBOX_IMAGE in tags and PAUSE_IMAGE in tags


def test_up_is_idempotent(containerd: Containerd) -> None:
    pid = containerd.pid()
    log_size = containerd.log_path.stat().st_size
    again = up(containerd.base_dir, install=False)
    assert again.pid() == pid
    # Images already present with the same digest are not imported again.
    assert "ImageCreate" not in containerd.log_path.read_bytes()[log_size:].decode()

    out = subprocess.run([sys.executable, "-m", "devenv", "up", "--no-install",
                          "--dir", str(containerd.base_dir)],
                         capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == containerd.endpoint
    assert containerd.pid() == pid
    status = subprocess.run([sys.executable, "-m", "devenv", "status",
                             "--dir", str(containerd.base_dir)],
                            capture_output=True, text=True, cwd=REPO)
    assert status.returncode == 0 and containerd.endpoint in status.stdout


def test_status_of_a_stopped_environment() -> None:
    with tempfile.TemporaryDirectory(prefix="nodeagent-none-") as d:
        status = subprocess.run([sys.executable, "-m", "devenv", "status", "--dir", d],
                                capture_output=True, text=True, cwd=REPO)
    assert status.returncode == 3, status


# --- a pod through raw CRI calls (devenv must not depend on the cri package) ---

def _run_web_pod(cri: RawCRI, log_dir: str) -> tuple[str, str]:
    """A pod with busybox httpd serving /etc on 8080; returns (pod id, pod IP)."""
    meta = string_field(1, "web") + string_field(2, "uid-web") + string_field(3, "default")
    sandbox = bytes_field(1, meta) + string_field(2, "web") + string_field(3, log_dir)
    pod = dict(fields(cri.call(RUNTIME + "RunPodSandbox", bytes_field(1, sandbox), timeout=60)))[1]
    assert isinstance(pod, bytes)
    pod_id = pod.decode()
    container = (bytes_field(1, string_field(1, "httpd"))
                 + bytes_field(2, string_field(1, BUSYBOX_IMAGE))
                 + string_field(3, "httpd")
                 + b"".join(string_field(4, a) for a in ("-f", "-p", "8080", "-h", "/etc"))
                 + string_field(11, "httpd.log"))
    request = string_field(1, pod_id) + bytes_field(2, container) + bytes_field(3, sandbox)
    cid = dict(fields(cri.call(RUNTIME + "CreateContainer", request, timeout=60)))[1]
    assert isinstance(cid, bytes)
    cri.call(RUNTIME + "StartContainer", string_field(1, cid.decode()), timeout=60)
    status = dict(fields(cri.call(RUNTIME + "PodSandboxStatus", string_field(1, pod_id))))[1]
    assert isinstance(status, bytes)
    network = dict(fields(status))[5]  # PodSandboxStatus.network
    assert isinstance(network, bytes)
    ip = dict(fields(network))[1]
    assert isinstance(ip, bytes)
    return pod_id, ip.decode()


def _http_get(url: str, timeout: float = 10.0) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with opener.open(url, timeout=2) as response:
                return str(response.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture
def scratch_env() -> Iterator[Containerd]:
    """A second, short-lived containerd next to the session's one."""
    base = tempfile.mkdtemp(prefix="nodeagent-scratch-", dir="/tmp")
    env = Containerd(base)
    try:
        yield env
    finally:
        env.destroy()


def _start_with_web_pod(env: Containerd) -> tuple[str, str]:
    """Start the environment, import the images, run the web pod: its id and IP."""
    env.start()
    env.import_images()
    log_dir = str(env.base_dir / "pods")
    os.makedirs(log_dir)
    with RawCRI(env.socket_path) as cri:
        return _run_web_pod(cri, log_dir)


def test_a_bridge_left_on_another_subnet_by_a_dead_environment_of_the_dir_is_replaced(
        scratch_env: Containerd) -> None:
    """The bridge's name comes from the base dir, its subnet from what was free at the time: a
    run killed before its teardown leaves a bridge that the next run of the same dir, on another
    subnet, could not use (every sandbox failed: "already has an IP address different from")."""
    env = scratch_env
    subprocess.run(["ip", "link", "add", env.bridge_name, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", "10.251.0.1/16", "dev", env.bridge_name], check=True)
    _, ip = _start_with_web_pod(env)
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(env.subnet)
    assert "root:x:0:0" in _http_get(f"http://{ip}:8080/passwd")


def test_pod_network_restart_and_clean_stop(scratch_env: Containerd,
                                            containerd: Containerd) -> None:
    env = scratch_env
    assert env.subnet != containerd.subnet and env.bridge_name != containerd.bridge_name
    pod_id, ip = _start_with_web_pod(env)
    assert "root:x:0:0" in _http_get(f"http://{ip}:8080/passwd")

    # Containers outlive a containerd restart; CRI finds the pod again.
    env.restart()
    with RawCRI(env.socket_path) as cri:
        assert cri.pod_ids() == [pod_id]
    assert "nobody:x:65534" in _http_get(f"http://{ip}:8080/passwd")

    shims = hostclean.shims_of(env.socket_path)
    assert shims
    env.stop()
    assert hostclean.mounts_under(env.base_dir) == []
    assert hostclean.shims_of(env.socket_path) == {}
    assert not any(hostclean.pid_alive(pid) for pid in shims)
    assert not Path("/sys/class/net", env.bridge_name).exists()
    assert not env.is_running()
    # The pod's address went back to host-local's pool (CNI DEL ran).
    ipam = env.cni_data_dir / env.network_name
    assert not (ipam / ip).exists()
