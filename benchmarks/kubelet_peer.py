"""The upstream kubelet as a benchmark peer: standalone, static pods, on the benchmark's containerd.

The kubelet v1.37.2 that ``python -m controlplane build kubelet`` puts in the shared cache runs
with no API server (no ``--kubeconfig``: standalone mode), a static pod dir, its own root and
cert dirs, and the cgroupfs driver on the cgroup v1 hierarchies these machines mount
(``failCgroupV1: false``). Everything else is the kubelet's default, as a node would run it.

The machine is shared with other sessions, so what the kubelet would change beyond its own
pods is kept to itself (controlplane/confine.py has the parts the conformance runner's kubelet
shares):

- **Kernel tunables.** On start the kubelet sets vm.overcommit_memory=1, kernel.panic=10,
  kernel.panic_on_oops=1 and three more (container_manager_linux.go, setupKernelTunables); they
  are host-wide. It runs in a private mount namespace where each of those /proc/sys files is a
  bind-mounted copy, so its writes land in the copy (``KubeletProcess.tunables_written`` says
  what it wrote).
- **iptables and ports.** It creates KUBE-IPTABLES-HINT and KUBE-FIREWALL (a DROP rule for
  non-loopback traffic to 127.0.0.0/8) and listens on its ports: it runs in a private network
  namespace. Its pods are unaffected: their network is containerd's and CNI's, set up in the
  host namespace; the kubelet reaches containerd over a unix socket. The namespace has a veth
  pair with a documentation address (NODE_IP) and a default route through it, so the kubelet
  finds a node IP as on a real node (without one it fails its node status every 10 s). Its
  hostname resolves to that address through a private /etc/hosts: the kubelet looks its node
  name up (net.LookupIP) in its sync loop, and a DNS query from a namespace whose route leads
  nowhere waits out the resolver's timeouts, 10 s a time, which stalled every pod start.
- **Orphan pod cgroups.** The kubelet kills the processes of pod cgroups under its root that it
  does not know (cleanupOrphanedPodCgroups). Its ``cgroupRoot`` is a directory of its own, so
  nothing of another session (nodeagent's /nodeagent-pods, another kubelet's /kubepods) is
  under it.

Two agents on one containerd kill each other's pods as orphans: the caller runs this one only
when the runtime is empty and empties it after (benchmarks.pod_start).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from controlplane.confine import (
    KERNEL_TUNABLES,
    copy_tunables,
    make_cgroup_root,
    remove_cgroup_root,
    tunables_written,
)
from controlplane.kubeletconfig import kubelet_config

NODE_IP = "192.0.2.10"  # TEST-NET-1 (RFC 5737), only ever inside the kubelet's network namespace
GATEWAY = "192.0.2.1"

READY_LINE = "Eviction manager: starting control loop"

# In the private namespaces: loopback up, the tunables shadowed, then the kubelet itself (exec:
# the process the caller started *is* the kubelet, so its /proc CPU and RSS are the kubelet's).
_WRAPPER = """set -e
dir=$1; shift
ip link set lo up
ip link add nodeip0 type veth peer name nodeip1
ip addr add {node_ip}/24 dev nodeip0
ip link set nodeip0 up
ip link set nodeip1 up
ip route add default via {gateway} dev nodeip0 onlink
mount --bind "$dir/hosts" /etc/hosts
for t in {tunables}; do
  mount --bind "$dir/$(echo "$t" | tr / _)" "/proc/sys/$t"
done
exec "$@"
"""


class KubeletProcess:
    """One standalone kubelet, with its own dirs under workdir (the node name is its hostname
    override, so static pods are named ``<manifest name>-<node>`` as nodeagent names them)."""

    def __init__(self, workdir: Path, binary: Path, endpoint: str, max_pods: int) -> None:
        self.node = f"kubelet{uuid.uuid4().hex[:6]}"
        self.dir = workdir / self.node
        self.manifests = self.dir / "manifests"
        self.manifests.mkdir(parents=True)
        self.tunables = self.dir / "tunables"
        self.log_path = self.dir / "kubelet.log"
        self.cgroup_root = f"/nodeagent-bench-{self.node}"
        self.healthz_port = 10248
        # No API server, so no client CA: every request allowed, on loopback in its own network
        # namespace.
        config = kubelet_config(endpoint=endpoint, static_pod_path=self.manifests, pod_logs_dir=self.dir / "logs",
                                cgroup_root=self.cgroup_root, port=10250, healthz_port=self.healthz_port,
                                max_pods=max_pods, client_ca=None)
        self.config_path = self.dir / "kubelet-config.json"
        self.config_path.write_text(json.dumps(config, indent=1) + "\n")
        root = self.dir / "root"
        self.argv = [str(binary), f"--config={self.config_path}", f"--root-dir={root}",
                     f"--cert-dir={root / 'pki'}", f"--hostname-override={self.node}"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> None:
        copy_tunables(self.tunables)
        (self.tunables / "hosts").write_text(Path("/etc/hosts").read_text() + f"\n{NODE_IP} {self.node}\n")
        make_cgroup_root(self.cgroup_root)
        wrapper = _WRAPPER.format(tunables=" ".join(KERNEL_TUNABLES), node_ip=NODE_IP, gateway=GATEWAY)
        argv = ["unshare", "--mount", "--net", "--propagation", "slave", "sh", "-c", wrapper, "kubelet-peer",
                str(self.tunables), *self.argv]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kubelet exited with {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_tail())
            if self.healthy() and self.runtime_modules_started():
                return
            time.sleep(0.25)
        raise TimeoutError(f"kubelet not healthy after {timeout:.0f}s; log {self.log_path}:\n" + self.log_tail())

    def healthy(self) -> bool:
        """GET /healthz inside the kubelet's network namespace."""
        done = subprocess.run(["nsenter", f"--net=/proc/{self.pid}/ns/net", "curl", "-sf", "--max-time", "1",
                               f"http://127.0.0.1:{self.healthz_port}/healthz"],
                              check=False, capture_output=True, text=True)
        return done.returncode == 0 and done.stdout.strip() == "ok"

    def runtime_modules_started(self) -> bool:
        """/healthz answers before the kubelet's runtime-dependent modules (cAdvisor, the container
        manager, eviction) have started; until then its sync loop skips every pod ("container
        runtime status check may not have completed yet"), which took 10 s in one run here. The
        eviction manager is the last of them to start (kubelet.go initializeRuntimeDependentModules)
        and says so at the default verbosity."""
        try:
            return READY_LINE in self.log_path.read_text(errors="replace")
        except OSError:
            return False

    def tunables_written(self) -> dict[str, str]:
        """What the kubelet set in its shadowed /proc/sys files (it would have set the host's)."""
        return tunables_written(self.tunables)

    def stop(self) -> None:
        stop_process(self.proc)

    def cleanup(self) -> list[Path]:
        """After stop() and once the runtime is empty: the cgroup root (returns what is left)."""
        left = remove_cgroup_root(self.cgroup_root)
        shutil.rmtree(self.dir / "root" / "pods", ignore_errors=True)
        return left

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; nothing if it is gone."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def binary_path() -> Path | None:
    """The cached kubelet binary, or None when it is not built (the default run then has no peer)."""
    from controlplane import build as cpbuild

    return cpbuild.binary("kubelet") if cpbuild.is_built("kubelet") else None

