"""The serving certificate and the TLS context of the kubelet API.

Like the kubelet: ``tlsCertFile``/``tlsPrivateKeyFile`` when configured; otherwise a
self-signed certificate made once at start in ``--cert-dir`` (default ``rootDir/pki``; files
``kubelet.crt``/``kubelet.key``) and reused while both files exist. (With ``serverTLSBootstrap``
the cluster signs it instead: nodeagent/certificates.) It names the node
(name, host name, node IP) so that a client given it as trust anchor can verify the node; the
API server only verifies kubelets when it has ``--kubelet-certificate-authority``.

The certificate is made with the openssl CLI, as controlplane/pki.py does, rather than a Python
crypto package: one command at start does not justify a dependency.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

from nodeagent.config import AgentConfig

log = structlog.get_logger("nodeagent.kubeletserver")

SELF_SIGNED_DAYS = 365


class CertificateError(Exception):
    """No serving certificate could be loaded or made; the message says what to configure."""


def serving_pair(config: AgentConfig, node_ips: Sequence[str] = ()) -> tuple[Path, Path]:
    """(certificate, key) files, made if they are not configured and do not exist yet."""
    if config.kubelet.tls_cert_file and config.kubelet.tls_private_key_file:
        return Path(config.kubelet.tls_cert_file), Path(config.kubelet.tls_private_key_file)
    directory = config.flags.pki_dir
    cert, key = directory / "kubelet.crt", directory / "kubelet.key"
    if cert.is_file() and key.is_file():
        return cert, key
    directory.mkdir(parents=True, exist_ok=True)
    names = _subject_alt_names(config, node_ips)
    host = socket.gethostname().lower() or config.node_name
    _self_signed(cert, key, f"{host}@{int(time.time())}", names)
    log.info("generated a self-signed serving certificate", cert=str(cert), names=",".join(names))
    return cert, key


def _subject_alt_names(config: AgentConfig, node_ips: Sequence[str]) -> list[str]:
    names: list[str] = []
    for name in (config.node_name, socket.gethostname().lower(), *(node_ips or config.node_ips)):
        if not name:
            continue
        try:
            entry = f"IP:{ipaddress.ip_address(name)}"
        except ValueError:
            entry = f"DNS:{name}"
        if entry not in names:
            names.append(entry)
    return names


def _self_signed(cert: Path, key: Path, common_name: str, names: list[str]) -> None:
    # Written under temporary names and renamed: a crash midway leaves no half pair behind
    # that the next start would take for a good one.
    tmp_cert, tmp_key = cert.with_suffix(".crt.tmp"), key.with_suffix(".key.tmp")
    command = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
               "-keyout", str(tmp_key), "-out", str(tmp_cert), "-days", str(SELF_SIGNED_DAYS),
               "-subj", f"/CN={common_name}",
               "-addext", "basicConstraints=critical,CA:FALSE",
               "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
               "-addext", "extendedKeyUsage=serverAuth"]
    if names:
        command += ["-addext", "subjectAltName=" + ",".join(names)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    except FileNotFoundError:
        raise CertificateError("cannot make a self-signed serving certificate: the openssl command is "
                               "not installed; set tlsCertFile and tlsPrivateKeyFile") from None
    if done.returncode != 0:
        raise CertificateError(f"openssl could not make a self-signed serving certificate: {done.stderr.strip()}")
    os.chmod(tmp_key, 0o600)
    os.replace(tmp_key, key)
    os.replace(tmp_cert, cert)


TLS_VERSIONS = {"VersionTLS12": ssl.TLSVersion.TLSv1_2, "VersionTLS13": ssl.TLSVersion.TLSv1_3}


def server_context(cert: Path, key: Path, client_ca: Path | None, *, min_version: str = "") -> ssl.SSLContext:
    """TLS 1.2+ (``tlsMinVersion`` VersionTLS13: 1.3), HTTP/1.1 only (so Go clients do not try
    HTTP/2). With a client CA, a client certificate is verified when presented; requests
    without one are refused by the server (401) rather than by the handshake, as the kubelet
    answers anonymous requests."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if min_version and min_version not in TLS_VERSIONS and min_version not in ("VersionTLS10", "VersionTLS11"):
        raise CertificateError(f"unrecognized TLS version: {min_version}")
    context.minimum_version = TLS_VERSIONS.get(min_version, ssl.TLSVersion.TLSv1_2)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise CertificateError(f"cannot load the serving certificate {cert} / key {key}: {exc}") from exc
    context.set_alpn_protocols(["http/1.1"])
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=str(client_ca))
        except (OSError, ssl.SSLError) as exc:
            raise CertificateError(f"cannot load authentication.x509.clientCAFile {client_ca}: {exc}") from exc
        context.verify_mode = ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context
