"""A private containerd for tests, CI and the demo.

Everything an instance owns lives under one base directory: root, state,
socket, config, CNI config and IPAM data, runc state, log and pid file.
Several instances (a test session next to `make env`) can therefore run at
once; what containerd keeps in global places is either redirected here
(netns mounts, runc root, host-local dataDir), switched off (2.x's NRI
socket) or made unique by name (bridge, CNI network) and removed on stop.

Which containerd runs is devenv.runtime's choice ($NODEAGENT_RUNTIME:
containerd 2.x by default, Debian's 1.6 for compatibility); each gets its
native config (version 3 for 2.x, version 2 for 1.6) with the same settings.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import grpc

from devenv import hostclean
from devenv.images import PAUSE_IMAGE, ImageArchive, build_images
from devenv.packages import CRUN
from devenv.rawcri import RawCRI
from devenv.runtime import Runtime, selected

NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin works in
DEFAULT_SUBNET = "10.88.0.0/16"  # the subnet of DEFAULT_DIR's environment
# Short and under /tmp: the socket path must stay below 108 bytes.
DEFAULT_DIR = Path("/tmp/nodeagent-devenv")
CONFLIST = "10-nodeagent.conflist"
START_TIMEOUT = 30.0
# containerd also listens on SOCKET.ttrpc; a unix socket path has < 108 bytes.
_MAX_SOCKET = 107 - len(".ttrpc")
_BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Names the runtime that last used a base dir (see Containerd._claim_base_dir).
RUNTIME_MARKER = "runtime"
# The crun handler runs Debian 12's crun 1.8.1 through this wrapper, for two refusals of
# that crun on these machines, neither of which concerns what it would run:
# - hybrid cgroups: crun refuses to start anything while /sys/fs/cgroup/unified lists a
#   controller ("cgroups in hybrid mode not supported, drop all controllers from
#   cgroupv2"; here hugetlb, which no v1 hierarchy binds), even with its cgroup manager
#   disabled. The wrapper runs crun in a mount namespace of its own (a slave of the host's,
#   so mounts still propagate in) without the unified mount: crun then sees plain cgroup
#   v1, as runc uses it here. The host's mounts are untouched.
# - the OCI spec version: crun 1.8.1 accepts only an ociVersion containing "1.0" ("unknown
#   version specified"); containerd 2.4 writes 1.3.0, for sandboxes too (base_runtime_spec
#   does not reach them). A create's bundle is declared 1.1.0: the spec fields CRI fills
#   for our pods are all 1.1 ones. containerd 1.6 writes 1.0.2-dev, left alone.
# Every crun command goes through it; drop it with a crun that knows both.
_CRUN_WRAPPER = """#!/bin/sh
# written by devenv (devenv/containerd.py, _CRUN_WRAPPER): Debian's crun on these machines
if [ -z "$NODEAGENT_CRUN_MOUNTNS" ]; then
    controllers=
    read -r controllers < /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null
    if [ -n "$controllers" ]; then
        NODEAGENT_CRUN_MOUNTNS=1 exec unshare --mount --propagation slave "$0" "$@"
    fi
else
    umount -l /sys/fs/cgroup/unified || exit 1
    unset NODEAGENT_CRUN_MOUNTNS
