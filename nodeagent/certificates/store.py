"""The kubelet's certificate files (client-go util/certificate fileStore).

``<dir>/<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem`` holds a certificate and its key (mode 0600);
``<prefix>-current.pem`` is a symlink to the newest, replaced by renaming a temporary
``<prefix>-updated.pem`` link over it, so that a reader always finds a whole pair. At start the
pair is looked for in ``<prefix>-current.pem``, then in the configured certificate and key files
(tlsCertFile/tlsPrivateKeyFile for the serving pair), then in ``<prefix>.crt``/``<prefix>.key``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from nodeagent.certificates.pem import Certificate, key_matches, parse_certificate, split_pem


class StoreError(Exception):
    """The directory holds something the store cannot use (the kubelet's words)."""


@dataclass(frozen=True)
class Pair:
    certificate: Certificate
    key_pem: bytes
    cert_file: Path
    key_file: Path
    """Where the pair was read from (the same file for a ``-current.pem``)."""


class FileStore:
    def __init__(self, directory: Path, prefix: str, cert_file: Path | None = None,
                 key_file: Path | None = None) -> None:
        self.directory = directory
        self.prefix = prefix
        self._cert_file = cert_file
        self._key_file = key_file

    @property
    def current_path(self) -> Path:
        return self.directory / f"{self.prefix}-current.pem"

    def load(self) -> Pair | None:
        """The current pair, or None when there is none yet (a damaged file is an error)."""
        current = self.current_path
        if current.exists():
            return self._read(current, current)
        if self._cert_file is not None and self._key_file is not None and self._cert_file.exists() \
                and self._key_file.exists():
            return self._read(self._cert_file, self._key_file)
        crt, key = self.directory / f"{self.prefix}.crt", self.directory / f"{self.prefix}.key"
        if crt.exists() and key.exists():
            return self._read(crt, key)
        return None

    @staticmethod
    def _read(cert_file: Path, key_file: Path) -> Pair:
        try:
            if cert_file == key_file:
                cert_pem, key_pem = split_pem(cert_file.read_bytes())
            else:
                cert_pem, key_pem = cert_file.read_bytes(), key_file.read_bytes()
            if not key_matches(cert_pem, key_pem):
                raise ValueError("the private key does not match the certificate")
            return Pair(parse_certificate(cert_pem), key_pem, cert_file, key_file)
        except (OSError, ValueError) as exc:
            raise StoreError(f"could not read the certificate in {cert_file}: {exc}") from exc

    def update(self, cert_pem: bytes, key_pem: bytes, *, now: float | None = None) -> Pair:
        """Write a new pair and point ``-current.pem`` at it."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        current = self.current_path
        if current.exists() and not current.is_symlink():
            raise StoreError(f'expected "{current}" to be a symlink but it is a file')
        stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.localtime(now))
        target = self.directory / f"{self.prefix}-{stamp}.pem"
        tmp = target.with_name(target.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(cert_pem + (b"" if cert_pem.endswith(b"\n") else b"\n") + key_pem)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        updated = self.directory / f"{self.prefix}-updated.pem"
        updated.unlink(missing_ok=True)
        os.symlink(target.absolute(), updated)
        os.replace(updated, current)
        return Pair(parse_certificate(cert_pem), key_pem, current, current)


__all__ = ["FileStore", "Pair", "StoreError"]
