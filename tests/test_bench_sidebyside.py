"""The pure parts of the side-by-side benchmark (benchmarks.pod_start --peer kubelet): statistics,
/proc parsing, the teardown predicate, the per-round ratios and goals, the kubelet's config.
No runtime and no kubelet: the benchmark itself is run by hand (benchmarks/RESULTS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import kubelet_peer, sidebyside
from benchmarks.pod_start import is_stopped, stat_cpu_ticks
from benchmarks.stats import median, merge, pct
from controlplane.kubeletconfig import kubelet_config
from cri import types as t

MiB = 2**20


def test_pct_is_density_test_index() -> None:
    # element ceil(n*p/100) - 1 of the sorted list: of 1..10, p50 is 5, p95 and p99 are 10
    values = [float(v) for v in range(10, 0, -1)]
    assert pct(values, 50) == 5.0
    assert pct(values, 95) == 10.0
    assert pct(values, 99) == 10.0
    assert pct([3.0], 99) == 3.0
    assert pct([], 50) is None
    # of 30 values p99 is the largest, of 110 the 109th
    assert pct(range(1, 111), 99) == 109


def test_median_skips_missing() -> None:
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0]) == 1.0  # the lower one of an even count
    assert median([None, None]) is None


def test_merge_takes_median_of_rounds_that_have_a_figure() -> None:
    # The kubelet's runtime may not be empty within the timeout in a round (None); the median is
    # then of the other rounds, whichever round it was (the first one included).
    rounds: list[dict[str, Any]] = [
        {"n": 30, "kubelet": {"teardown_seconds": None, "per_pod_seen": [1.0]}, "vs_kubelet": {"empty": None}},
        {"n": 30, "kubelet": {"teardown_seconds": 40.0, "per_pod_seen": [2.0]}, "vs_kubelet": {"empty": 0.2}},
        {"n": 30, "kubelet": {"teardown_seconds": 20.0, "per_pod_seen": [3.0]}, "vs_kubelet": {"empty": 0.4}},
    ]
    merged = merge(rounds)
    assert merged["n"] == 30
    assert merged["kubelet"]["teardown_seconds"] == 20.0
    assert merged["vs_kubelet"]["empty"] == 0.2
    assert merged["kubelet"]["per_pod_seen"] == [1.0, 2.0, 3.0]  # pooled


def test_merge_keeps_keys_only_later_rounds_have() -> None:
    merged = merge([{"a": 1.0}, {"a": 3.0, "b": 2.0}, {"a": 2.0}])
    assert merged == {"a": 2.0, "b": 2.0}


def test_stat_cpu_ticks_after_the_last_parenthesis() -> None:
    # comm may hold spaces and ")": fields are counted after the last ")"
    fields = ["S", "1", "2", "3", "0", "-1", "4194560", "10", "0", "0", "0",
              "150", "50", "7", "3", "20", "0", "12"]
    line = "4242 (kube let) (x)) " + " ".join(fields) + "\n"
    assert stat_cpu_ticks(line) == 200
    assert stat_cpu_ticks(line, children=True) == 210


def _container(state: t.ContainerState) -> t.Container:
    return t.Container(id="c", state=state)


def _sandbox(state: t.PodSandboxState) -> t.PodSandbox:
    return t.PodSandbox(id="s", state=state)


def test_is_stopped() -> None:
    exited, running = t.ContainerState.CONTAINER_EXITED, t.ContainerState.CONTAINER_RUNNING
    ready, notready = t.PodSandboxState.SANDBOX_READY, t.PodSandboxState.SANDBOX_NOTREADY
    assert is_stopped([], [])
    # what the kubelet leaves until its container GC: a stopped sandbox, nothing running
    assert is_stopped([_sandbox(notready)], [_container(exited)])
    assert not is_stopped([_sandbox(notready)], [_container(running)])
    assert not is_stopped([_sandbox(ready)], [])


def _record(start: float, per_pod: list[float], *, stopped: float, empty: float | None, cpu_start: float,
            cpu_stop: float, rss_mib: float, idle: float = 0.01, steady_cpu: float = 0.5) -> dict[str, Any]:
    return {"start_seconds": start, "per_pod_seen": per_pod, "stopped_seconds": stopped, "teardown_seconds": empty,
            "cpu_start": cpu_start, "cpu_stop": cpu_stop, "rss_idle": rss_mib * MiB, "rss_running": rss_mib * MiB,
            "hwm": rss_mib * MiB, "cores_idle": idle, "steady": {"seconds": 10.0, "cpu": steady_cpu}}


def test_peer_ratios_are_nodeagent_over_kubelet() -> None:
    agent = _record(3.0, [1.0, 2.0, 3.0], stopped=6.0, empty=6.5, cpu_start=0.9, cpu_stop=0.3, rss_mib=80)
    kubelet = _record(2.0, [1.0, 1.5, 2.0], stopped=4.0, empty=None, cpu_start=0.6, cpu_stop=0.6, rss_mib=100)
    q = sidebyside.peer_ratios(agent, kubelet, 3)
    assert q["start"] == pytest.approx(1.5)
    assert q["per_pod_p99"] == pytest.approx(1.5)
    assert q["stopped"] == pytest.approx(1.5)
    assert q["empty"] is None  # the kubelet's runtime was not empty in time: no ratio
    assert q["cpu_ms_per_start"] == pytest.approx(1.5)
    assert q["cpu_ms_per_stop"] == pytest.approx(0.5)
    assert q["rss_at_n"] == pytest.approx(0.8)
    assert q["cores_at_n"] == pytest.approx(1.0)


def test_net_cpu_less_idle_rate() -> None:
    # 0.5 s of CPU over a 2 s phase with 0.05 cores idle: 0.4 s net, over 4 pods 100 ms each
    assert sidebyside.net_ms_per_pod(0.5, 0.05, 2.0, 4) == pytest.approx(100.0)
    assert sidebyside.net_ms_per_pod(0.05, 0.1, 2.0, 1) == 0.0  # never below zero
    assert sidebyside.net_ms_per_pod(0.5, None, 2.0, 1) is None


def test_goal_verdicts() -> None:
    results = [
        {"n": 30, "vs_kubelet": {"per_pod_p99": 0.9, "cpu_ms_per_start": 1.2, "stopped": 1.05, "rss_at_n": 0.7}},
        {"n": 110, "vs_kubelet": {"per_pod_p99": 1.1, "cpu_ms_per_start": 0.9, "stopped": 1.0, "rss_at_n": 0.8}},
    ]
    verdicts = {goal.metric: (values, met) for goal, values, met in sidebyside.goal_verdicts(results)}
    assert verdicts["per_pod_p99"] == ([(30, 0.9), (110, 1.1)], False)
    assert verdicts["rss_at_n"] == ([(110, 0.8)], True)
    assert verdicts["cpu_ms_per_start"] == ([(30, 1.2), (110, 0.9)], False)  # size 1 not measured
    assert verdicts["stopped"] == ([(30, 1.05), (110, 1.0)], True)  # within 1.1x


def test_render_has_the_ratio_tables_only_with_a_peer() -> None:
    agent = _record(3.0, [3.0], stopped=6.0, empty=6.5, cpu_start=0.9, cpu_stop=0.3, rss_mib=80)
    kubelet = _record(2.0, [2.0], stopped=4.0, empty=40.0, cpu_start=0.6, cpu_stop=0.6, rss_mib=100)
    row = {"n": 1, "agent": agent, "kubelet": kubelet, "vs_kubelet": sidebyside.peer_ratios(agent, kubelet, 1)}
    text = "\n".join(sidebyside.render([row]))
    assert "| 1 | 2.00 / 3.00 | 1.50 |" in text
    assert "Issue 19's goals" in text
    assert sidebyside.render([{"n": 1, "agent": agent}]) == []


def test_kubelet_config_is_standalone_cgroupfs_on_v1(tmp_path: Path) -> None:
    cfg = kubelet_config(endpoint="unix:///run/x.sock", static_pod_path=tmp_path / "m",
                         pod_logs_dir=tmp_path / "logs", cgroup_root="/nodeagent-bench-k1",
                         port=10250, healthz_port=10248, max_pods=110, client_ca=None)
    assert cfg["kind"] == "KubeletConfiguration"
    assert cfg["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["failCgroupV1"] is False
    assert cfg["cgroupRoot"] == "/nodeagent-bench-k1"  # never the host's /kubepods
    assert cfg["staticPodPath"] == str(tmp_path / "m")
    assert cfg["containerRuntimeEndpoint"] == "unix:///run/x.sock"
    # no API server: nothing to authenticate against
    assert cfg["authentication"]["webhook"]["enabled"] is False
    assert cfg["authorization"]["mode"] == "AlwaysAllow"
    assert "kubeconfig" not in {k.lower() for k in cfg}


def test_kubelet_config_with_a_client_ca_is_a_kubeadm_nodes(tmp_path: Path) -> None:
    """The cluster-mode peer and the conformance run's node: authenticated, authorized through
    the API server, nothing anonymous, no read-only port."""
    cfg = kubelet_config(endpoint="unix:///run/x.sock", pod_logs_dir=tmp_path / "logs", cgroup_root="/k1",
                         port=10250, healthz_port=10248, client_ca=tmp_path / "ca.crt")
    assert cfg["authentication"] == {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                                     "x509": {"clientCAFile": str(tmp_path / "ca.crt")}}
    assert cfg["authorization"] == {"mode": "Webhook"}
    assert cfg["readOnlyPort"] == 0
    assert "address" not in cfg and "staticPodPath" not in cfg


def test_kubelet_argv_has_no_kubeconfig(tmp_path: Path) -> None:
    k = kubelet_peer.KubeletProcess(tmp_path, Path("/bin/kubelet"), "unix:///run/x.sock", max_pods=110)
    assert not any(a.startswith("--kubeconfig") for a in k.argv)  # standalone mode
    assert f"--hostname-override={k.node}" in k.argv
    assert k.cgroup_root.startswith("/nodeagent-bench-")
