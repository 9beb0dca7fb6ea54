"""The node's client certificate: TLS bootstrap and rotation (pkg/kubelet/certificate/bootstrap).

At start, with ``--bootstrap-kubeconfig`` or ``rotateCertificates``:

1. ``--kubeconfig`` exists, loads, carries a client certificate and none of its certificates
   has expired: it is used as it is.
2. Otherwise a valid ``<certDir>/kubelet-client-current.pem`` is used, and the kubeconfig is
   written to point at it.
3. Otherwise the bootstrap kubeconfig's credentials (a bootstrap token) create a
   ``kubernetes.io/kube-apiserver-client-kubelet`` CSR for ``CN=system:node:<node>,
   O=system:nodes`` with a new ECDSA P-256 key; kube-controller-manager's csrapproving
   controller approves it (kubeadm's RBAC lets ``system:bootstrappers`` ask), csrsigning signs
   it; the pair goes to ``kubelet-client-<timestamp>.pem`` and ``kubelet-client-current.pem``,
   and the kubeconfig is written as the kubelet writes it (cluster ``default-cluster``, user
   ``default-auth`` with both client-certificate and client-key = the current pem, context
   ``default-context``).

With ``rotateCertificates`` the certificate is then renewed by a :class:`CertificateManager`
through the node's own client (a self renewal: ``selfnodeclient``), and the TLS context the API
client presents it from is reloaded in place: new connections present the new certificate while
open watches carry on (the kubelet instead closes its connections after a rotation).
"""

from __future__ import annotations

import base64
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

from nodeagent.apiclient import make_api_client
from nodeagent.certificates.csr import CLIENT_SIGNER, CLIENT_USAGES, request_certificate
from nodeagent.certificates.manager import CertificateManager, Template, node_template
from nodeagent.certificates.pem import csr_pem, key_pem, new_key, parse_certificate, split_pem
from nodeagent.certificates.store import FileStore, Pair, StoreError
from nodeagent.clock import Clock, SystemClock

log = structlog.get_logger("nodeagent.certificates")

CLIENT_PREFIX = "kubelet-client"
BOOTSTRAP_WAIT_SECONDS = 3600.0
"""How long the first certificate is waited for (the kubelet's bootstrap: one hour)."""


class BootstrapError(Exception):
    """No client certificate could be had; the message says why."""


@dataclass(frozen=True)
class Kubeconfig:
    """The parts of a kubeconfig the bootstrap reads and writes."""

    path: Path
    server: str
    ca_file: Path | None
    ca_data: bytes | None
    insecure: bool
    cert_pem: bytes | None
    key_pem: bytes | None
    token: str | None


