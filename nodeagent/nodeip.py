"""The node's IP addresses, chosen as the kubelet chooses them (no cloud provider).

``--node-ip``: one address, or two of different families for a dual-stack node (the first is
the primary: the InternalIP listed first, the pods' hostIP). ``0.0.0.0`` or ``::`` (or
nothing) asks for detection, preferring that family (IPv4 unless ``::``):

1. the ``--hostname-override`` itself, when it is an IP address;
2. the node name's addresses from DNS, the first that is not loopback, link-local, multicast
   or unspecified and is assigned to an interface of this host;
3. the address of the interface the default route goes through.

Otherwise the kubelet fails with ``can't get ip address of node <name>``; so does this.
(Tests that run many agents on one host give ``--node-ip 127.0.0.1``.)
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_SIOCGIFADDR = 0x8915


class NodeIPError(ValueError):
    """No usable address, or a ``--node-ip`` the kubelet refuses (its words)."""


def parse_node_ip(text: str) -> list[Address]:
    """ParseNodeIPArgument: one address or a dual-stack pair (unspecified: detect)."""
    if not text.strip():
        return []
    parts = [p.strip() for p in text.split(",")]
    try:
        ips = [ipaddress.ip_address(p) for p in parts]
    except ValueError:
        bad = next(p for p in parts if not _is_ip(p))
        raise NodeIPError(f'could not parse --node-ip value "{bad}"') from None
    if len(ips) > 2:
        raise NodeIPError(f"could not parse --node-ip {text!r}: must contain either a single IP or a dual-stack pair "
                          "of IPs")
    if len(ips) == 2:
        if ips[0].version == ips[1].version:
            raise NodeIPError(f"could not parse --node-ip {text!r}: must contain either a single IP or a dual-stack "
                              "pair of IPs")
        if any(ip.is_unspecified for ip in ips):
            raise NodeIPError(f"could not parse --node-ip {text!r}: dual-stack --node-ip values may not contain "
                              "'0.0.0.0' or '::'")
    return ips


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _usable(ip: Address) -> bool:
    return not (ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified)


def local_addresses() -> set[Address]:
    """Every address assigned to an interface of this host (IPv4 by ioctl, IPv6 from /proc)."""
    found: set[Address] = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            found.add(ipaddress.IPv4Address(raw[20:24]))
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            hexaddr = line.split()[0]
            found.add(ipaddress.IPv6Address(bytes.fromhex(hexaddr)))
    except (OSError, ValueError, IndexError):
        pass
    return found


def _default_route_interface(version: int) -> str | None:
    try:
        if version == 4:
            for line in Path("/proc/net/route").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 7 and fields[1] == "00000000" and fields[7] == "00000000":
                    return fields[0]
        else:
            for line in Path("/proc/net/ipv6_route").read_text().splitlines():
                fields = line.split()
                if len(fields) >= 10 and fields[0] == "0" * 32 and fields[1] == "00" and fields[9] != "lo":
                    return fields[9]
    except OSError:
        return None
    return None


def _interface_addresses(name: str, version: int) -> list[Address]:
    if version == 4:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                return []
            return [ipaddress.IPv4Address(raw[20:24])]
    out: list[Address] = []
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 6 and fields[5] == name:
                out.append(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
    except (OSError, ValueError):
        pass
    return out


def default_route_address(version: int) -> Address | None:
    """ChooseHostInterface: a global address of the default route's interface."""
    name = _default_route_interface(version)
    if name is None:
        return None
    for ip in _interface_addresses(name, version):
        if _usable(ip):
            return ip
    return None


def _lookup(name: str) -> list[Address]:
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    out: list[Address] = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if ip not in out:
            out.append(ip)
    return out


def detect(node_name: str, hostname_override: str = "", *, prefer: int = 4,
           lookup: Callable[[str], Sequence[Address]] = _lookup,
           local: Callable[[], set[Address]] = local_addresses,
           default_route: Callable[[int], Address | None] = default_route_address) -> Address:
    """The kubelet's choice of the node's IP when none is given (see the module docstring)."""
    if hostname_override and _is_ip(hostname_override):
        return ipaddress.ip_address(hostname_override)
    assigned = local()
    candidates = [ip for ip in lookup(node_name) if _usable(ip) and ip in assigned]
    candidates.sort(key=lambda ip: ip.version != prefer)
    if candidates:
        return candidates[0]
    for version in (prefer, 6 if prefer == 4 else 4):
        found = default_route(version)
        if found is not None:
            return found
    raise NodeIPError(f"can't get ip address of node {node_name}. error: no default routes found in "
                      '"/proc/net/route" or "/proc/net/ipv6_route"')


def node_ips(node_ip: str, node_name: str, hostname_override: str = "") -> list[str]:
    """The node's addresses, primary first: ``--node-ip`` as given, detection otherwise."""
    ips = parse_node_ip(node_ip)
    if ips and not ips[0].is_unspecified:
        return [str(ip) for ip in ips]
    prefer = 6 if ips and ips[0].version == 6 else 4
    return [str(detect(node_name, hostname_override, prefer=prefer))]


__all__ = ["NodeIPError", "default_route_address", "detect", "local_addresses", "node_ips", "parse_node_ip"]
