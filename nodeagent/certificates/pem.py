"""Keys, certificate signing requests and certificates (the ``cryptography`` package)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PrivateKey = ec.EllipticCurvePrivateKey


def new_key() -> PrivateKey:
    """ECDSA P-256, what the kubelet generates for both its client and serving keys."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    """``EC PRIVATE KEY`` PEM (keyutil.MarshalPrivateKeyToPEM)."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def csr_pem(key: PrivateKey, common_name: str, organizations: Sequence[str] = (), *,
            dns_names: Sequence[str] = (), ip_addresses: Sequence[str] = ()) -> bytes:
    subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations),
                         x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Certificate:
    """What the agent needs to know of a certificate (the first of a PEM chain)."""

    pem: bytes
    not_before: float
    not_after: float
    common_name: str
    organizations: tuple[str, ...]
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]

    @property
    def lifetime(self) -> float:
        return self.not_after - self.not_before

    def valid_at(self, now: float) -> bool:
        return self.not_before <= now < self.not_after


def parse_certificate(pem: bytes) -> Certificate:
    cert = x509.load_pem_x509_certificate(pem)
    subject = cert.subject
    cn = [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = tuple(str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(sans.get_values_for_type(x509.DNSName))
        ips = tuple(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    return Certificate(pem, cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp(),
                       str(cn[0]) if cn else "", orgs, dns, ips)


def split_pem(data: bytes) -> tuple[bytes, bytes]:
    """(certificate blocks, private key block) of a combined PEM file; ValueError if either is missing."""
    certs: list[bytes] = []
    key = b""
    block: list[bytes] = []
    for line in data.splitlines(keepends=True):
        if line.startswith(b"-----BEGIN "):
            block = [line]
        elif block:
            block.append(line)
            if line.startswith(b"-----END "):
                text = b"".join(block)
                if b"PRIVATE KEY" in block[0]:
                    key = text
                elif b"CERTIFICATE" in block[0]:
                    certs.append(text)
                block = []
    if not certs or not key:
        raise ValueError("no certificate and private key in the file")
    return b"".join(certs), key


def key_matches(cert_pem: bytes, key_pem_data: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem_data, password=None)
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(cert.public_key().public_bytes(serialization.Encoding.DER, raw)
                == key.public_key().public_bytes(serialization.Encoding.DER, raw))


__all__ = ["Certificate", "PrivateKey", "csr_pem", "key_matches", "key_pem", "new_key", "parse_certificate",
           "split_pem"]
