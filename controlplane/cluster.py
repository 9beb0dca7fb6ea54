"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, built by controlplane.build.

    cp = ControlPlane(base_dir)
    cp.start()                       # certificates, etcd, apiserver, /readyz, controllers
    cp.kubeconfig_admin              # Path: O=system:masters client certificate
    cp.node_kubeconfig("node-a")     # Path: CN=system:node:node-a, O=system:nodes
    cp.kubectl("get", "nodes")       # runs the built kubectl with the admin kubeconfig
    cp.stop_component("kube-apiserver"); cp.start_component("kube-apiserver")
    cp.stop()

Layout of base_dir: pki/ (certificates, keys), kubeconfigs/, etcd-data/,
logs/<component>.log, config.json (ports and settings, reused by a restart
on the same directory), state.json (pids, for `python -m controlplane down`).
Everything listens on 127.0.0.1 only, on ports chosen free at the first start.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Self

from controlplane import build as _build
from controlplane.pki import PKI, KeyPair, write_kubeconfig

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
LOOPBACK = "127.0.0.1"
DEFAULT_SERVICE_CIDR = "10.0.0.0/24"
DEFAULT_SERVICE_IP = "10.0.0.1"  # first address of the range: the `kubernetes` Service
DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
BOOTSTRAP_GROUP = "system:bootstrappers:kubeadm:default-node-token"
"""The group kubeadm's bootstrap tokens authenticate into (auth-extra-groups)."""


def _binding(name: str, role: str, kind: str, subject: str) -> dict[str, object]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}]}


