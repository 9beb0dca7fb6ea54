"""The container and pod spec the kubelet's way, checked from inside busybox containers on the
real containerd: env and $(VAR) expansion, the downward API, command/args, workingDir,
security contexts, host namespaces, names and /etc/hosts, DNS, sysctls, cgroup resources."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nodeagent import labels as L
from nodeagent.kube import env as env_module
from nodeagent.kube import resources
from nodeagent.kube.security import normalize_sysctl
from nodeagent.model import Pod
from nodeagent.sources.static import ManifestError, parse_documents
from plugins.podsecurity import SysctlAllowlist
from plugins.runtime import hosts
from tests.agent_helpers import (
    BUSYBOX_IMAGE,
    AgentEnv,
    running_agent,
    wait_for,
)

pytestmark = pytest.mark.anyio

SLEEP = "exec sleep 3600"


def container(name: str, command: str = SLEEP, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX_IMAGE, "command": ["sh", "-c", command], **fields}


def pod(name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    metadata = {"name": name, **spec.pop("metadata", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"terminationGracePeriodSeconds": 1, "containers": list(containers), **spec}}


async def container_id(env: AgentEnv, pod_name: str, name: str, timeout: float = 45.0) -> str:
    async def running() -> str | None:
        for c in await env.running_containers(pod_name):
            if c.labels.get(L.CONTAINER_NAME) == name:
                return c.id
        return None

    found: str = await wait_for(running, timeout, f"container {name} of pod {pod_name} running")
    return found


async def run_in(env: AgentEnv, pod_name: str, name: str, *cmd: str) -> tuple[int, str]:
    """ExecSync in the running container: exit code and stdout (stripped)."""
    result = await env.client.exec_sync(await container_id(env, pod_name, name), list(cmd), timeout=10)
    return result.exit_code, result.stdout.decode().strip()


async def output(env: AgentEnv, pod_name: str, name: str, *cmd: str) -> str:
    code, out = await run_in(env, pod_name, name, *cmd)
    assert code == 0, f"{cmd} exited {code}: {out}"
    return out


async def _at_least(counters: dict[str, int], kind: str, n: int) -> bool:
    return counters.get(kind, 0) >= n


def env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


# --- environment, downward API, command/args, workingDir ---------------------------------


async def test_env_expansion_downward_api_command_args_and_working_dir(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        main = container(
            "main",
            workingDir="/etc",
            env=[
                {"name": "FOO", "value": "foo-value"},
                {"name": "FOOBAR", "value": "$(FOO);;$(BAR)"},  # BAR is declared later: stays literal
                {"name": "BAR", "value": "bar-value"},
                {"name": "ESCAPED", "value": "$$(FOO)"},
                {"name": "COMPOSED", "value": "$(FOO)-$(BAR)-$(MISSING)"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
                {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "CPU_REQUEST", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
                {"name": "MEMORY_REQUEST_MI",
                 "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}}},
                {"name": "MEMORY_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
            ],
            resources={"requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"cpu": "1250m"}},
        )
        # command ["sh", "-c"] with the script in args: both expand; the single quotes keep the
        # shell from touching what the escape left behind.
        main["command"] = ["sh", "-c"]
        main["args"] = ["echo '$(FOO)|$(NOPE)' > /tmp/args; echo '$$(FOO)' >> /tmp/args; pwd > /tmp/pwd; " + SLEEP]
        # args alone replace the image's CMD (busybox has no ENTRYPOINT).
        args_only = {"name": "argsonly", "image": BUSYBOX_IMAGE, "args": ["sh", "-c", "echo from-args > /tmp/o; " + SLEEP]}
        env.write("e.yaml", pod("envpod", main, args_only, serviceAccountName="robot",
                                metadata={"labels": {"app": "web"}, "annotations": {"note": "hi there"}}))
        # Neither command nor args: the image's CMD (busybox: sh, which exits at once).
        env.write("d.yaml", pod("imagedefault", {"name": "main", "image": BUSYBOX_IMAGE}, restartPolicy="Never"))
        values = env_of(await output(env, "envpod", "main", "env"))
        node = env.config.node_name
        assert values["FOO"] == "foo-value" and values["BAR"] == "bar-value"
        assert values["FOOBAR"] == "foo-value;;$(BAR)"
        assert values["ESCAPED"] == "$(FOO)"
        assert values["COMPOSED"] == "foo-value-bar-value-$(MISSING)"
        assert values["POD_NAME"] == f"envpod-{node}" and values["POD_NAMESPACE"] == "default"
        assert values["POD_UID"] == env.uid_of("envpod")
        assert values["APP"] == "web" and values["NOTE"] == "hi there"
        assert values["NODE"] == node and values["SA"] == "robot"
        assert values["HOST_IP"] == env.config.node_ip
        status = env.status_of("envpod")
        assert values["POD_IP"] and values["POD_IP"] == status.get("podIP", values["POD_IP"])
        assert values["POD_IPS"] == values["POD_IP"]
        # Rounded up with divisor 1 (the conformance test's 1250m → 2, 250m → 1).
        assert values["CPU_LIMIT"] == "2" and values["CPU_REQUEST"] == "1"
        assert values["MEMORY_REQUEST_MI"] == "32"
        # An unset limit is the node's allocatable.
        assert values["MEMORY_LIMIT"] == str(env.agent.node.allocatable["memory"])

        assert await output(env, "envpod", "main", "cat", "/tmp/args") == "foo-value|$(NOPE)\n$(FOO)"
        assert await output(env, "envpod", "main", "cat", "/tmp/pwd") == "/etc"
        assert await output(env, "envpod", "argsonly", "cat", "/tmp/o") == "from-args"

        async def succeeded() -> dict[str, Any] | None:
            status = env.status_of("imagedefault")
            return status if status.get("phase") == "Succeeded" else None

        status = await wait_for(succeeded, 30, "the image-default pod Succeeded")
        assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


# --- security contexts -------------------------------------------------------------------


def cap_effective(status: str) -> int:
    line = next(line for line in status.splitlines() if line.startswith("CapEff:"))
    return int(line.split()[1], 16)


def status_field(status: str, field: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith(field + ":"))


CAP_CHOWN, CAP_NET_ADMIN = 0, 12


async def test_security_context_user_groups_rootfs_capabilities_privileged(containerd: Any, tmp_path: Path) -> None:
    root = {"runAsUser": 0}
    async with running_agent(containerd, tmp_path) as env:
        env.write("sec.yaml", pod(
            "sec",
            container("podlevel"),
            container("user", securityContext={"runAsUser": 1234, "runAsGroup": 5678}),
            container("nonroot", securityContext={"runAsNonRoot": True, "runAsUser": 1000}),
            container("ro", securityContext={**root, "readOnlyRootFilesystem": True}),
            container("caps", securityContext={**root, "capabilities": {"drop": ["CHOWN"], "add": ["NET_ADMIN"]},
                                               "allowPrivilegeEscalation": False}),
            container("plain", securityContext=root),
            container("priv", securityContext={**root, "privileged": True}),
            container("seccomp", securityContext={"seccompProfile": {"type": "RuntimeDefault"}}),
            securityContext={"runAsUser": 4321, "supplementalGroups": [3000], "fsGroup": 2000},
        ))
        env.write("nonroot.yaml", pod("rootimage", container("main", securityContext={"runAsNonRoot": True})))

        assert await output(env, "sec", "podlevel", "id", "-u") == "4321"  # the pod's runAsUser
        assert await output(env, "sec", "user", "id", "-u") == "1234"  # the container's wins
        assert await output(env, "sec", "user", "id", "-g") == "5678"
        groups = (await output(env, "sec", "user", "id", "-G")).split()
        assert "2000" in groups and "3000" in groups  # fsGroup and supplementalGroups
        assert await output(env, "sec", "nonroot", "id", "-u") == "1000"

        code, _ = await run_in(env, "sec", "ro", "touch", "/probe")
        assert code != 0, "a read-only root filesystem must refuse writes"
        assert (await run_in(env, "sec", "plain", "touch", "/probe"))[0] == 0

        caps = await output(env, "sec", "caps", "cat", "/proc/self/status")
        plain = await output(env, "sec", "plain", "cat", "/proc/self/status")
        assert not cap_effective(caps) & (1 << CAP_CHOWN) and cap_effective(caps) & (1 << CAP_NET_ADMIN)
        assert cap_effective(plain) & (1 << CAP_CHOWN) and not cap_effective(plain) & (1 << CAP_NET_ADMIN)
        assert status_field(caps, "NoNewPrivs") == "1"  # allowPrivilegeEscalation: false
        assert status_field(plain, "NoNewPrivs") == "0"  # unset: the kubelet leaves it off
        assert (await run_in(env, "sec", "caps", "chown", "1", "/tmp"))[0] != 0
        # seccompProfile passed through; without one (and without seccompDefault) Unconfined.
        assert status_field(await output(env, "sec", "seccomp", "cat", "/proc/self/status"), "Seccomp") == "2"
        assert status_field(plain, "Seccomp") == "0"

        # PrivilegedPod: only the privileged container may change the network (a veth pair:
        # this kernel has no dummy links).
        add = ("ip", "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
        assert (await run_in(env, "sec", "plain", *add))[0] != 0
        assert (await run_in(env, "sec", "priv", *add))[0] == 0
        await output(env, "sec", "priv", "ip", "link", "del", "probe0")

        # runAsNonRoot with an image that runs as root: the kubelet's CreateContainerConfigError.
        async def refused() -> dict[str, Any] | None:
            statuses = env.status_of("rootimage").get("containerStatuses") or [{}]
            waiting = statuses[0].get("state", {}).get("waiting", {})
            return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

        waiting = await wait_for(refused, 45, "rootimage waiting with CreateContainerConfigError")
        assert "container has runAsNonRoot and image will run as root" in waiting["message"]
        assert not await env.running_containers("rootimage")


async def test_node_settings_privileged_unsafe_sysctls_and_cluster_dns(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path, allow_privileged=False, cluster_dns=["10.96.0.10"]) as env:
        env.write("p.yaml", pod("priv", container("main", securityContext={"privileged": True})))
        env.write("s.yaml", pod("unsafe", container("main"),
                                securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "10000"}]}))
        env.write("h.yaml", pod("hostnet", container("main"), hostNetwork=True,
                                securityContext={"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}))
        env.write("ok.yaml", pod("ok", container("main", securityContext={"privileged": False})))

        async def failed(name: str) -> dict[str, Any] | None:
            status = env.status_of(name)
            return status if status.get("phase") == "Failed" else None

        status = await wait_for(lambda: failed("priv"), 30, "privileged pod rejected")
        assert status["reason"] == "Forbidden"
        assert status["message"].endswith(f'pod with UID "{env.uid_of("priv")}" specified privileged container, '
                                          "but is disallowed")
        status = await wait_for(lambda: failed("unsafe"), 30, "unsafe sysctl rejected")
        assert status["reason"] == "SysctlForbidden"
        assert status["message"].endswith('forbidden sysctl: "kernel.msgmax" not allowlisted')
        # A namespaced sysctl with the host's namespace is refused by the API server's validation,
        # which static pods get: the manifest is rejected, nothing runs. (Admission's own check,
        # the kubelet's, stays for pods the API accepted before it had that rule.)
        await wait_for(lambda: _at_least(env.agent.metrics.counters, "ManifestRejected", 1), 30,
                       "net sysctl with hostNetwork rejected")
        assert env.uid_of("hostnet") is None and not await env.running_containers("hostnet")
        with pytest.raises(ManifestError, match=r"^.*/h\.yaml: line \d+, column \d+: spec\.securityContext\.sysctls\[0\]"
                                                r"\.name: Invalid value: \"net\.ipv4\.tcp_syncookies\": may not be "
                                                r"specified when 'hostNetwork' is true$"):
            parse_documents(env.manifests / "h.yaml", (env.manifests / "h.yaml").read_text(), env.node, 0.0)
        assert SysctlAllowlist([]).check("net.ipv4.tcp_syncookies", host_net=True, host_ipc=False) == \
            '"net.ipv4.tcp_syncookies" not allowed with host Net enabled'
        assert not await env.running_containers("priv")
        # dnsPolicy ClusterFirst with the node's clusterDNS: the cluster's server and search path.
        resolv = (await output(env, "ok", "main", "cat", "/etc/resolv.conf")).splitlines()
        assert [line for line in resolv if line.startswith("nameserver")] == ["nameserver 10.96.0.10"]
        search = next(line for line in resolv if line.startswith("search")).split()
        assert search[1:4] == ["default.svc.cluster.local", "svc.cluster.local", "cluster.local"]
        assert "options ndots:5" in resolv


# --- namespaces, names, /etc/hosts, DNS, sysctls -----------------------------------------


def host_ns(kind: str) -> str:
    return os.readlink(f"/proc/self/ns/{kind}")


async def test_host_namespaces_and_shared_process_namespace(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("h.yaml", pod("hostns", container("main"), hostNetwork=True, hostPID=True, hostIPC=True))
        env.write("i.yaml", pod("isolated", container("main")))
        env.write("s.yaml", pod("shared", container("one"), container("two"), shareProcessNamespace=True))

        for kind in ("net", "pid", "ipc"):
            assert await output(env, "hostns", "main", "readlink", f"/proc/self/ns/{kind}") == host_ns(kind)
            assert await output(env, "isolated", "main", "readlink", f"/proc/self/ns/{kind}") != host_ns(kind)
        # The host network: the node's interfaces, among them this containerd's bridge.
        links = await output(env, "hostns", "main", "cat", "/proc/net/dev")
        assert containerd.bridge_name in links
        assert containerd.bridge_name not in await output(env, "isolated", "main", "cat", "/proc/net/dev")
        # A host-network pod's /etc/hosts is the node's, under the kubelet's host-network header.
        hosts = await output(env, "hostns", "main", "cat", "/etc/hosts")
        assert hosts.startswith("# Kubernetes-managed hosts file (host network).\n")
        assert Path("/etc/hosts").read_text().strip() in hosts

        # One PID namespace per container, or one for the pod (whose PID 1 is the pause process).
        assert "sleep" in await output(env, "isolated", "main", "cat", "/proc/1/cmdline")
        assert "pause" in await output(env, "shared", "one", "cat", "/proc/1/cmdline")
        one = await output(env, "shared", "one", "readlink", "/proc/self/ns/pid")
        assert one == await output(env, "shared", "two", "readlink", "/proc/self/ns/pid")


async def test_hostname_fqdn_etc_hosts_dns_and_sysctls(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        node = env.config.node_name
        env.write("n.yaml", pod(
            "named", container("main"), hostname="myhost", subdomain="sub",
            hostAliases=[{"ip": "123.45.67.89", "hostnames": ["foo", "bar"]}, {"ip": "10.1.2.3", "hostnames": ["baz"]}],
            securityContext={"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"},
                                         {"name": "net/ipv4/ip_unprivileged_port_start", "value": "100"}]},
        ))
        env.write("f.yaml", pod("fqdn", container("main"), subdomain="t", setHostnameAsFQDN=True))
        env.write("d.yaml", pod("dns", container("main"), dnsPolicy="None", dnsConfig={
            "nameservers": ["10.0.0.53"], "searches": ["a.example", "b.example"],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}))
        env.write("o.yaml", pod("override", container("main"), hostname="ignored", subdomain="sub",
                                hostnameOverride="override.example.host"))
        long_name = "hostfqdnveryveryveryverylongforfqdntobemorethan64bytes"
        env.write("l.yaml", pod(long_name, container("main"), subdomain="t", setHostnameAsFQDN=True))

        fqdn = "myhost.sub.default.svc.cluster.local"
        assert await output(env, "named", "main", "hostname") == "myhost"
        assert await output(env, "named", "main", "hostname", "-f") == fqdn  # resolved through /etc/hosts
        pod_ip = (await output(env, "named", "main", "sh", "-c", "ip -4 -o addr show eth0")).split()[3].split("/")[0]
        expected = ("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"
                    "::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\n"
                    "fe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n"
                    f"{pod_ip}\t{fqdn}\tmyhost\n\n# Entries added by HostAliases.\n"
                    "123.45.67.89\tfoo\tbar\n10.1.2.3\tbaz\n")
        assert await output(env, "named", "main", "cat", "/etc/hosts") == expected.strip()
        assert (env.config.root_dir / "pods" / str(env.uid_of("named")) / "etc-hosts").read_text() == expected

        assert await output(env, "named", "main", "cat", "/proc/sys/kernel/shm_rmid_forced") == "1"
        assert await output(env, "named", "main", "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start") == "100"
        # ClusterFirst without cluster DNS: the node's resolver (the kubelet's fallback to Default).
        host_servers = [line.split()[1] for line in Path("/etc/resolv.conf").read_text().splitlines()
                        if line.startswith("nameserver")]
        resolv = await output(env, "named", "main", "cat", "/etc/resolv.conf")
        assert [line.split()[1] for line in resolv.splitlines() if line.startswith("nameserver")] == host_servers

        fq = f"fqdn-{node}.t.default.svc.cluster.local"
        assert await output(env, "fqdn", "main", "hostname") == fq  # setHostnameAsFQDN
        assert await output(env, "fqdn", "main", "hostname", "-f") == fq

        # hostnameOverride wins over hostname and subdomain, verbatim and without a domain.
        assert await output(env, "override", "main", "hostname") == "override.example.host"
        assert await output(env, "override", "main", "hostname", "-f") == "override.example.host"

        lines = (await output(env, "dns", "main", "cat", "/etc/resolv.conf")).splitlines()
        assert "nameserver 10.0.0.53" in lines and "search a.example b.example" in lines
        assert "options ndots:2 edns0" in lines
        assert not [line for line in lines if line.startswith("nameserver") and line != "nameserver 10.0.0.53"]

        # An FQDN longer than the kernel's 64 bytes: the sandbox is refused, the pod waits.
        async def refused() -> dict[str, Any] | None:
            for e in env.agent.trace.chain(f"default/{long_name}-{node}"):
                if e["kind"] == "PodWaiting" and e["reason"] == "FailedCreatePodSandBox":
                    return e
            return None

        event = await wait_for(refused, 30, "FailedCreatePodSandBox for the long FQDN")
        assert event["message"].startswith("Failed to create pod sandbox: failed to construct FQDN from pod hostname "
                                           "and cluster domain, FQDN ")
        assert env.status_of(long_name)["phase"] == "Pending"


# --- resources ---------------------------------------------------------------------------


async def test_resources_reach_the_cgroup_and_oom_score(containerd: Any, tmp_path: Path) -> None:
    burstable = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "2Gi"}}
    guaranteed = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}
    async with running_agent(containerd, tmp_path) as env:
        env.write("b.yaml", pod("burst", container("main", resources=burstable)))
        env.write("g.yaml", pod("guar", container("main", resources=guaranteed)))
        env.write("e.yaml", pod("best", container("main")))

        # cgroup v1 without a cgroup namespace: runc mounts the container's own cgroup at
        # /sys/fs/cgroup/<controller> (its path on the host is in /proc/self/cgroup).
        async def cgroup(name: str, path: str) -> str:
            return await output(env, name, "main", "cat", f"/sys/fs/cgroup/{path}")

        assert await cgroup("burst", "cpu/cpu.shares") == "256"  # 250m * 1024 / 1000
        assert await cgroup("burst", "cpu/cpu.cfs_quota_us") == "50000"  # 500m of a 100 ms period
        assert await cgroup("burst", "cpu/cpu.cfs_period_us") == "100000"
        assert await cgroup("burst", "memory/memory.limit_in_bytes") == str(2 * 2**30)
        assert await cgroup("best", "cpu/cpu.shares") == "2"  # MinShares
        assert await cgroup("best", "cpu/cpu.cfs_quota_us") == "-1"
        assert await cgroup("guar", "memory/memory.limit_in_bytes") == str(64 * 2**20)

        # QoS OOM scores; containerd (restrict_oom_score_adj) never goes below its own.
        burst_adj = 1000 - 1000 * 2**30 // resources.memory_capacity()
        assert await output(env, "burst", "main", "cat", "/proc/self/oom_score_adj") == str(burst_adj)
        assert await output(env, "best", "main", "cat", "/proc/self/oom_score_adj") == "1000"
        pid = containerd.pid()
        floor = int(Path(f"/proc/{pid}/oom_score_adj").read_text()) if pid else -1000
        assert await output(env, "guar", "main", "cat", "/proc/self/oom_score_adj") == str(max(-997, floor))
        assert env.status_of("guar")["qosClass"] == "Guaranteed"


# The stage contract for podsecurity runs in tests/test_contract.py (TestPodSecurityContract).


# --- the kubelet's formulas, without a runtime -------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("$(A)", "a"), ("___$(B)___", "___b___"), ("$(A)-$(A)", "a-a"), ("$$(B)_$(A)", "$(B)_a"),
    ("$$$(A)", "$a"), ("$(EMPTY)x", "x"), ("$(UNSET)", "$(UNSET)"), ("$(A", "$(A"), ("$A", "$A"),
    ("$", "$"), ("$$", "$"), ("$$$", "$$"), ("$()", "$()"), ("f-$$A", "f-$A"), ("$(A)$(B", "a$(B"),
])
def test_expansion_follows_the_kubelet(text: str, expected: str) -> None:
    assert env_module.expand(text, env_module.mapping_for({"A": "a", "B": "b", "EMPTY": ""})) == expected


def test_downward_maps_are_go_quoted_and_sysctls_normalised() -> None:
    assert env_module.format_map({"b": "x\ny", "a": 'say "hi"'}) == 'a="say \\"hi\\""\nb="x\\ny"'
    assert normalize_sysctl("kernel/shm_rmid_forced") == "kernel.shm_rmid_forced"
    assert normalize_sysctl("net/ipv4/conf/eno2.100/rp_filter") == "net.ipv4.conf.eno2/100.rp_filter"
    assert normalize_sysctl("net.ipv4.conf.eno2/100.rp_filter") == "net.ipv4.conf.eno2/100.rp_filter"


def _pod(*resource_sets: dict[str, Any], **spec: Any) -> Pod:
    containers = [{"name": f"c{i}", "image": "i", "resources": r} for i, r in enumerate(resource_sets)]
    return Pod.model_validate({"metadata": {"name": "p"}, "spec": {"containers": containers, **spec}})


def test_qos_oom_score_and_cpu_follow_the_kubelet() -> None:
    gib = 2**30
    guaranteed = _pod({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1000m"}})
    assert resources.qos_class(guaranteed) == "Guaranteed"  # 1 == 1000m; requests default to limits
    assert resources.oom_score_adj(guaranteed, guaranteed.spec.containers[0], 10 * gib) == -997
    best = _pod({})
    assert resources.qos_class(best) == "BestEffort"
    assert resources.oom_score_adj(best, best.spec.containers[0], 10 * gib) == 1000
    burst = _pod({"requests": {"memory": "1Gi"}}, {"requests": {"memory": "1"}}, {"requests": {"memory": "20Gi"}})
    adj = [resources.oom_score_adj(burst, c, 10 * gib) for c in burst.spec.containers]
    assert adj == [900, 999, 3]  # 1000 - 1000*req/capacity, kept within [3, 999]
    critical = _pod({}, priorityClassName="system-node-critical")
    assert resources.oom_score_adj(critical, critical.spec.containers[0], gib) == -997
    tiny = resources.linux_resources(_pod({"limits": {"cpu": "1m"}}).spec.containers[0])
    assert (tiny.cpu_shares, tiny.cpu_quota, tiny.cpu_period) == (2, 1000, 100_000)  # MinShares, min quota


def test_dns_config_merges_over_the_policy() -> None:
    p = Pod.model_validate({"metadata": {"name": "p", "namespace": "ns"}, "spec": {
        "containers": [{"name": "c", "image": "i"}],
        "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["ns.svc.example", "x.example"],
                      "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}})
    config = hosts.pod_dns(p, cluster_dns=["10.0.0.10"], cluster_domain="example")
    assert config.servers == ["10.0.0.10", "1.1.1.1"]
    assert config.searches[:4] == ["ns.svc.example", "svc.example", "example", "x.example"]
    assert config.options == ["ndots:2", "edns0"]  # the pod's ndots replaces ClusterFirst's 5
    assert hosts.managed_hosts(["10.0.0.5"], "h", "", []).endswith("fe00::2\tip6-allrouters\n10.0.0.5\th\n")
