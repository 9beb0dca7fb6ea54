"""Usage collection and the kubelet's read APIs built from it (issue 17 §1-2): a busy pod on the
real containerd shows non-zero CPU and memory in the Summary API shape and in
/metrics/resource (checked with prometheus_client's own parser); the node's figures come from
the root cgroup, /proc and statfs; volumes and logs are measured by walking them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.stats import UsageCollector, host, resource_metrics, summary
from nodeagent.stats.collector import dir_usage
from tests.agent_helpers import pod_manifest, running_agent, wait_for

pytestmark = pytest.mark.anyio


def test_host_figures_of_a_fixed_cgroup_v1_tree(tmp_path: Path) -> None:
    cgroup, proc = tmp_path / "cgroup", tmp_path / "proc"
    (cgroup / "cpuacct").mkdir(parents=True)
    (cgroup / "memory").mkdir()
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "net").mkdir()
    (cgroup / "cpuacct" / "cpuacct.usage").write_text("5000000000\n")
    (cgroup / "memory" / "memory.usage_in_bytes").write_text(f"{3 * 2**30}\n")
    (cgroup / "memory" / "memory.stat").write_text(f"total_inactive_file {2**30}\ntotal_rss {2**29}\n"
                                                    "total_pgfault 7\ntotal_pgmajfault 1\n")
    (proc / "meminfo").write_text(f"MemTotal: {8 * 2**20} kB\nMemFree: {4 * 2**20} kB\n")
    (proc / "sys" / "kernel" / "pid_max").write_text("4194304\n")
    (proc / "sys" / "kernel" / "threads-max").write_text("1000\n")
    (proc / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    (proc / "net" / "route").write_text("Iface Destination Gateway\neth0 00000000 0101A8C0\n")
    (proc / "net" / "dev").write_text("h1\nh2\n    lo: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n"
                                      "  eth0: 100 1 2 0 0 0 0 0 200 3 4 0 0 0 0 0\n")
    (proc / "1").mkdir()
    (proc / "22").mkdir()
    assert host.cpu_usage_ns(cgroup) == 5_000_000_000
    mem = host.memory(cgroup, proc)
    assert mem is not None and mem.working_set_bytes == 2 * 2**30 and mem.available_bytes == 6 * 2**30
    assert (mem.rss_bytes, mem.page_faults, mem.major_page_faults) == (2**29, 7, 1)
    assert host.process_limits(proc) == (1000, 2)
    assert host.boot_time(proc) == 1700000000.0
    assert host.default_interface(proc) == "eth0"
    assert [(i.name, i.rx_bytes, i.tx_bytes) for i in host.interfaces(proc)] == [("eth0", 100, 200)]


def test_a_cgroup_v2_root(tmp_path: Path) -> None:
    cgroup, proc = tmp_path / "cgroup", tmp_path / "proc"
    cgroup.mkdir()
    proc.mkdir()
    (cgroup / "cgroup.controllers").write_text("cpu memory\n")
    (cgroup / "cpu.stat").write_text("usage_usec 1500\nuser_usec 1000\n")
    (cgroup / "memory.stat").write_text(f"anon {2**20}\ninactive_file {2**20}\n")
    (proc / "meminfo").write_text(f"MemTotal: {4 * 2**10} kB\nMemFree: {1 * 2**10} kB\n")
    assert host.cpu_usage_ns(cgroup) == 1_500_000
    mem = host.memory(cgroup, proc)
    assert mem is not None and mem.usage_bytes == 3 * 2**20 and mem.working_set_bytes == 2 * 2**20


def test_directory_usage_counts_blocks_and_inodes_without_following_links(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 100_000)
    (tmp_path / "d" / "link").symlink_to("/usr")
    used, inodes = dir_usage(tmp_path)
    assert used >= 100_000 and inodes == 3


@pytest.mark.containerd
async def test_a_busy_pod_shows_in_the_summary_and_the_resource_metrics(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path) as env:
        env.write("busy.yaml", pod_manifest(
            "busy", "head -c 20000000 /dev/zero > /cache/blob; while :; do :; done",
            container={"volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
            volumes=[{"name": "cache", "emptyDir": {}}]))
        await env.wait_seen_running("busy")
        collector = UsageCollector(env.client, env.agent.relister, env.node, env.config.root_dir,
                                   env.config.pod_logs_dir, volume_stats_seconds=0.0)

        async def busy_measured() -> Any:
            usage = await collector.sample()
            pods = [p for p in usage.pods if p.name == f"busy-{env.node}"]
            if not pods or not pods[0].containers:
                return None
            c = pods[0].containers[0]
            ok = (c.cpu and c.cpu.usage_nano_cores and c.memory and c.memory.working_set_bytes
                  and pods[0].volumes and (pods[0].volumes[0].fs.used_bytes or 0) >= 20_000_000)
            return usage if ok else None

        usage = await wait_for(busy_measured, 60, "the busy pod's CPU rate, memory and emptyDir usage")
        doc = summary(usage, env.node)
        node = doc["node"]
        assert node["nodeName"] == env.node and node["cpu"]["usageCoreNanoSeconds"] > 0
        assert node["memory"]["workingSetBytes"] > 0 and node["memory"]["availableBytes"] > 0
        assert node["fs"]["capacityBytes"] > node["fs"]["availableBytes"] > 0
        assert node["runtime"]["imageFs"]["usedBytes"] > 0 and node["rlimit"]["maxpid"] > node["rlimit"]["curproc"] > 0
        [pod] = [p for p in doc["pods"] if p["podRef"]["name"] == f"busy-{env.node}"]
        [container] = pod["containers"]
        assert container["name"] == "main" and container["cpu"]["usageNanoCores"] > 100_000_000, \
            "a spinning shell uses more than a tenth of a core"
        assert container["memory"]["workingSetBytes"] > 0 and "rootfs" in container and "logs" in container
        assert pod["cpu"]["usageCoreNanoSeconds"] > 0 and pod["memory"]["workingSetBytes"] > 0
        [cache] = [v for v in pod["volume"] if v["name"] == "cache"]
        assert cache["usedBytes"] >= 20_000_000 and pod["ephemeral-storage"]["usedBytes"] >= 20_000_000
        small = summary(usage, env.node, only_cpu_and_memory=True)
        assert set(small["node"]) <= {"nodeName", "startTime", "cpu", "memory"}
        assert all(set(p) <= {"podRef", "startTime", "containers", "cpu", "memory"} for p in small["pods"])

        text = resource_metrics(usage)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["resource_scrape_error"].samples[0].value == 0
        cpu = [s for s in families["container_cpu_usage_seconds"].samples
               if s.labels == {"container": "main", "pod": f"busy-{env.node}", "namespace": "default"}]
        assert cpu and cpu[0].value > 0 and cpu[0].timestamp is not None
        assert families["node_memory_working_set_bytes"].samples[0].value > 0
        assert resource_metrics(None).startswith("# HELP resource_scrape_error")
        await anyio.sleep(0)
