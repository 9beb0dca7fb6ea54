"""A certificate from the cluster's signer: a CertificateSigningRequest, created and waited for
(client-go util/certificate/csr RequestCertificate and WaitForCertificate)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import structlog
from lightkube.models.certificates_v1 import CertificateSigningRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.certificates_v1 import CertificateSigningRequest

from nodeagent.clock import Clock, SystemClock

log = structlog.get_logger("nodeagent.certificates")

CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING_SIGNER = "kubernetes.io/kubelet-serving"
CLIENT_USAGES = ("digital signature", "client auth")  # no key encipherment: the key is ECDSA
SERVING_USAGES = ("digital signature", "server auth")
WAIT_SECONDS = 15 * 60.0
"""How long a renewal waits for approval and signing (the certificate manager's 15 minutes)."""
POLL_INITIAL = 0.5
POLL_MAX = 5.0


class CsrError(Exception):
    """The request was denied or failed, or no certificate came in time."""


async def request_certificate(api: Any, csr: bytes, signer: str, usages: Sequence[str], *,
                              timeout: float = WAIT_SECONDS, clock: Clock | None = None) -> bytes:
    """The signed certificate (PEM) for ``csr``; CsrError when denied, failed or late."""
    clock = clock or SystemClock()
    body = CertificateSigningRequest(
        metadata=ObjectMeta(generateName="csr-"),
        spec=CertificateSigningRequestSpec(request=base64.b64encode(csr).decode(), signerName=signer,
                                           usages=list(usages)))
    created = await api.create(body)
    name = created.metadata.name
    log.info("certificate signing request created", csr=name, signer=signer)
    deadline = clock.monotonic() + timeout
    delay = POLL_INITIAL
    while True:
        current = await api.get(CertificateSigningRequest, name)
        status = current.status
        for condition in (status.conditions if status else None) or []:
            if condition.type in ("Denied", "Failed") and condition.status != "False":
                raise CsrError(f"certificate signing request {name} is {condition.type.lower()}, reason: "
                               f"{condition.reason}, message: {condition.message}")
        approved = any(c.type == "Approved" and c.status != "False"
                       for c in ((status.conditions if status else None) or []))
        if approved and status is not None and status.certificate:
            log.info("certificate signing request approved and issued", csr=name)
            return base64.b64decode(status.certificate)
        if clock.monotonic() >= deadline:
            raise CsrError(f"timed out waiting for the certificate of signing request {name} "
                           f"({'approved, not issued' if approved else 'not approved'})")
        await clock.sleep(delay)
        delay = min(delay * 2, POLL_MAX)

__all__ = ["CLIENT_SIGNER", "CLIENT_USAGES", "CsrError", "SERVING_SIGNER", "SERVING_USAGES", "request_certificate"]
