"""Certificates, keys and kubeconfigs for a loopback control plane, made with the openssl CLI.

Everything is ECDSA P-256 (fast to generate, accepted by every component,
ES256 for service-account tokens). One CA signs the serving and client
certificates; a second CA signs the front-proxy client (the aggregation
layer needs its own, as kubeadm does). Files are written once and reused:
calling the functions again on the same directory is cheap and idempotent.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

_CONF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,digitalSignature,keyEncipherment,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = {eku}
authorityKeyIdentifier = keyid
{san}
"""


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _subject(cn: str, orgs: tuple[str, ...] = ()) -> str:
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("/", "\\/")

    return "".join(f"/O={esc(o)}" for o in orgs) + f"/CN={esc(cn)}"


def _genkey(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(path), cwd=path.parent)
    os.chmod(path, 0o600)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class PKI:
    """A directory of certificates: `ca`, `front-proxy-ca`, `sa.key`/`sa.pub`, leaves."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._conf_cache: dict[str, Path] = {}
        self.ca = self._ca("ca", "nodeagent-test-ca")
        self.front_proxy_ca = self._ca("front-proxy-ca", "nodeagent-test-front-proxy-ca")

    # -- CAs and the service-account key pair --------------------------------

    def _write_conf(self, name: str, eku: str, sans: list[str]) -> Path:
        san = ""
        if sans:
            parts = []
            for s in sans:
                try:
                    ipaddress.ip_address(s)
                    parts.append(f"IP:{s}")
                except ValueError:
                    parts.append(f"DNS:{s}")
            san = "subjectAltName = " + ",".join(parts)
        path = self.dir / f".{name}.cnf"
        path.write_text(_CONF.format(eku=eku, san=san))
        return path

    def _ca(self, name: str, cn: str) -> KeyPair:
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        _genkey(pair.key)
        conf = self._write_conf(name, "serverAuth", [])
        _openssl("req", "-x509", "-new", "-config", str(conf), "-extensions", "ca",
                 "-key", str(pair.key), "-subj", _subject(cn), "-days", "3650",
                 "-out", str(pair.cert), cwd=self.dir)
        conf.unlink()
        return pair

    def service_account_keys(self) -> KeyPair:
        """sa.key (signing, private) and sa.pub (verification) for ServiceAccount tokens."""
        pair = KeyPair(self.dir / "sa.pub", self.dir / "sa.key")
        if not (pair.cert.exists() and pair.key.exists()):
            _genkey(pair.key)
            _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert),
                     cwd=self.dir)
        return pair

    # -- leaf certificates -----------------------------------------------------

    def issue(self, name: str, cn: str, *, orgs: tuple[str, ...] = (),
              server: bool = False, client: bool = False, sans: list[str] | None = None,
              ca: KeyPair | None = None) -> KeyPair:
        """A certificate `name.crt`/`name.key` signed by `ca` (default: the main CA)."""
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        ca = ca or self.ca
        eku = ",".join([*(["serverAuth"] if server else []), *(["clientAuth"] if client else [])])
        conf = self._write_conf(name, eku, sans or [])
        csr = self.dir / f".{name}.csr"
        _genkey(pair.key)
        _openssl("req", "-new", "-config", str(conf), "-key", str(pair.key),
                 "-subj", _subject(cn, orgs), "-out", str(csr), cwd=self.dir)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
                 "-set_serial", "0x" + secrets.token_hex(16), "-days", "365",
                 "-extfile", str(conf), "-extensions", "leaf", "-out", str(pair.cert),
                 cwd=self.dir)
        csr.unlink()
        conf.unlink()
        return pair


def write_kubeconfig(path: Path, *, server: str, ca: Path, client: KeyPair,
                     user: str, cluster: str = "nodeagent-test") -> Path:
    """A self-contained kubeconfig (certificates embedded); JSON, which is valid YAML."""
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(client.cert),
            "client-key-data": b64(client.key)}}],
        "contexts": [{"name": f"{user}@{cluster}", "context": {"cluster": cluster, "user": user}}],
        "current-context": f"{user}@{cluster}",
        "preferences": {},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path