fi
bundle= prev=
for arg in "$@"; do
    case $prev in --bundle|-b) bundle=$arg ;; esac
    case $arg in --bundle=*) bundle=${arg#--bundle=} ;; esac
    prev=$arg
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    sed -i 's/^{"ociVersion":"1\\.[1-9][^"]*"/{"ociVersion":"1.1.0"/' "$bundle/config.json"
fi
exec @CRUN@ "$@"
"""
# Snapshotters that cannot work here only add errors to the log (aufs is gone in 2.x,
# btrfs is compiled out of our 2.x build).
_DISABLED_SNAPSHOTTERS = {
    2: ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
        "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"],
    3: ["io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"],
}


def derived_subnet(base_dir: str | os.PathLike[str]) -> str:
    """A /16 in 10.100.0.0-10.199.255.255 chosen by base dir, for environments
    (test sessions) that run next to the one on DEFAULT_SUBNET (`devenv up`).

    Subnets routed on this host (an environment with pods) or configured by
    another running devenv containerd (maybe idle, so without a route yet)
    are skipped.
    """
    digest = hashlib.sha256(str(Path(base_dir).absolute()).encode()).digest()
    used = _routed_networks() + _running_env_networks()
    for i in range(100):
        candidate = ipaddress.ip_network(f"10.{100 + (digest[0] + i) % 100}.0.0/16")
        if not any(candidate.overlaps(net) for net in used):
            return str(candidate)
    return str(candidate)


def _routed_networks() -> list[ipaddress.IPv4Network]:
    try:
        out = subprocess.run(["ip", "-j", "-4", "route"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    nets = []
    for route in json.loads(out or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            nets.append(ipaddress.IPv4Network(dst, strict=False))
    return nets


def _running_env_networks() -> list[ipaddress.IPv4Network]:
    """Subnets of the devenv containerds running on this host (found by their
    `--config BASE/config.toml` argument)."""
    nets = []
    for entry in os.listdir("/proc"):
        argv = hostclean.pid_cmdline(int(entry)) if entry.isdigit() else []
        if len(argv) == 3 and os.path.basename(argv[0]) == "containerd" \
                and argv[1] == "--config":
            conflist = Path(argv[2]).parent / "cni" / "net.d" / CONFLIST
            try:
                ranges = json.loads(conflist.read_text())["plugins"][0]["ipam"]["ranges"]
                nets.append(ipaddress.IPv4Network(ranges[0][0]["subnet"]))
            except (OSError, ValueError, LookupError):
                continue
    return nets


def _toml(value: object) -> str:
    # JSON strings, booleans, numbers and arrays of them are valid TOML.
    return json.dumps(value)


class Containerd:
    """One private containerd daemon with the CRI plugin, bridge CNI and our images."""

    def __init__(self, base_dir: str | os.PathLike[str], *, subnet: str | None = None,
                 start_timeout: float = START_TIMEOUT, runtime: Runtime | None = None,
                 registry_mirrors: Mapping[str, str] | None = None) -> None:
        """`subnet` None means: the one in an existing config under base_dir, else
        DEFAULT_SUBNET for DEFAULT_DIR, else one derived from base_dir (so that
        a test session and the demo never share a subnet). `runtime` None means
        the one $NODEAGENT_RUNTIME selects (devenv.runtime.selected()).
        `registry_mirrors` maps a registry host (registry.k8s.io) to a plain-HTTP
        mirror on loopback (host:port, devenv.registry) that containerd asks first."""
        self.base_dir = Path(base_dir).absolute()
        self.runtime = runtime or selected()
        self.registry_mirrors = dict(registry_mirrors or {})
        self.subnet = str(ipaddress.ip_network(subnet or self._default_subnet()))
        self.start_timeout = start_timeout
        if len(self.socket_path) > _MAX_SOCKET:
            raise ValueError(f"socket path too long for a unix socket: {self.socket_path}")
        tag = hashlib.sha256(str(self.base_dir).encode()).hexdigest()[:8]
        self.bridge_name = "na" + tag  # interface names are at most 15 chars
        self.network_name = "nodeagent-" + tag
        self._proc: subprocess.Popen[bytes] | None = None
        # More runtime handler names for runc (set before start(); written into the config).
        self.extra_runc_handlers: tuple[str, ...] = ()

    # --- paths -------------------------------------------------------------

    @property
    def root_dir(self) -> Path:
        return self.base_dir / "root"

    @property
    def state_dir(self) -> Path:
        return self.base_dir / "state"

    @property
    def config_path(self) -> Path:
        return self.base_dir / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base_dir / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.base_dir / "cni" / "ipam"

    @property
    def runc_root(self) -> Path:
        return self.base_dir / "runc"

    @property
    def cdi_spec_dir(self) -> Path:
        """Where this runtime reads CDI specs: a DRA driver writes there and the agent's
        cdiSpecDirs names it, as on a node where both use /etc/cdi and /var/run/cdi.
        containerd 2.x resolves CDI_devices from it; for 1.6 the agent reads it itself."""
        return self.base_dir / "cdi"

    @property
    def crun_root(self) -> Path:
        return self.base_dir / "crun"

    @property
    def crun_wrapper(self) -> Path:
        """What the crun handler runs (see _CRUN_WRAPPER)."""
        return self.base_dir / "bin" / "crun"

    @property
    def registry_config_dir(self) -> Path:
        """containerd's registry host configs: <host>/hosts.toml (its config_path)."""
        return self.base_dir / "certs.d"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "containerd.log"

    @property
    def pid_path(self) -> Path:
        return self.base_dir / "containerd.pid"

    @property
    def socket_path(self) -> str:
        return str(self.base_dir / "containerd.sock")

    @property
    def endpoint(self) -> str:
        return "unix://" + self.socket_path

    # --- configuration -----------------------------------------------------

    def _default_subnet(self) -> str:
        try:
            conflist = json.loads((self.cni_conf_dir / CONFLIST).read_text())
            subnet: str = conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
            return subnet
        except (OSError, ValueError, LookupError):
            pass
        if self.base_dir == DEFAULT_DIR:
            return DEFAULT_SUBNET
        return derived_subnet(self.base_dir)

    def config_text(self) -> str:
        """containerd's config: the defaults, plus what a private instance needs,
        in the schema of the runtime's version."""
        lines = [
            f"version = {self.runtime.config_version}",
            f"root = {_toml(str(self.root_dir))}",
            f"state = {_toml(str(self.state_dir))}",
            "disabled_plugins = " + _toml(_DISABLED_SNAPSHOTTERS[self.runtime.config_version]),
            "",
            "[grpc]",
            f"  address = {_toml(self.socket_path)}",
            "",
        ]
        # 2.x: version 3 is native to every 2.x; 2.3+ also know a version 4 (the
        # [grpc] listener becomes a server plugin) and migrate 3 at start-up.
        if self.runtime.config_version == 3:
            lines += self._cri_config_v3()
        else:
            lines += self._cri_config_v2()
        lines += [
            "",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_toml(str(self.base_dir / 'opt'))}",  # not /opt/containerd
            "",
        ]
        return "\n".join(lines)

    # Both schemas carry the same settings; why each is there is said once, here:
    # - sandbox image: our locally built pause (no registry can be reached);
    # - restrict_oom_score_adj: these machines lack CAP_SYS_RESOURCE; without it
    #   every sandbox fails ("can't get final child's PID from pipe: EOF");
    # - netns_mounts_under_state_dir: otherwise netns files go to the global /var/run/netns;
    # - stream server on loopback, any port;
    # - stats_collect_period 1 s: ImageFsInfo comes from a snapshot-usage sweep
    #   (default every 10 s); a fresh daemon reports 0 bytes until the first one,
    #   which tests would have to outwait;
    # - CNI: Debian's plugins in /usr/lib/cni (not /opt/cni/bin), our private conf dir;
    # - runtime handlers runc (default) and crun (RuntimeClass tests), each with a
    #   private state root so that stop() can find and kill exactly our containers,
    #   even after the shims are gone; on 2.x runc is our build (devenv.runtime:
    #   user namespaces need runc >= 1.2), on 1.6 Debian's.

    def _runtime_handlers(self, prefix: str) -> list[str]:
        runtimes = f"{prefix}.containerd.runtimes"
        lines = []
        runc = str(self.runtime.runc) if self.runtime.runc is not None else None
        # Extra names run by runc (one state root: a handler is only a name for the runtime):
        # the node e2e suite's RuntimeClass specs expect upstream CI's "test-handler".
        extra = tuple((name, runc, self.runc_root) for name in self.extra_runc_handlers)
        for handler, binary, root in (("runc", runc, self.runc_root),
                                      ("crun", str(self.crun_wrapper), self.crun_root), *extra):
            lines += [
                "",
                f"[{runtimes}.{handler}]",
                '  runtime_type = "io.containerd.runc.v2"',
            ]
            if self.runtime.bin_dir is not None:
                # 2.x: our shim, by path, never a containerd-shim-runc-v2 found on PATH
                shim = self.runtime.command("containerd-shim-runc-v2")
                lines.append(f"  runtime_path = {_toml(shim)}")
            lines.append(f"[{runtimes}.{handler}.options]")
            if binary:
                lines.append(f"  BinaryName = {_toml(binary)}")
            lines.append(f"  Root = {_toml(str(root))}")
        return lines

    def _registry_config(self, section: str) -> list[str]:
        """config_path (both schemas) when there are mirrors: per registry host a hosts.toml
        whose mirror is tried first; a 404 there falls back to the registry itself."""
        if not self.registry_mirrors:
            return []
        return [f"[{section}.registry]", f"  config_path = {_toml(str(self.registry_config_dir))}", ""]

    def registry_hosts_toml(self, host: str) -> str:
        mirror = self.registry_mirrors[host]
        return "\n".join([f"server = {_toml('https://' + host)}", "",
                          f"[host.{_toml('http://' + mirror)}]",
                          '  capabilities = ["pull", "resolve"]', ""])

    def _cri_config_v2(self) -> list[str]:
        """containerd 1.6: everything CRI in plugins."io.containerd.grpc.v1.cri"."""
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return [
            f"[{cri}]",
            f"  sandbox_image = {_toml(PAUSE_IMAGE)}",
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "  stats_collect_period = 1",
            "",
            *self._registry_config(cri),
            f"[{cri}.cni]",
            '  bin_dir = "/usr/lib/cni"',
            f"  conf_dir = {_toml(str(self.cni_conf_dir))}",
            "  max_conf_num = 1",
            "",
            f"[{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            *self._runtime_handlers(cri),
        ]

    def _cri_config_v3(self) -> list[str]:
        """containerd 2.x: CRI split into images, runtime and the gRPC server."""
        images = 'plugins."io.containerd.cri.v1.images"'
        runtime = 'plugins."io.containerd.cri.v1.runtime"'
        return [
            f"[{images}]",
            '  snapshotter = "overlayfs"',
            "  stats_collect_period = 1",  # seconds (an int here, a duration in the runtime's)
            f"[{images}.pinned_images]",
            f"  sandbox = {_toml(PAUSE_IMAGE)}",
            *self._registry_config(images),
            "",
            f"[{runtime}]",
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            # private, instead of the global /etc/cdi and /var/run/cdi
            f"  cdi_spec_dirs = {_toml([str(self.cdi_spec_dir)])}",
            "",
            f"[{runtime}.cni]",
            '  bin_dirs = ["/usr/lib/cni"]',
            f"  conf_dir = {_toml(str(self.cni_conf_dir))}",
            "  max_conf_num = 1",
            "",
            f"[{runtime}.containerd]",
            '  default_runtime_name = "runc"',
            *self._runtime_handlers(runtime),
            "",
            '[plugins."io.containerd.grpc.v1.cri"]',
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "",
            # NRI (on by default in 2.x) listens on the global /var/run/nri/nri.sock,
            # which two daemons would fight over; nodeagent uses no NRI plugin.
            '[plugins."io.containerd.nri.v1.nri"]',
            "  disable = true",
        ]

    def cni_config(self) -> dict[str, object]:
        """bridge + host-local + portmap; lo is set up by the CRI plugin itself
        (it runs /usr/lib/cni/loopback for every pod), so it is not chained here."""
        return {
            "cniVersion": "1.0.0",
            "name": self.network_name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge_name,
                    "isGateway": True,
                    # No masquerading: nothing outside this machine may be reached
                    # anyway, and it would leave NAT rules on the host.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.cni_data_dir),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def write_config(self) -> None:
        for d in (self.base_dir, self.cni_conf_dir, self.cni_data_dir, self.cdi_spec_dir):
            d.mkdir(parents=True, exist_ok=True)
        # Searchable by others, as containerd makes its own /var/lib and /run dirs (0711): a
        # user-namespaced container's root is a host ID of its own, and runc, already in that
        # namespace, must reach the bundle's rootfs under the state dir (a 0700 mkdtemp base
        # fails it with "remount-propagation ... permission denied").
        self.base_dir.chmod(0o711)
        self.config_path.write_text(self.config_text())
        conflist = self.cni_conf_dir / CONFLIST
        conflist.write_text(json.dumps(self.cni_config(), indent=2) + "\n")
        self.crun_wrapper.parent.mkdir(exist_ok=True)
        self.crun_wrapper.write_text(_CRUN_WRAPPER.replace("@CRUN@", CRUN.probe))
        self.crun_wrapper.chmod(0o755)
        for host in self.registry_mirrors:
            hosts = self.registry_config_dir / host / "hosts.toml"
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(self.registry_hosts_toml(host))

    # --- lifecycle -----------------------------------------------------------

    def pid(self) -> int | None:
        """The daemon's pid if it is running (it may have been started by another process)."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        # A stale pid file may name a reused pid: check it is our containerd.
        argv = hostclean.pid_cmdline(pid)
        if hostclean.pid_alive(pid) and str(self.config_path) in argv:
            return pid
        return None

    def is_running(self) -> bool:
        return self.pid() is not None

    def start(self) -> None:
        """Start the daemon (detached: it outlives this process) and wait for CRI.

        Does nothing but wait when it already runs, so it is idempotent.
        """
        if not self.is_running():
            self.runtime.ensure()  # containerd 2.x: built on first use (minutes, once)
            self._claim_base_dir()
            self._drop_stale_bridge()
            self.write_config()
            env = dict(os.environ)
            # containerd finds containerd-shim-runc-v2 (1.6) and runc on PATH.
            env["PATH"] = self.runtime.path_env(env.get("PATH", "") + ":" + _BASE_PATH)
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    [self.runtime.command("containerd"), "--config", str(self.config_path)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    # Own session: a Ctrl-C in the terminal of `devenv up` must not
                    # reach the daemon, which is meant to outlive the command.
                    start_new_session=True, env=env, cwd=self.base_dir,
                )
            self.pid_path.write_text(f"{self._proc.pid}\n")
        else:
            self._check_running_runtime()
        self.wait_ready()

    def _drop_stale_bridge(self) -> None:
        """A bridge of our name with another address than our subnet's gateway was left by a
        dead environment of this base dir whose config went with the dir (the name comes from
        the dir, the subnet from what was free when it was made). The bridge plugin refuses to
        reuse it ("already has an IP address different from ..."), which would fail every
        sandbox; no pod of this configuration can be on it, so it goes."""
        subnet = ipaddress.ip_network(self.subnet)
        gateway = f"{next(subnet.hosts())}/{subnet.prefixlen}"  # host-local's, as isGateway sets it
        addresses = hostclean.link_ipv4_networks(self.bridge_name)
        if addresses and gateway not in addresses:
            hostclean.delete_link(self.bridge_name)

    def _claim_base_dir(self) -> None:
        """Before a start: a base dir last used by the other runtime gets a fresh
        root and state (1.6 cannot read what 2.x migrated; 2.x would silently
        take over 1.6's pods); images are imported again by the caller."""
        marker = self.base_dir / RUNTIME_MARKER
        try:
            previous = marker.read_text().strip()
        except OSError:
            previous = ""
        if previous and previous != self.runtime.name:
            self.stop(remove_pods=False)
            shutil.rmtree(self.root_dir, ignore_errors=True)
            shutil.rmtree(self.state_dir, ignore_errors=True)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(self.runtime.name + "\n")

    def _check_running_runtime(self) -> None:
        """A daemon found running must be the selected runtime: `make env` on
        2.x followed by NODEAGENT_RUNTIME=containerd1.6 would otherwise test 2.x."""
        pid = self.pid()
        argv = hostclean.pid_cmdline(pid) if pid is not None else []
        want = self.runtime.command("containerd")  # as start() passes it
        if argv and argv[0] != want:
            raise RuntimeError(
                f"the containerd running in {self.base_dir} ({argv[0]}) is not "
                f"{self.runtime.name} ({want}); stop it first (`python -m devenv down "
                f"--dir {self.base_dir}`, or `make down` for the default dir)")

    def wait_ready(self, timeout: float | None = None) -> dict[str, str]:
        """Poll CRI's Version until it answers; return its answer.

        Each attempt uses a fresh channel: a gRPC channel that failed once
        waits out a reconnect backoff (1 s) before trying again, which would
        make every start a second slower than containerd's ~30 ms boot.
        """
        limit = timeout or self.start_timeout
        deadline = time.monotonic() + limit
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not self.is_running():
                raise RuntimeError(f"containerd exited during start-up; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            if os.path.exists(self.socket_path):
                try:
                    with RawCRI(self.socket_path) as cri:
                        return cri.version(timeout=1.0)
                except grpc.RpcError as e:
                    last = e
            time.sleep(0.02)
        raise TimeoutError(f"containerd CRI did not answer on {self.endpoint} within "
                           f"{limit:.0f}s ({last}); log {self.log_path}:\n{self.log_tail()}")

    def version(self) -> dict[str, str]:
        with RawCRI(self.socket_path) as cri:
            return cri.version()

    def _stop_daemon(self, timeout: float = 15.0) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while hostclean.pid_alive(pid) and time.monotonic() < deadline:
                if self._proc is not None:
                    self._proc.poll()  # reap our own child so it does not linger as a zombie
                time.sleep(0.05)
            if hostclean.pid_alive(pid):
                hostclean.kill_and_wait([pid])
        if self._proc is not None:
            self._proc.wait()
            self._proc = None
        self.pid_path.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop the daemon only and start it again on the same state.

        Shims and containers keep running meanwhile, as with a kubelet node
        whose containerd restarts; clients see their connection drop.
        """
        self._stop_daemon()
        self.start()

    def stop_daemon(self) -> None:
        """Stop the daemon only: shims and containers keep running, as on a node whose
        containerd is down for a while; start() brings it back on the same state."""
        self._stop_daemon()

    def stop(self, *, remove_pods: bool = True) -> None:
        """Stop the daemon and remove everything it left on the host.

        With remove_pods, pods are first stopped and removed through CRI so that
        CNI releases their network; then, whatever the daemon's state, leftover
        containers, shims, mounts, shim sockets, the bridge and CNI caches are
        removed by force. Files under base_dir (log included) stay.
        """
        if remove_pods and self.is_running():
            try:
                with RawCRI(self.socket_path) as cri:
                    cri.remove_all_pods()
            except grpc.RpcError:
                pass  # the forced cleanup below still runs
        self._stop_daemon()
        sandboxes = self.sandbox_ids()
        # with the runc that made the state (ours on 2.x: Debian's may not read a newer one's)
        hostclean.delete_runc_containers(self.runc_root, str(self.runtime.runc or "runc"))
        if self.crun_wrapper.exists():  # crun as the handler runs it (see _CRUN_WRAPPER)
            hostclean.delete_runc_containers(self.crun_root, str(self.crun_wrapper))
        shims = hostclean.shims_of(self.socket_path)
        hostclean.kill_and_wait(list(shims))
        for argv in shims.values():
            sock = hostclean.shim_socket(argv)
            if sock is not None:
                sock.unlink(missing_ok=True)
        hostclean.unmount_all(self.base_dir)
        hostclean.delete_link(self.bridge_name)
        hostclean.delete_cni_cache(self.network_name, sandboxes)

    def sandbox_ids(self) -> list[str]:
        """Ids of the pod sandboxes the CRI plugin has state for (from its state dir)."""
        d = self.state_dir / "io.containerd.grpc.v1.cri" / "sandboxes"
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def destroy(self) -> None:
        """stop(), then delete base_dir entirely."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- images --------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `ctr` against this daemon in the CRI namespace."""
        argv = [self.runtime.command("ctr"), "--address", self.socket_path,
                "--namespace", NAMESPACE, *args]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): "
                               f"{done.stderr.strip()}; containerd log {self.log_path}")
        return done

    def images(self) -> dict[str, str]:
        """Image name -> manifest (or index) digest, as `ctr images ls` shows them."""
        out = self.ctr("images", "ls").stdout.splitlines()
        result = {}
        for line in out[1:]:  # skip the header
            cols = line.split()
            if len(cols) >= 3:
                result[cols[0]] = cols[2]
        return result

    def import_images(self, archives: Iterable[ImageArchive] | None = None) -> None:
        """Import our image archives (building them if needed), skipping any
        whose names already point at the archive's exact manifest."""
        present = self.images()
        for archive in archives if archives is not None else build_images():
            digest = archive_manifest_digest(archive.path)
            if all(present.get(name) == digest for name in archive.names):
                continue
            # --snapshotter: unpack for the snapshotter the CRI plugin uses, so
            # the first container does not pay for unpacking.
            self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive.path))

    def wait_image_stats(self, timeout: float = 5.0) -> int:
        """Wait until CRI's ImageFsInfo counts the imported images; return the bytes.

        containerd computes it in a periodic sweep (stats_collect_period, 1 s
        here), so right after an import it still says 0; tests that read it
        want the settled value.
        """
        deadline = time.monotonic() + timeout
        with RawCRI(self.socket_path) as cri:
            while True:
                used = cri.image_fs_used_bytes()
                if used or time.monotonic() > deadline:
                    return used
                time.sleep(0.05)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def archive_manifest_digest(path: Path) -> str:
    """The manifest digest that an archive's index.json names (all entries share it)."""
    with tarfile.open(path) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    digest: str = index["manifests"][0]["digest"]
    return digest
