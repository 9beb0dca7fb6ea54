"""What the node e2e binary (`e2e_node.test`, k8s.io/kubernetes v1.37.2 test/e2e_node) needs
from us: how it is built, how its internal services and its tests are started, and how a node
we start ourselves joins them. docs/node-e2e.md has the harness facts with file:line references;
the ones this module depends on:

- The suite's API server is the in-process kube-apiserver of `--run-services-mode`
  (services/internal_services.go, services/apiserver.go): it always binds 127.0.0.1:6443 (the
  option's default port; `--host` only changes what the clients dial, default
  https://127.0.0.1:6443), with a self-signed serving cert in /var/run/kubernetes, a token
  file in the current directory (`known_tokens.csv`: `<--bearer-token>,kubelet,uid,system:masters`)
  and no scheduler or controller manager: the tests bind pods to the node by name.
- The node authenticates with that same bearer token (what services/kubelet.go
  createKubeconfig writes for the harness's own kubelet: insecure-skip-tls-verify).
- Before any spec (e2e_node_suite_test.go SynchronizedBeforeSuite) the suite runs the system
  validation in a child (`--system-validate-mode`, which with `--conformance` chroots to
  /rootfs), waits 2 min for the single Node to be Ready, takes the Node's name from the API
  (any name does; more than one Node fails), and reads the node's KubeletConfiguration from
  `<host>/api/v1/nodes/<node>/proxy/configz` for 5 min: the node must serve /configz on its
  kubelet port to the API server's unauthenticated proxy.

So a run is two e2e_node.test processes: the services (`--run-services-mode`), then, once our
node is Ready, the tests (`--start-services=false`). That is `--conformance`'s own split (the
suite then starts only the services and expects a node already registered) done by hand: the
node can then be started after the API server is up and before the suite's 2-minute wait, and
the system validation runs on / rather than on a /rootfs this host does not have.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

SERVICES_HOST = "https://127.0.0.1:6443"
"""Where the suite's API server listens: fixed, not a flag (services/apiserver.go)."""

API_PORT = 6443
KUBELET_PORT = 10250          # endpoints_test.go and others dial https://127.0.0.1:10250 directly
KUBELET_HEALTHZ_PORT = 10248
KUBELET_READ_ONLY_PORT = 10255  # the harness's kubelet has it; the summary and cAdvisor specs read it
POD_CGROUPS = "/kubepods"  # the nodes' cgroupRoot is /: the kubelet's tree, as the specs expect
PORTS = (API_PORT, KUBELET_PORT, KUBELET_HEALTHZ_PORT, KUBELET_READ_ONLY_PORT)
"""Fixed by the suite: one run per machine."""

# Commands a spec may run that would act on the host's systemd: kept off the suite's PATH so that
# the harness takes its no-systemd branches (services/kubelet.go looks systemd-run up) and a spec
# the skip list missed fails on "executable file not found" instead of acting on the host.
HIDDEN_COMMANDS = frozenset({"systemd-run", "systemctl", "journalctl"})


def binary_path() -> Path:
    """Where e2e_node.test is built: $NODEAGENT_E2E_NODE_TEST, or next to (not in) the cache of
    the control plane's binaries -- a run of conformance.e2e may be using those."""
    from controlplane import build as cpbuild
    env = os.environ.get("NODEAGENT_E2E_NODE_TEST")
    if env:
        return Path(env)
    return cpbuild.cache_root() / cpbuild.K8S_VERSION / "node-e2e" / "e2e_node.test"


def build(dest: Path | None = None, *, force: bool = False) -> tuple[Path, float]:
    """`go test -c k8s.io/kubernetes/test/e2e_node` from the pinned e2e module (its go.sum has
    k8s.io/system-validators, which only this package imports); returns (path, seconds built,
    0 when it was already there). Same flags as controlplane/build.py."""
    from controlplane import build as cpbuild
    dest = dest or binary_path()
    if dest.exists() and not force:
        return dest, 0.0
    dest.parent.mkdir(parents=True, exist_ok=True)
    env = cpbuild.go_env()
    jobs = max(1, min(os.cpu_count() or 1, 2))
    t0 = time.monotonic()
    tmp = dest.with_suffix(".tmp")
    subprocess.run(["go", "test", "-c", f"-p={jobs}", "-trimpath", f"-ldflags={cpbuild.ldflags()}",
                    "-o", str(tmp), "k8s.io/kubernetes/test/e2e_node"],
                   cwd=cpbuild.E2E_MODULE, env=env, check=True)
    tmp.replace(dest)
    return dest, time.monotonic() - t0


def kubeconfig(token: str, host: str = SERVICES_HOST) -> str:
    """The node's kubeconfig: the token the suite's API server knows (as the harness writes it)."""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {host}
    insecure-skip-tls-verify: true
users:
- name: kubelet
  user:
    token: {token}
contexts:
- name: local
  context:
    cluster: local
    user: kubelet
current-context: local
"""


def path_without_systemd(farm: Path, path: str | None = None) -> str:
    """A PATH of one directory of symlinks to every command on `path` except HIDDEN_COMMANDS
    (first found wins, as with PATH itself). Removing /usr/bin from PATH would hide everything
    else the suite runs (mount, sh, ...) along with systemd-run."""
    shutil.rmtree(farm, ignore_errors=True)
    farm.mkdir(parents=True)
    seen: set[str] = set()
    for d in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.name in seen or e.name in HIDDEN_COMMANDS:
                continue
            try:
                if not (e.is_file() and os.access(e.path, os.X_OK)):
                    continue
            except OSError:
                continue
            seen.add(e.name)
            (farm / e.name).symlink_to(os.path.realpath(e.path) if e.is_symlink() else e.path)
    return str(farm)


def services_argv(binary: Path, token: str) -> list[str]:
    """The suite's internal services (etcd, kube-apiserver, namespace controller) in one
    process, until SIGTERM (services/internal_services.go run)."""
    return [str(binary), "--run-services-mode", f"--bearer-token={token}", f"--host={SERVICES_HOST}"]


def tests_argv(binary: Path, *, token: str, focus: str, report_dir: Path, runtime_endpoint: str,
               timeout: str, extra: list[str] | None = None, ginkgo: Path | None = None,
               nodes: int = 1) -> list[str]:
    """The tests, against the services and node already up; with ``nodes`` > 1 through the
    ``ginkgo`` CLI in that many processes. No --kubelet-root-dir: e2e_node.test does not register
    it, and sets /var/lib/kubelet (services.KubeletRootDirectory) for the few specs that look
    there (runtime_conformance_test.go, mirror_pod_test.go, pods_api_test.go)."""
    flags = [f"--focus={focus}", f"--timeout={timeout}", "--no-color", "-v"]
    if nodes > 1:
        assert ginkgo is not None
        head = [str(ginkgo), f"--nodes={nodes}", *flags, str(binary), "--"]
    else:
        head = [str(binary), *("--ginkgo." + f.lstrip("-") for f in flags)]
    return [*head,
            "--start-services=false",       # the runner started them, and the node
            "--prepull-images=false",       # nothing is pulled: the runner imported the images
            f"--bearer-token={token}",
            f"--host={SERVICES_HOST}",
            f"--report-dir={report_dir}",
            f"--container-runtime-endpoint={runtime_endpoint}",
            *(extra or [])]
