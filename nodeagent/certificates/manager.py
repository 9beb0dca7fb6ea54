"""One certificate kept current (client-go util/certificate certificate manager).

The certificate is renewed at ``NotBefore + lifetime x uniform(0.7, 0.9)`` (the kubelet's
jittered deadline), at once when there is none or when it no longer matches its template (a
name or address it lacks). A renewal is a fresh ECDSA P-256 key and a CertificateSigningRequest
through the node's API client; the new pair is written to the store and every listener is told
(the API client's TLS context and the kubelet API's load it in place, so open connections and
watches stay up). A failed renewal backs off (2 s doubling, at most 5 min) and tries again; the
current certificate keeps serving until it expires.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from nodeagent.backoff import Backoff
from nodeagent.certificates.csr import request_certificate
from nodeagent.certificates.pem import Certificate, csr_pem, key_pem, new_key
from nodeagent.certificates.store import FileStore, Pair
from nodeagent.clock import Clock, SystemClock

log = structlog.get_logger("nodeagent.certificates")

RETRY_INITIAL = 2.0
RETRY_MAX = 300.0
TEMPLATE_RETRY = 5.0
"""How often a manager without a template yet (a serving certificate before the node's first
address is known) looks again."""


@dataclass(frozen=True)
class Template:
    """What the certificate must say (the CSR the manager sends)."""

    common_name: str
    organizations: tuple[str, ...]
    signer: str
    usages: tuple[str, ...]
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()

    def satisfied_by(self, cert: Certificate) -> bool:
        """The kubelet's template check: same subject, every name and address present."""
        return (cert.common_name == self.common_name and set(self.organizations) <= set(cert.organizations)
                and set(self.dns_names) <= set(cert.dns_names) and set(self.ip_addresses) <= set(cert.ip_addresses))


def jittered_deadline(cert: Certificate, rng: Callable[[], float] = random.random) -> float:
    """NotBefore + (0.7 + 0.2 x rng()) x lifetime: wait.Jitter(total, 0.2) - 0.3 x total."""
    return cert.not_before + cert.lifetime * (0.7 + 0.2 * rng())


@dataclass
class CertificateManager:
    """``name`` is ``client`` or ``server`` (logs, metrics: kubelet_certificate_manager_<name>_*)."""

    name: str
    store: FileStore
    template: Callable[[], Template | None]
    api: Callable[[], Any]
    """The API client renewals go through (the node's own once it has a certificate)."""
    clock: Clock = field(default_factory=SystemClock)
    rng: Callable[[], float] = random.random
    current: Pair | None = None
    renewals: int = 0
    errors: int = 0
    listeners: list[Callable[[Pair], None]] = field(default_factory=list)
    deadline: float | None = None
    """Wall time of the next renewal (None: as soon as possible)."""
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self._plan()

    def _plan(self) -> None:
        cert = self.current.certificate if self.current else None
        self.deadline = jittered_deadline(cert, self.rng) if cert is not None else None

    def on_rotated(self, listener: Callable[[Pair], None]) -> None:
        self.listeners.append(listener)

    def wake(self) -> None:
        """Look at the template again now (the node's addresses changed)."""
        self._changed.set()

    def due(self, now: float) -> bool:
        template = self.template()
        if template is None:
            return False
        if self.current is None or not template.satisfied_by(self.current.certificate):
            return True
        return self.deadline is not None and now >= self.deadline

    async def rotate(self) -> Pair:
        """A new key and certificate now; raises when the request fails (the current one stays)."""
        template = self.template()
        if template is None:
            raise RuntimeError(f"no template for the {self.name} certificate yet")
        key = new_key()
        request = csr_pem(key, template.common_name, template.organizations, dns_names=template.dns_names,
                          ip_addresses=template.ip_addresses)
        cert_pem = await request_certificate(self.api(), request, template.signer, template.usages,
                                             clock=self.clock)
        pair = await anyio.to_thread.run_sync(lambda: self.store.update(cert_pem, key_pem(key),
                                                                         now=self.clock.now()))
        self.current = pair
        self.renewals += 1
        self._plan()
        log.info("certificate rotated", certificate=self.name, file=str(pair.cert_file),
                 not_after=pair.certificate.not_after, next_renewal=self.deadline)
        for listener in list(self.listeners):
            listener(pair)
        return pair

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the certificate current until cancelled (a supervised task)."""
        task_status.started()
        backoff = Backoff(RETRY_INITIAL, RETRY_MAX, jitter=0.1)
        while True:
            now = self.clock.now()
            if not self.due(now):
                wait = TEMPLATE_RETRY if self.template() is None or self.deadline is None else self.deadline - now
                self._changed = anyio.Event()
                await self._sleep_or_wake(wait)
                continue
            try:
                await self.rotate()
                backoff.reset()
            except Exception as exc:  # noqa: BLE001 - the current certificate serves; try again later
                self.errors += 1
                delay = backoff.next()
                log.warning("certificate rotation failed; retrying", certificate=self.name, error=str(exc),
                            retry_in=round(delay, 1))
                await self.clock.sleep(delay)

    async def _sleep_or_wake(self, seconds: float) -> None:
        async with anyio.create_task_group() as tg:
            async def sleep() -> None:
                await self.clock.sleep(max(min(seconds, 3600.0), 0.0))
                tg.cancel_scope.cancel()

            async def woken() -> None:
                await self._changed.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(sleep)
            tg.start_soon(woken)

    def render_metrics(self) -> str:
        """kubelet_certificate_manager_<name>_ttl_seconds (+Inf without a certificate) and the
        renewal error counter, the kubelet's names."""
        ttl = (self.current.certificate.not_after - self.clock.now()) if self.current else float("inf")
        errors = ("kubelet_certificate_manager_client_expiration_renew_errors" if self.name == "client"
                  else "kubelet_server_expiration_renew_errors")
        return (f"# TYPE kubelet_certificate_manager_{self.name}_ttl_seconds gauge\n"
                f"kubelet_certificate_manager_{self.name}_ttl_seconds {ttl:.0f}\n"
                f"# TYPE {errors} counter\n{errors} {self.errors}\n")


def node_template(node_name: str, signer: str, usages: Sequence[str], *, dns_names: Sequence[str] = (),
                  ip_addresses: Sequence[str] = ()) -> Template:
    """``CN=system:node:<name>, O=system:nodes``: the subject both kubelet signers require."""
    return Template(f"system:node:{node_name}", ("system:nodes",), signer, tuple(usages),
                    tuple(sorted(set(dns_names))), tuple(sorted(set(ip_addresses))))


__all__ = ["CertificateManager", "Template", "jittered_deadline", "node_template"]
