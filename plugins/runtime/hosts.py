"""Names and resolution for a pod: hostname and FQDN, the kubelet-managed /etc/hosts and the
sandbox's DNS configuration (kubelet_pods.go, pkg/kubelet/util/util.go GetNodenameForKernel,
pkg/kubelet/network/dns/dns.go)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cri import types as t
from nodeagent.model import HostAlias, Pod

HOSTNAME_MAX = 63  # a DNS label; longer names are truncated, not refused
FQDN_MAX = 64  # the kernel's nodename field
MANAGED_HEADER = "# Kubernetes-managed hosts file.\n"
MANAGED_HEADER_HOST_NETWORK = "# Kubernetes-managed hosts file (host network).\n"
ETC_HOSTS = "/etc/hosts"
MAX_NAMESERVERS = 3  # validation.MaxDNSNameservers
MAX_SEARCHES = 32  # validation.MaxDNSSearchPaths
MAX_SEARCH_CHARS = 2048  # validation.MaxDNSSearchListChars
CLUSTER_FIRST_OPTIONS = ("ndots:5",)


class PodNameError(ValueError):
    """The pod's names cannot be used (an FQDN longer than the kernel allows)."""


def hostname_and_domain(pod: Pod, cluster_domain: str) -> tuple[str, str]:
    """GeneratePodHostNameAndDomain: spec.hostnameOverride as it is (and no domain), else
    spec.hostname or the pod name (truncated to 63, without a trailing '-' or '.'), and
    ``<subdomain>.<namespace>.svc.<clusterDomain>`` with a subdomain."""
    if pod.spec.hostname_override is not None:
        override = pod.spec.hostname_override
        if len(override) > HOSTNAME_MAX:
            override = override[:HOSTNAME_MAX].rstrip("-.")
        return override, ""
    hostname = pod.spec.hostname or pod.metadata.name
    if len(hostname) > HOSTNAME_MAX:
        hostname = hostname[:HOSTNAME_MAX].rstrip("-.")
    domain = ""
    if pod.spec.subdomain:
        domain = f"{pod.spec.subdomain}.{pod.metadata.namespace}.svc.{cluster_domain}"
    return hostname, domain


def kernel_hostname(pod: Pod, cluster_domain: str) -> str:
    """GetNodenameForKernel: the sandbox's UTS name; the FQDN with setHostnameAsFQDN."""
    hostname, domain = hostname_and_domain(pod, cluster_domain)
    if domain and pod.spec.set_hostname_as_fqdn:
        fqdn = f"{hostname}.{domain}"
        if len(fqdn) > FQDN_MAX:
            raise PodNameError(f"failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too "
                             f"long ({FQDN_MAX} characters is the max, {len(fqdn)} characters requested)")
        return fqdn
    return hostname


def _aliases(aliases: Sequence[HostAlias]) -> str:
    if not aliases:
        return ""
    lines = "".join(f"{a.ip}\t{chr(9).join(a.hostnames)}\n" for a in aliases)
    return "\n# Entries added by HostAliases.\n" + lines


def managed_hosts(pod_ips: Sequence[str], hostname: str, domain: str, aliases: Sequence[HostAlias]) -> str:
    """managedHostsFileContent, byte for byte."""
    text = (MANAGED_HEADER + "127.0.0.1\tlocalhost\n" + "::1\tlocalhost ip6-localhost ip6-loopback\n"
            + "fe00::0\tip6-localnet\n" + "fe00::0\tip6-mcastprefix\n" + "fe00::1\tip6-allnodes\n"
            + "fe00::2\tip6-allrouters\n")
    for ip in pod_ips:
        text += f"{ip}\t{hostname}.{domain}\t{hostname}\n" if domain else f"{ip}\t{hostname}\n"
    return text + _aliases(aliases)


def host_network_hosts(aliases: Sequence[HostAlias], node_hosts: Path = Path(ETC_HOSTS)) -> str:
    """nodeHostsFileContent: a host-network pod sees the node's file, plus its aliases."""
    return MANAGED_HEADER_HOST_NETWORK + node_hosts.read_text() + _aliases(aliases)