# kubeadm's ClusterRoleBindings for the nodes (kubeadm init, phases bootstrap-token and certs):
# the API server's own client may use every kubelet endpoint; a bootstrap token may ask for a
# node client certificate, which the controller-manager then approves (nodeclient), and a node
# may renew its own (selfnodeclient).
BOOTSTRAP_BINDINGS = (
    _binding("kubeadm:apiserver-kubelet-client", "system:kubelet-api-admin", "User", KUBELET_CLIENT_USER),
    _binding("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", "Group", BOOTSTRAP_GROUP),
    _binding("kubeadm:node-autoapprove-bootstrap",
             "system:certificates.k8s.io:certificatesigningrequests:nodeclient", "Group", BOOTSTRAP_GROUP),
    _binding("kubeadm:node-autoapprove-certificate-rotation",
             "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "Group", "system:nodes"),
)
# Gang scheduling (KEP-4671) as v1.37.2 ships it: Workload and PodGroup are scheduling.k8s.io/v1beta1,
# a beta API that is off by default, and one gate, GenericWorkload (Beta, default false; the
# GangScheduling and WorkloadAwarePreemption gates are gone), switches on the API storage and the
# pod's spec.schedulingGroup (kube-apiserver), the GangScheduling plugin (kube-scheduler) and the
# podgroup-protection controller that lifts the PodGroup's finalizer (kube-controller-manager).
GANG_FEATURE_GATES = "GenericWorkload=true"
GANG_RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"


class ControlPlaneError(RuntimeError):
    pass


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL the child when the process that started it dies (Linux)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Config:
    """What stays fixed across restarts of one base_dir."""
    etcd_port: int = 0
    etcd_peer_port: int = 0
    apiserver_port: int = 0
    controller_manager_port: int = 0
    scheduler_port: int = 0
    service_cidr: str = DEFAULT_SERVICE_CIDR
    service_ip: str = DEFAULT_SERVICE_IP
    issuer: str = DEFAULT_ISSUER
    gang_scheduling: bool = True
    """The Workload/PodGroup API and the scheduler's gang scheduling (GANG_FEATURE_GATES)."""
    extra_args: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def load_or_new(cls, path: Path, **overrides: object) -> Config:
        cfg = cls(**json.loads(path.read_text())) if path.exists() else cls()
        for k, v in overrides.items():
            if v is not None:
                setattr(cfg, k, v)
        for name in ("etcd_port", "etcd_peer_port", "apiserver_port",
                     "controller_manager_port", "scheduler_port"):
            if not getattr(cfg, name):
                setattr(cfg, name, free_port())
        path.write_text(json.dumps(asdict(cfg), indent=2) + "\n")
        return cfg


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback."""

    def __init__(self, base_dir: str | os.PathLike[str], *,
                 bin_dir: str | os.PathLike[str] | None = None,
                 service_cidr: str | None = None,
                 extra_args: dict[str, list[str]] | None = None,
                 die_with_parent: bool = True,
                 build: bool = True) -> None:
        """`extra_args`: {component: [flag, ...]} appended after ours (later wins).

        `build`: build missing binaries with controlplane.build on start()
        (minutes when cold); with False, start() fails if one is missing.
        `die_with_parent`: children get SIGKILL if this process dies (tests);
        the CLI's `up` turns it off so the control plane outlives it.
        """
        self.base_dir = Path(base_dir).resolve()
        self.bin_dir = Path(bin_dir) if bin_dir else _build.bin_dir()
        self.log_dir = self.base_dir / "logs"
        self.kubeconfig_dir = self.base_dir / "kubeconfigs"
        self._service_cidr = service_cidr
        self._extra_args = extra_args
        self._die_with_parent = die_with_parent
        self._build = build
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._pki: PKI | None = None
        self.config: Config | None = None

    # -- public surface ------------------------------------------------------------

    @property
    def server_url(self) -> str:
        return f"https://{LOOPBACK}:{self._cfg.apiserver_port}"

    @property
    def kubeconfig_admin(self) -> Path:
        return self.kubeconfig_dir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        """The CA that signed the API server's serving cert and every client cert."""
        return self.base_dir / "pki" / "ca.crt"

    @property
    def etcd_url(self) -> str:
        return f"https://{LOOPBACK}:{self._cfg.etcd_port}"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    def log_file(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    def node_kubeconfig(self, node_name: str) -> Path:
        """A kubeconfig for node `node_name` (CN=system:node:<name>, O=system:nodes).

        The Node authorizer and NodeRestriction admission recognise it as that
        node: it may create and update its own Node and Lease only.
        """
        path = self.kubeconfig_dir / f"node-{node_name}.kubeconfig"
        if not path.exists():
            pair = self.pki.issue(f"node-{node_name}", f"system:node:{node_name}",
                                  orgs=("system:nodes",), client=True)
            write_kubeconfig(path, server=self.server_url, ca=self.ca_file, client=pair,
                             user=f"system:node:{node_name}")
        return path

    def client_kubeconfig(self, name: str, cn: str, orgs: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for any user/groups (e.g. to test RBAC)."""
        path = self.kubeconfig_dir / f"{name}.kubeconfig"
        if not path.exists():
            pair = self.pki.issue(f"user-{name}", cn, orgs=orgs, client=True)
            write_kubeconfig(path, server=self.server_url, ca=self.ca_file, client=pair, user=cn)
        return path

    def bootstrap_kubeconfig(self, name: str = "bootstrap-kubelet", *, token_id: str | None = None,
                             ttl_seconds: float = 24 * 3600.0) -> Path:
        """A bootstrap token (the Secret kubeadm's ``token create`` makes, in kube-system) and a
        kubeconfig that authenticates with it, as ``kubeadm join`` writes
        /etc/kubernetes/bootstrap-kubelet.conf (user ``tls-bootstrap-token-user``)."""
        import secrets as _secrets
        import string

        alphabet = string.ascii_lowercase + string.digits
        token_id = token_id or "".join(_secrets.choice(alphabet) for _ in range(6))
        token_secret = "".join(_secrets.choice(alphabet) for _ in range(16))
        expiration = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + ttl_seconds))
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
                  "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
                  "stringData": {"token-id": token_id, "token-secret": token_secret, "expiration": expiration,
                                 "description": "The default bootstrap token generated by 'kubeadm init'.",
                                 "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
                                 "auth-extra-groups": BOOTSTRAP_GROUP}}
        self.kubectl("apply", "-f", "-", input=json.dumps(secret))
        path = self.kubeconfig_dir / f"{name}.kubeconfig"
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "kubernetes", "cluster": {
                "server": self.server_url,
                "certificate-authority-data": base64.b64encode(self.ca_file.read_bytes()).decode()}}],
            "users": [{"name": "tls-bootstrap-token-user", "user": {"token": f"{token_id}.{token_secret}"}}],
            "contexts": [{"name": "tls-bootstrap-token-user@kubernetes",
                          "context": {"cluster": "kubernetes", "user": "tls-bootstrap-token-user"}}],
            "current-context": "tls-bootstrap-token-user@kubernetes",
        }
        path.write_text(json.dumps(config, indent=2) + "\n")
        os.chmod(path, 0o600)
        return path

    @property
    def apiserver_kubelet_client(self) -> KeyPair:
        """The client certificate the API server presents to kubelets (logs, exec): CN
        kube-apiserver-kubelet-client and no group, as kubeadm makes it; the kubelet API lets
        it in through the ClusterRoleBinding `kubeadm:apiserver-kubelet-client` (start())."""
        return self.pki.issue("apiserver-kubelet-client", KUBELET_CLIENT_USER, client=True)

    def kubectl(self, *args: str, kubeconfig: str | os.PathLike[str] | None = None,
                input: str | bytes | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (admin kubeconfig unless given); text output."""
        cmd = [str(self.binary("kubectl")), "--kubeconfig",
               str(kubeconfig or self.kubeconfig_admin), *args]
        if isinstance(input, bytes):
            input = input.decode()
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"{' '.join(cmd[3:])} failed ({proc.returncode}): "
                                    f"{proc.stderr.strip()}")
        return proc

    # -- lifecycle -----------------------------------------------------------------

    def start(self, timeout: float = 120.0, *, wait_for_controllers: bool = True) -> None:
        """Generate what is missing, start every component, wait until ready.

        Ready means: /readyz of the API server is ok, the controller-manager's
        and scheduler's /healthz are ok, and (wait_for_controllers) the
        `default` ServiceAccount and `kube-root-ca.crt` ConfigMap exist in
        namespace default, so that pods can be created right away.
        """
        deadline = time.monotonic() + timeout
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.kubeconfig_dir.mkdir(exist_ok=True)
        if self._build:
            _build.build(["kube-apiserver", "kube-controller-manager", "kube-scheduler",
                          "kubectl", "etcd"])
            # The build may take minutes when cold; it has its own clock.
            deadline = time.monotonic() + timeout
        missing = [c for c in (*COMPONENTS, "kubectl") if not os.access(self.binary(c), os.X_OK)]
        if missing:
            raise ControlPlaneError(f"not built: {', '.join(missing)} in {self.bin_dir} "
                                    "(run `python -m controlplane build`)")
        self.config = Config.load_or_new(self.base_dir / "config.json",
                                         service_cidr=self._service_cidr,
                                         extra_args=self._extra_args)
        self._prepare_pki()
        try:
            for name in COMPONENTS:
                self.start_component(name, deadline=deadline)
                if name == "kube-apiserver":
                    self._bootstrap_rbac(deadline)
            if wait_for_controllers:
                self._wait_defaults(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every component this object started, in reverse order."""
        for name in reversed(COMPONENTS):
            self.stop_component(name, timeout=timeout)
        self._write_state()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self) -> dict[str, int]:
        """The running components' process IDs, by name (etcd, kube-apiserver, ...)."""
        return {n: p.pid for n, p in self._procs.items() if p.poll() is None}

    def running(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.poll() is None

    def start_component(self, name: str, *, deadline: float | None = None) -> None:
        """(Re)start one component on its fixed port and wait for its health check."""
        if self.running(name):
            return
        deadline = deadline or time.monotonic() + 60
        port = self._component_port(name)
        if _port_in_use(port):
            raise ControlPlaneError(f"{name}: port {LOOPBACK}:{port} is already in use "
                                    f"(another control plane on {self.base_dir}?)")
        argv = [str(self.binary(name)), *self._args(name),
                *self._cfg.extra_args.get(name, [])]
        with open(self.log_file(name), "ab") as log:
            log.write(f"\n==== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
            log.flush()
            # preexec_fn only calls prctl(2): safe enough even with threads around.
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.base_dir, start_new_session=True,
                # PR_SET_PDEATHSIG fires when the spawning *thread* exits: from a worker thread
                # (anyio.to_thread) the component would die when that idle thread is reaped.
                preexec_fn=_die_with_parent if self._die_with_parent
                and threading.current_thread() is threading.main_thread() else None)  # noqa: PLW1509
        self._write_state()
        self._wait_healthy(name, deadline)

    def stop_component(self, name: str, timeout: float = 15.0) -> None:
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._write_state()

    # -- internals -----------------------------------------------------------------

    @property
    def _cfg(self) -> Config:
        if self.config is None:
            path = self.base_dir / "config.json"
            if not path.exists():
                raise ControlPlaneError("not started: no config.json in " + str(self.base_dir))
            self.config = Config(**json.loads(path.read_text()))
        return self.config

    @property
    def pki(self) -> PKI:
        if self._pki is None:
            self._pki = PKI(self.base_dir / "pki")
        return self._pki

    def _component_port(self, name: str) -> int:
        c = self._cfg
        return {"etcd": c.etcd_port, "kube-apiserver": c.apiserver_port,
                "kube-controller-manager": c.controller_manager_port,
                "kube-scheduler": c.scheduler_port}[name]

    def _prepare_pki(self) -> None:
        pki = self.pki
        pki.service_account_keys()
        pki.issue("apiserver", "kube-apiserver", server=True,
                  sans=[LOOPBACK, "localhost", self._cfg.service_ip, "kubernetes",
                        "kubernetes.default", "kubernetes.default.svc",
                        "kubernetes.default.svc.cluster.local"])
        pki.issue("etcd-server", "etcd-server", server=True, client=True,
                  sans=[LOOPBACK, "localhost"])
        pki.issue("apiserver-etcd-client", "kube-apiserver-etcd-client", client=True)
        _ = self.apiserver_kubelet_client
        pki.issue("front-proxy-client", "front-proxy-client", client=True,
                  ca=pki.front_proxy_ca)
        users = {
            "admin": ("kubernetes-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
        }
        for name, (cn, orgs) in users.items():
            pair = pki.issue(name, cn, orgs=orgs, client=True)
            write_kubeconfig(self.kubeconfig_dir / f"{name}.kubeconfig", server=self.server_url,
                             ca=self.ca_file, client=pair, user=cn)

    def _args(self, name: str) -> list[str]:
        c, p = self._cfg, self.base_dir / "pki"
        kc = self.kubeconfig_dir
        if name == "etcd":
            return [
                "--name=nodeagent-etcd",
                f"--data-dir={self.base_dir / 'etcd-data'}",
                f"--listen-client-urls=https://{LOOPBACK}:{c.etcd_port}",
                f"--advertise-client-urls=https://{LOOPBACK}:{c.etcd_port}",
                f"--listen-peer-urls=http://{LOOPBACK}:{c.etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://{LOOPBACK}:{c.etcd_peer_port}",
                f"--initial-cluster=nodeagent-etcd=http://{LOOPBACK}:{c.etcd_peer_port}",
                "--initial-cluster-state=new",
                f"--cert-file={p / 'etcd-server.crt'}", f"--key-file={p / 'etcd-server.key'}",
                "--client-cert-auth=true", f"--trusted-ca-file={p / 'ca.crt'}",
                "--snapshot-count=10000",
                # Tests: no fsync-bound latency worth waiting for on tmpfs/overlay.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ]
        if name == "kube-apiserver":
            return [
                f"--etcd-servers=https://{LOOPBACK}:{c.etcd_port}",
                f"--etcd-cafile={p / 'ca.crt'}",
                f"--etcd-certfile={p / 'apiserver-etcd-client.crt'}",
                f"--etcd-keyfile={p / 'apiserver-etcd-client.key'}",
                f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}",
                # The lease/master-count reconcilers refuse a loopback address for
                # the `kubernetes` Service's endpoints; nothing routes to it anyway
                # (no kube-proxy), so the Service exists without endpoints.
                "--endpoint-reconciler-type=none",
                f"--secure-port={c.apiserver_port}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                "--enable-bootstrap-token-auth=true",  # as kubeadm: nodes join with a bootstrap token
                "--enable-admission-plugins=NodeRestriction",
                f"--service-account-issuer={c.issuer}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                f"--service-cluster-ip-range={c.service_cidr}",
                "--allow-privileged=true",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP",
                f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-username-headers=X-Remote-User",
                f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
                # Aggregated APIs (metrics-server) reached at their endpoints: no kube-proxy here.
                "--enable-aggregator-routing=true",
                "--profiling=false",
                # A graceful stop in ~2-3 s instead of up to --request-timeout (60 s)
                # spent waiting for the controllers' open watches to end.
                "--shutdown-send-retry-after=true",
                "--shutdown-watch-termination-grace-period=2s",
                *([f"--feature-gates={GANG_FEATURE_GATES}", f"--runtime-config={GANG_RUNTIME_CONFIG}"]
                  if c.gang_scheduling else []),
            ]
        common = [
            f"--bind-address={LOOPBACK}",
            "--leader-elect=false",
            "--profiling=false",
            *([f"--feature-gates={GANG_FEATURE_GATES}"] if c.gang_scheduling else []),
        ]
        if name == "kube-controller-manager":
            k = kc / "controller-manager.kubeconfig"
            return [
                *common,
                f"--secure-port={c.controller_manager_port}",
                f"--kubeconfig={k}", f"--authentication-kubeconfig={k}",
                f"--authorization-kubeconfig={k}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--service-account-private-key-file={p / 'sa.key'}",
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}",
                f"--service-cluster-ip-range={c.service_cidr}",
                "--controllers=*,bootstrapsigner,tokencleaner",
            ]
        if name == "kube-scheduler":
            k = kc / "scheduler.kubeconfig"
            return [
                *common,
                f"--secure-port={c.scheduler_port}",
                f"--kubeconfig={k}", f"--authentication-kubeconfig={k}",
                f"--authorization-kubeconfig={k}",
            ]
        raise ValueError(name)

    # -- readiness -------------------------------------------------------------------

    def _ssl_context(self, client: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if client:
            ctx.load_cert_chain(str(self.base_dir / "pki" / "admin.crt"),
                                str(self.base_dir / "pki" / "admin.key"))
        return ctx

    def _probe(self, name: str) -> tuple[bool, str]:
        port = self._component_port(name)
        if name == "etcd":
            url, ctx = f"https://{LOOPBACK}:{port}/health", ssl.create_default_context(
                cafile=str(self.ca_file))
            ctx.load_cert_chain(str(self.base_dir / "pki" / "apiserver-etcd-client.crt"),
                                str(self.base_dir / "pki" / "apiserver-etcd-client.key"))
        elif name == "kube-apiserver":
            url, ctx = f"https://{LOOPBACK}:{port}/readyz", self._ssl_context(client=True)
        else:
            # Self-signed serving certs (generated by the component): no verification;
            # /healthz is readable anonymously (--authorization-always-allow-paths).
            url = f"https://{LOOPBACK}:{port}/healthz"
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
                body = resp.read().decode(errors="replace")
                if name == "etcd":
                    return json.loads(body).get("health") == "true", body
                return resp.status == 200 and body.strip() == "ok", body
        except urllib.error.HTTPError as e:
            return False, f"HTTP {e.code}: {e.read().decode(errors='replace')[-2000:]}"
        except (OSError, ValueError) as e:
            return False, repr(e)

    def _wait_healthy(self, name: str, deadline: float) -> None:
        last = ""
        while True:
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise ControlPlaneError(f"{name} exited ({code}); log tail:\n"
                                        + self._tail(name))
            ok, last = self._probe(name)
            if ok:
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{name} not healthy in time; last probe: {last}\n"
                                        "log tail:\n" + self._tail(name))
            time.sleep(0.25)

    def _bootstrap_rbac(self, deadline: float) -> None:
        """Create what kubeadm's init creates for the nodes (idempotent: 409 is fine)."""
        ctx = self._ssl_context(client=True)
        url = self.server_url + "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
        for binding in BOOTSTRAP_BINDINGS:
            request = urllib.request.Request(url, data=json.dumps(binding).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            while True:
                try:
                    with urllib.request.urlopen(request, context=ctx, timeout=5):
                        break
                except urllib.error.HTTPError as e:
                    if e.code == 409:
                        break
                    last = f"HTTP {e.code}: {e.read().decode(errors='replace')[-500:]}"
                except OSError as e:
                    last = repr(e)
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"cannot create ClusterRoleBinding {binding['metadata']['name']}: {last}")
                time.sleep(0.25)

    def wait_namespace_ready(self, namespace: str, timeout: float = 60.0) -> None:
        """Until the controller-manager gave ``namespace`` its default ServiceAccount and its
        kube-root-ca.crt ConfigMap: a pod created before that is refused (serviceaccount
        "default" not found), and the wait can take seconds on a loaded machine."""
        self._wait_defaults(time.monotonic() + timeout, namespace)

    def _wait_defaults(self, deadline: float, namespace: str = "default") -> None:
        ctx = self._ssl_context(client=True)
        for path in (f"/api/v1/namespaces/{namespace}/serviceaccounts/default",
                     f"/api/v1/namespaces/{namespace}/configmaps/kube-root-ca.crt"):
            while True:
                try:
                    with urllib.request.urlopen(self.server_url + path, context=ctx,
                                                timeout=5):
                        break
                except (urllib.error.HTTPError, OSError) as e:
                    if time.monotonic() > deadline:
                        raise ControlPlaneError(f"{path} not there in time ({e}); "
                                                "controller-manager log tail:\n"
                                                + self._tail("kube-controller-manager")) from e
                for name in COMPONENTS:
                    if not self.running(name):
                        raise ControlPlaneError(f"{name} exited; log tail:\n" + self._tail(name))
                time.sleep(0.25)

    def _tail(self, name: str, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _write_state(self) -> None:
        state = {"pids": self.pids(),
                 "server_url": self.server_url if self.config else None,
                 "kubeconfig_admin": str(self.kubeconfig_admin)}
        path = self.base_dir / "state.json"
        if self.base_dir.exists():
            path.write_text(json.dumps(state, indent=2) + "\n")


def stop_from_state(base_dir: str | os.PathLike[str], timeout: float = 15.0) -> list[str]:
    """Stop the components recorded in base_dir/state.json (for `down` from another process).

    Only pids whose command line is the component binary recorded there are
    signalled, so a stale state file never kills an unrelated process.
    """
    base = Path(base_dir)
    path = base / "state.json"
    if not path.exists():
        return []
    pids: dict[str, int] = json.loads(path.read_text()).get("pids", {})
    stopped = []
    for name in reversed(COMPONENTS):
        pid = pids.get(name)
        if not pid or not _is_component(pid, name):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        end = time.monotonic() + timeout
        while time.monotonic() < end and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        stopped.append(name)
    path.write_text(json.dumps({"pids": {}}, indent=2) + "\n")
    return stopped


def _alive(pid: int) -> bool:
    try:
        # A zombie still "exists": read its state.
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False


def _is_component(pid: int, name: str) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return Path(argv0).name == name


def probe_running(base_dir: str | os.PathLike[str]) -> bool:
    """True if the control plane of base_dir answers /readyz."""
    cp = ControlPlane(base_dir, build=False)
    try:
        return cp._probe("kube-apiserver")[0]
    except (ControlPlaneError, OSError, ssl.SSLError):
        return False


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: python -m controlplane up|down|build")
