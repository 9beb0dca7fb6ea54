"""The kubelet API's serving certificate from the cluster (``serverTLSBootstrap``).

A ``kubernetes.io/kubelet-serving`` CSR for ``CN=system:node:<node>, O=system:nodes`` whose
names are the node's addresses: each IP address an IP SAN, the node name a DNS SAN (an IP SAN
when it is an address). The controller-manager never approves these by itself: an operator (or
an approver they run) does, ``kubectl certificate approve``. The pair is kept as
``<certDir>/kubelet-server-<timestamp>.pem`` and ``kubelet-server-current.pem``; a
``tlsCertFile``/``tlsPrivateKeyFile`` pair is only the initial one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodeagent.certificates.csr import SERVING_SIGNER, SERVING_USAGES
from nodeagent.certificates.manager import CertificateManager, Template, node_template
from nodeagent.certificates.store import FileStore, StoreError
from nodeagent.clock import Clock
from nodeagent.config import AgentConfig
from nodeagent.stages import NodeInfo

SERVER_PREFIX = "kubelet-server"


def serving_template(node: NodeInfo) -> Template:
    dns: list[str] = []
    ips = [ip for ip in (node.ips or (node.ip,)) if ip]
    try:
        ips.append(str(ipaddress.ip_address(node.name)))
    except ValueError:
        dns.append(node.name)
    return node_template(node.name, SERVING_SIGNER, SERVING_USAGES, dns_names=dns, ip_addresses=ips)


def serving_certificates(config: AgentConfig, node: NodeInfo, api: Callable[[], Any],
                         clock: Clock) -> CertificateManager:
    cert_file = Path(config.kubelet.tls_cert_file) if config.kubelet.tls_cert_file else None
    key_file = Path(config.kubelet.tls_private_key_file) if config.kubelet.tls_private_key_file else None
    store = FileStore(config.flags.pki_dir, SERVER_PREFIX, cert_file, key_file)
    try:
        current = store.load()
    except StoreError:
        current = None  # requested again
    return CertificateManager("server", store, lambda: serving_template(node), api=api, clock=clock,
                              current=current)


__all__ = ["SERVER_PREFIX", "serving_certificates", "serving_template"]
