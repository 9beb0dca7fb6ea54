"""From prepared claims to what each container gets: the CDI device ids of the claims (and
requests) it names in resources.claims, and — for runtimes that do not resolve CDI — the
devices, mounts and environment those ids stand for, through nodeagent.additions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cri import types as t
from nodeagent.additions import AdditionsAccess, ContainerAdditions
from nodeagent.model import Pod
from plugins.dra.cdi import CdiSpecs
from plugins.dra.claims import PodClaim
from plugins.dra.state import ClaimCache


@dataclass
class Contribution:
    cdi_ids: list[str]
    devices: list[t.Device] = field(default_factory=list)
    mounts: list[t.Mount] = field(default_factory=list)
    envs: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)




def cdi_ids_per_container(pod: Pod, claims: Sequence[PodClaim], cache: ClaimCache) -> dict[str, list[str]]:
    """Container name → its CDI device ids, in the order of its resources.claims (the kubelet's
    GetResources: a device with no request names serves every request)."""
    by_entry = {c.pod_claim: c for c in claims}
    out: dict[str, list[str]] = {}
    for container in pod.all_containers():
        ids: list[str] = []
        for ref in container.resources.claims:
            pod_claim = by_entry.get(ref.name)
            entry = cache.entries.get(pod_claim.uid) if pod_claim is not None else None
            if entry is None:
                continue  # a template entry whose status says no claim is needed
            for device in entry.devices():
                if device.serves(ref.request):
                    ids.extend(device.cdi_device_ids)
        if ids:
            out[container.name] = list(dict.fromkeys(ids))
    return out


def resolve(ids: Mapping[str, list[str]], specs: CdiSpecs | None) -> dict[str, Contribution]:
    """CDI ids → CRI edits per container (``specs`` None: the runtime resolves CDI itself).
    Raises CdiError."""
    out = {}
    for container, cdi_ids in ids.items():
        if specs is None:
            out[container] = Contribution(list(cdi_ids))
            continue
        edits = specs.resolve(cdi_ids)
        out[container] = Contribution(list(cdi_ids), edits.devices, edits.mounts, edits.envs, edits.skipped)
    return out


def apply(additions: AdditionsAccess, table: Mapping[str, Contribution]) -> None:
    """Replace what an earlier prepare contributed (a retry, an agent restart)."""
    additions.withdraw()
    for container, part in table.items():
        additions.set(container, ContainerAdditions(cdi_devices=[t.CDIDevice(name=i) for i in part.cdi_ids],
                                                    devices=list(part.devices), mounts=list(part.mounts),
                                                    envs=dict(part.envs)))

