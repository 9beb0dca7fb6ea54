"""The node's certificate files and renewal timing (nodeagent/certificates), without a cluster:
the kubelet's file store, its jittered deadline, the kubeconfig the bootstrap writes and when a
kubeconfig is still good. The flow against the real controller-manager is
tests/test_kubeadm_join.py."""

from __future__ import annotations

import datetime
import os
import ssl
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

from nodeagent.certificates.client import Kubeconfig, read_kubeconfig, still_valid, write_kubeconfig
from nodeagent.certificates.csr import CLIENT_SIGNER, CLIENT_USAGES, SERVING_SIGNER, SERVING_USAGES
from nodeagent.certificates.manager import jittered_deadline, node_template
from nodeagent.certificates.pem import Certificate, csr_pem, key_pem, new_key, parse_certificate
from nodeagent.certificates.serving import serving_template
from nodeagent.certificates.store import FileStore, StoreError
from nodeagent.stages import NodeInfo


def _certificate(cn: str = "system:node:n1", *, days: float = 1.0, ips: tuple[str, ...] = (),
                 dns: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """A self-signed (certificate, key) PEM pair valid from now on."""
    import ipaddress

    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(days=days)))
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i))
                                                                      for i in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    from cryptography.hazmat.primitives import serialization

    cert = builder.sign(key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)


def test_the_store_writes_the_kubelets_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "pki", "kubelet-client")
    assert store.load() is None
    cert, key = _certificate()
    first = store.update(cert, key, now=1_700_000_000)
    current = tmp_path / "pki" / "kubelet-client-current.pem"
    assert current.is_symlink() and os.path.isabs(os.readlink(current))
    target = Path(os.readlink(current))
    stamp = datetime.datetime.fromtimestamp(1_700_000_000).strftime("%Y-%m-%d-%H-%M-%S")
    assert target.name == f"kubelet-client-{stamp}.pem"
    assert target.stat().st_mode & 0o777 == 0o600
    assert target.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----") and b"EC PRIVATE KEY" in target.read_bytes()
    # One file with both halves, loadable as the TLS context loads it.
    ssl.create_default_context().load_cert_chain(str(current))
    assert store.load() == first
    second = store.update(*_certificate(), now=1_700_000_100)
    assert Path(os.readlink(current)) != target and store.load() == second and target.exists()
    assert not (tmp_path / "pki" / "kubelet-client-updated.pem").exists()


def test_a_regular_current_file_is_refused_in_the_kubelets_words(tmp_path: Path) -> None:
    store = FileStore(tmp_path, "kubelet-client")
    cert, key = _certificate()
    (tmp_path / "kubelet-client-current.pem").write_bytes(cert + key)
    assert store.load() is not None  # readable,
    with pytest.raises(StoreError, match=f'^expected "{tmp_path}/kubelet-client-current.pem" to be a symlink but '
                                         "it is a file$"):
        store.update(cert, key)  # but not replaced


def test_the_store_falls_back_to_the_configured_pair_then_prefix_files(tmp_path: Path) -> None:
    cert, key = _certificate()
    (tmp_path / "given.crt").write_bytes(cert)
    (tmp_path / "given.key").write_bytes(key)
    store = FileStore(tmp_path, "kubelet-server", tmp_path / "given.crt", tmp_path / "given.key")
    pair = store.load()
    assert pair is not None and pair.cert_file == tmp_path / "given.crt"
    other_cert, _ = _certificate()
    (tmp_path / "given.crt").write_bytes(other_cert)
    with pytest.raises(StoreError, match="the private key does not match the certificate"):
        store.load()


def test_renewal_is_at_70_to_90_percent_of_the_lifetime() -> None:
    cert = Certificate(b"", not_before=1000.0, not_after=2000.0, common_name="x", organizations=(),
                       dns_names=(), ip_addresses=())
    assert jittered_deadline(cert, rng=lambda: 0.0) == 1700.0
    assert jittered_deadline(cert, rng=lambda: 0.999999) == pytest.approx(1900.0, abs=0.01)
    import random

    rng = random.Random(7)
    draws = [jittered_deadline(cert, rng=rng.random) for _ in range(200)]
    assert all(1700.0 <= d < 1900.0 for d in draws) and max(draws) - min(draws) > 150


def test_the_csrs_are_the_kubelets() -> None:
    client = node_template("n1", CLIENT_SIGNER, CLIENT_USAGES)
    assert (client.common_name, client.organizations, client.usages) == (
        "system:node:n1", ("system:nodes",), ("digital signature", "client auth"))
    key = new_key()
    request = x509.load_pem_x509_csr(csr_pem(key, client.common_name, client.organizations))
    assert request.subject.rfc4514_string() == "CN=system:node:n1,O=system:nodes"
    assert request.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    serving = serving_template(NodeInfo(name="n1", ip="10.0.0.5", allocatable={}, ips=("10.0.0.5", "fd00::5")))
    assert (serving.signer, serving.usages) == (SERVING_SIGNER, SERVING_USAGES)
    assert serving.dns_names == ("n1",) and serving.ip_addresses == ("10.0.0.5", "fd00::5")
    # A certificate lacking a name or address of the template is renewed at once.
    ok = parse_certificate(_certificate(ips=("10.0.0.5", "fd00::5"), dns=("n1",))[0])
    short = parse_certificate(_certificate(ips=("10.0.0.5",), dns=("n1",))[0])
    assert serving.satisfied_by(ok) and not serving.satisfied_by(short)


def _kubeconfig(path: Path, cert: bytes | None, key: bytes | None) -> Path:
    import base64

    user = {"client-certificate-data": base64.b64encode(cert).decode(),
            "client-key-data": base64.b64encode(key).decode()} if cert and key else {"token": "abcdef.0123456789abcdef"}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": user}], "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_a_kubeconfig_is_kept_while_its_certificate_is_valid(tmp_path: Path) -> None:
    import time

    cert, key = _certificate(days=1)
    good = _kubeconfig(tmp_path / "good.conf", cert, key)
    assert still_valid(good, time.time())
    assert not still_valid(good, time.time() + 2 * 86400)  # expired
    assert not still_valid(_kubeconfig(tmp_path / "token.conf", None, None), time.time())  # no certificate
    assert not still_valid(tmp_path / "missing.conf", time.time())


def test_the_kubeconfig_is_written_as_the_kubelet_writes_it(tmp_path: Path) -> None:
    bootstrap = read_kubeconfig(_kubeconfig(tmp_path / "bootstrap.conf", None, None))
    assert bootstrap == Kubeconfig(tmp_path / "bootstrap.conf", "https://10.0.0.1:6443", tmp_path / "ca.crt", None,
                                   False, None, None, "abcdef.0123456789abcdef")
    out = tmp_path / "etc" / "kubelet.conf"
    current = tmp_path / "pki" / "kubelet-client-current.pem"
    write_kubeconfig(out, bootstrap, current)
    assert out.stat().st_mode & 0o777 == 0o600
    assert yaml.safe_load(out.read_text()) == {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "default-cluster", "cluster": {"server": "https://10.0.0.1:6443",
                                                             "certificate-authority": str(tmp_path / "ca.crt")}}],
        "contexts": [{"name": "default-context",
                      "context": {"cluster": "default-cluster", "namespace": "default", "user": "default-auth"}}],
        "current-context": "default-context",
        "users": [{"name": "default-auth", "user": {"client-certificate": str(current), "client-key": str(current)}}],
    }