def read_kubeconfig(path: Path) -> Kubeconfig:
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise BootstrapError(f"cannot read kubeconfig {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise BootstrapError(f"kubeconfig {path} is not a mapping")

    def named(kind: str, name: str | None) -> dict[str, Any]:
        entries = doc.get(kind) or []
        chosen = next((e for e in entries if e.get("name") == name), entries[0] if entries else {})
        return dict(chosen.get(kind[:-1]) or {})

    context = named("contexts", doc.get("current-context"))
    cluster = named("clusters", context.get("cluster"))
    user = named("users", context.get("user"))
    base = path.parent

    def file(value: Any) -> Path | None:
        return (base / value) if value else None

    def data(value: Any) -> bytes | None:
        return base64.b64decode(value) if value else None

    cert = data(user.get("client-certificate-data"))
    key = data(user.get("client-key-data"))
    cert_file, key_file = file(user.get("client-certificate")), file(user.get("client-key"))
    try:
        if cert is None and cert_file is not None:
            cert = cert_file.read_bytes()
        if key is None and key_file is not None:
            key = key_file.read_bytes()
    except OSError:
        cert = key = None  # the file it names is gone: not a usable client certificate
    token = user.get("token")
    if token is None and user.get("tokenFile"):
        try:
            token = (base / user["tokenFile"]).read_text().strip()
        except OSError:
            token = None
    return Kubeconfig(path, str(cluster.get("server") or ""), file(cluster.get("certificate-authority")),
                      data(cluster.get("certificate-authority-data")), bool(cluster.get("insecure-skip-tls-verify")),
                      cert, key, token)


def still_valid(path: Path, now: float) -> bool:
    """isClientConfigStillValid: the kubeconfig has a client certificate, none expired."""
    if not path.exists():
        return False
    try:
        config = read_kubeconfig(path)
        if not config.cert_pem:
            return False
        cert_pem = split_pem(config.cert_pem + (config.key_pem or b""))[0] if b"PRIVATE KEY" in (
            config.cert_pem + (config.key_pem or b"")) else config.cert_pem
        cert = parse_certificate(cert_pem)
    except (BootstrapError, ValueError) as exc:
        log.info("kubeconfig has no usable client certificate", kubeconfig=str(path), error=str(exc))
        return False
    if now >= cert.not_after:
        log.info("the client certificate of the kubeconfig has expired", kubeconfig=str(path))
        return False
    return True


def write_kubeconfig(path: Path, bootstrap: Kubeconfig, cert_path: Path) -> None:
    """writeKubeconfigFromBootstrapping: the node's kubeconfig, pointing at ``cert_path``."""
    cluster: dict[str, Any] = {"server": bootstrap.server}
    if bootstrap.ca_file is not None:
        cluster["certificate-authority"] = str(bootstrap.ca_file.absolute())
    elif bootstrap.ca_data is not None:
        cluster["certificate-authority-data"] = base64.b64encode(bootstrap.ca_data).decode()
    if bootstrap.insecure:
        cluster["insecure-skip-tls-verify"] = True
    doc = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "contexts": [{"name": "default-context",
                      "context": {"cluster": "default-cluster", "namespace": "default", "user": "default-auth"}}],
        "current-context": "default-context",
        "users": [{"name": "default-auth",
                   "user": {"client-certificate": str(cert_path), "client-key": str(cert_path)}}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    os.replace(tmp, path)


def tls_context(config: Kubeconfig) -> ssl.SSLContext:
    """A client context trusting the kubeconfig's cluster CA (the client pair is loaded after)."""
    if config.insecure:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if config.ca_file is not None:
        return ssl.create_default_context(cafile=str(config.ca_file))
    if config.ca_data is not None:
        return ssl.create_default_context(cadata=config.ca_data.decode())
    return ssl.create_default_context()


class ClientCertificates:
    """The client certificate the API client presents: one TLS context, reloaded on rotation."""

    def __init__(self, kubeconfig: Path, pair: Pair, manager: CertificateManager | None) -> None:
        self.kubeconfig = kubeconfig
        self.context = tls_context(read_kubeconfig(kubeconfig))
        self.manager = manager
        self.pair = pair
        self._load(pair)
        if manager is not None:
            manager.on_rotated(self._load)

    def _load(self, pair: Pair) -> None:
        # Handshakes after this present the new pair; established connections are left alone.
        self.context.load_cert_chain(str(pair.cert_file), str(pair.key_file))
        self.pair = pair


def _kubeconfig_pair(path: Path, directory: Path) -> Pair:
    """The kubeconfig's own client pair, as files the TLS context can load: the files it names,
    or its embedded data written (0600) to ``directory``."""
    doc = yaml.safe_load(path.read_text()) or {}
    users = doc.get("users") or []
    context = next((c.get("context") or {} for c in doc.get("contexts") or []
                    if c.get("name") == doc.get("current-context")), {})
    user = next((u.get("user") or {} for u in users if u.get("name") == context.get("user")),
                (users[0].get("user") or {}) if users else {})
    if user.get("client-certificate") and user.get("client-key"):
        return FileStore._read(path.parent / user["client-certificate"], path.parent / user["client-key"])
    config = read_kubeconfig(path)
    if not config.cert_pem or not config.key_pem:
        raise BootstrapError(f"kubeconfig {path} has no client certificate and key")
    combined = config.cert_pem + (b"" if config.cert_pem.endswith(b"\n") else b"\n") + config.key_pem
    cert_pem, key_bytes = split_pem(combined)
    target = directory / ".kubeconfig-client.pem"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(combined)
    return Pair(parse_certificate(cert_pem), key_bytes, target, target)


def _stored(store: FileStore, template: Template, now: float) -> Pair | None:
    """The store's current pair, if it is valid now and is this node's."""
    try:
        pair = store.load()
    except StoreError as exc:
        log.warning("unusable client certificate in the certificate directory", error=str(exc))
        return None
    if pair is None or not pair.certificate.valid_at(now) or not template.satisfied_by(pair.certificate):
        return None
    return pair


async def prepare(*, kubeconfig: Path, bootstrap_kubeconfig: Path | None, cert_dir: Path, node_name: str,
                  rotate: bool, clock: Clock | None = None) -> ClientCertificates | None:
    """The node's client certificate before the agent starts (see the module docstring); None
    when neither bootstrap nor rotation is asked for (the kubeconfig is used as it is). The
    rotation manager it returns renews through ``manager.api``, which the agent sets to its
    own client."""
    clock = clock or SystemClock()
    if bootstrap_kubeconfig is None and not rotate:
        return None
    store = FileStore(cert_dir, CLIENT_PREFIX)
    template = node_template(node_name, CLIENT_SIGNER, CLIENT_USAGES)
    stored = _stored(store, template, clock.now())
    if still_valid(kubeconfig, clock.now()):
        # The manager prefers the newest certificate it wrote over the kubeconfig's own.
        pair = stored if rotate and stored is not None else _kubeconfig_pair(kubeconfig, cert_dir)
    else:
        if bootstrap_kubeconfig is None:
            raise BootstrapError(f"kubeconfig {kubeconfig} has no valid client certificate and no "
                                 "--bootstrap-kubeconfig is given to get one")
        bootstrap = read_kubeconfig(bootstrap_kubeconfig)
        if stored is None:
            log.info("requesting a client certificate with the bootstrap credentials",
                     bootstrap_kubeconfig=str(bootstrap_kubeconfig), node=node_name)
            stored = await _bootstrap(bootstrap_kubeconfig, store, node_name, clock)
        pair = stored
        write_kubeconfig(kubeconfig, bootstrap, store.current_path)
        log.info("wrote the node's kubeconfig", kubeconfig=str(kubeconfig), certificate=str(store.current_path))
    manager = None
    if rotate:
        manager = CertificateManager("client", store, lambda: template, api=lambda: None, clock=clock, current=pair)
    return ClientCertificates(kubeconfig, pair, manager)


async def _bootstrap(bootstrap_kubeconfig: Path, store: FileStore, node_name: str, clock: Clock) -> Pair:
    client = make_api_client(bootstrap_kubeconfig)
    try:
        key = new_key()
        request = csr_pem(key, f"system:node:{node_name}", ("system:nodes",))
        cert = await request_certificate(client, request, CLIENT_SIGNER, CLIENT_USAGES,
                                         timeout=BOOTSTRAP_WAIT_SECONDS, clock=clock)
    finally:
        await client.close()
    return store.update(cert, key_pem(key), now=clock.now())

__all__ = ["BootstrapError", "ClientCertificates", "Kubeconfig", "prepare", "read_kubeconfig", "still_valid",
           "write_kubeconfig"]