def hosts_content(pod: Pod, pod_ips: Sequence[str], cluster_domain: str) -> str | None:
    """What the pod's /etc/hosts holds; None when the kubelet would not mount one (a pod-network
    pod whose IP is not known yet)."""
    if pod.spec.host_network:
        return host_network_hosts(pod.spec.host_aliases)
    if not pod_ips:
        return None
    hostname, domain = hostname_and_domain(pod, cluster_domain)
    return managed_hosts(pod_ips, hostname, domain, pod.spec.host_aliases)


def ensure_hosts_file(path: Path, content: str) -> None:
    """ensureHostsFile: written in place (running containers bind-mount this inode), mode 0644."""
    try:
        if path.read_text() == content:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    os.chmod(path, 0o644)


# --- DNS -------------------------------------------------------------------------------


def _omit_duplicates(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def parse_resolv_conf(text: str) -> t.DNSConfig:
    """parseResolvConf: nameservers, the last search line (trailing dots and '.' dropped),
    options; 'domain' lines are ignored as the kubelet ignores them."""
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    for line in text.splitlines():
        if line.startswith(("#", ";")):
            continue
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "nameserver" and len(fields) >= 2:
            servers.append(fields[1])
        elif fields[0] == "search":
            searches = [s.rstrip(".") for s in fields[1:] if s != "."]
        elif fields[0] == "options":
            options.extend(fields[1:])
    return t.DNSConfig(servers=servers, searches=_omit_duplicates(searches), options=_omit_duplicates(options))


def host_dns(resolv_conf: Path = Path("/etc/resolv.conf")) -> t.DNSConfig:
    try:
        return parse_resolv_conf(resolv_conf.read_text())
    except OSError:
        return t.DNSConfig()


def _merge_options(existing: Sequence[str], pod_options: Sequence[tuple[str, str | None]]) -> list[str]:
    """mergeDNSOptions: the pod's options replace same-named ones."""
    merged: dict[str, str] = {}
    for op in existing:
        name, _, value = op.partition(":")
        merged[name] = value
    for name, maybe in pod_options:
        merged[name] = maybe or ""
    return [f"{k}:{v}" if v else k for k, v in merged.items()]


def _fit_searches(searches: list[str]) -> list[str]:
    searches = searches[:MAX_SEARCHES]
    while searches and len(" ".join(searches)) > MAX_SEARCH_CHARS:
        searches.pop()
    return searches


def pod_dns(pod: Pod, *, cluster_dns: Sequence[str] = (), cluster_domain: str = "",
            resolv_conf: Path = Path("/etc/resolv.conf")) -> t.DNSConfig:
    """GetPodDNS: None starts empty; ClusterFirst (or ClusterFirstWithHostNet) uses the cluster
    DNS servers and search path; ClusterFirst for a host-network pod, Default, and ClusterFirst
    without cluster DNS use the node's resolv.conf. The pod's dnsConfig is merged on top."""
    policy = pod.spec.dns_policy
    host = host_dns(resolv_conf)
    cluster = policy == "ClusterFirstWithHostNet" or (policy == "ClusterFirst" and not pod.spec.host_network)
    if policy == "None":
        config = t.DNSConfig()
    elif cluster and cluster_dns:
        searches = list(host.searches)
        if cluster_domain:
            ns = pod.metadata.namespace
            searches = _omit_duplicates([f"{ns}.svc.{cluster_domain}", f"svc.{cluster_domain}", cluster_domain,
                                         *host.searches])
        config = t.DNSConfig(servers=list(cluster_dns), searches=searches, options=list(CLUSTER_FIRST_OPTIONS))
    else:
        config = host
    extra = pod.spec.dns_config
    if extra is not None:
        config = t.DNSConfig(
            servers=_omit_duplicates([*config.servers, *extra.nameservers]),
            searches=_omit_duplicates([*config.searches, *extra.searches]),
            options=_merge_options(config.options, [(o.name, o.value) for o in extra.options]),
        )
    return t.DNSConfig(servers=config.servers[:MAX_NAMESERVERS], searches=_fit_searches(list(config.searches)),
                       options=list(config.options))
