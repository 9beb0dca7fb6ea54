"""What kubeadm 1.37 writes for a kubelet loads, unchanged, in nodeagent (issue 16 §1).

kubeadm is built from the pinned k8s.io/kubernetes (``python -m controlplane build kubeadm``;
about 40 s once the control plane has filled Go's build cache). Two of its outputs:

* ``kubeadm config print init-defaults --component-configs KubeletConfiguration``: the
  cluster-wide KubeletConfiguration (``0s`` durations and empty structs included);
* ``kubeadm init phase kubelet-start --dry-run``: the node's ``config.yaml`` (the
  ``instance-config.yaml`` patch already applied by kubeadm), ``instance-config.yaml`` and
  ``kubeadm-flags.env`` (``KUBELET_KUBEADM_ARGS``), written into a scratch directory
  (``KUBEADM_INIT_DRYRUN_DIR``), nothing outside it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from controlplane import build as cpbuild
from nodeagent.config import build, read_sources
from nodeagent.kubeletconfig import flags

KUBEADM_ARGS = "KUBELET_KUBEADM_ARGS="


@pytest.fixture(scope="module")
def kubeadm() -> Path:
    cpbuild.build(["kubeadm"])
    return cpbuild.binary("kubeadm")


def kubelet_configuration(text: str) -> str:
    """The KubeletConfiguration document of a multi-document YAML, as it is."""
    for doc in text.split("\n---\n"):
        if "kind: KubeletConfiguration" in doc:
            return doc if doc.endswith("\n") else doc + "\n"
    raise AssertionError(f"no KubeletConfiguration in\n{text}")


def test_kubeadm_init_defaults_load_unchanged(kubeadm: Path, tmp_path: Path) -> None:
    printed = subprocess.run([str(kubeadm), "config", "print", "init-defaults", "--component-configs",
                              "KubeletConfiguration"], capture_output=True, text=True, check=True).stdout
    config = tmp_path / "config.yaml"
    config.write_text(kubelet_configuration(printed))
    # kubeadm's own values, including what it writes as zero (the kubelet defaults those).
    assert "cacheTTL: 0s" in config.read_text() and "crashLoopBackOff: {}" in config.read_text()
    command = flags.parse([f"--config={config}"])
    loaded = build(command, read_sources(config, None, strict_config=True), kubelet_defaults=True)
    kc = loaded.kubelet
    assert kc.cluster_dns == ["10.96.0.10"] and kc.cluster_domain == "cluster.local"
    assert kc.rotate_certificates is True
    assert kc.authentication.x509.client_ca_file == "/etc/kubernetes/pki/ca.crt"
    assert kc.authentication.webhook.enabled is True and kc.authentication.anonymous.enabled is False
    assert kc.authorization.mode == "Webhook"
    assert kc.authentication.webhook.cache_ttl == 120.0  # 0s means the default
    assert kc.authorization.webhook.cache_authorized_ttl == 300.0
    assert kc.static_pod_path == "/etc/kubernetes/manifests"
    assert kc.healthz_bind_address == "127.0.0.1" and kc.healthz_port == 10248
    assert kc.container_runtime_endpoint == "unix:///run/containerd/containerd.sock"  # "" defaulted
    assert kc.logging.flush_frequency == 5.0  # flushFrequency: 0 (integer nanoseconds), defaulted
    assert kc.crash_loop_back_off.max_container_restart_period == 300.0
    # The one field kubeadm sets that nodeagent does not honour is what it reports.
    assert loaded.unsupported_fields() == {"cgroupDriver": "systemd"}


def test_kubeadm_kubelet_start_writes_what_the_kubelet_and_nodeagent_read(kubeadm: Path, tmp_path: Path) -> None:
    init = tmp_path / "init.yaml"
    init.write_text(yaml.safe_dump_all([
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
         "nodeRegistration": {"name": "kubeadm-node-a", "criSocket": "unix:///run/test/containerd.sock",
                              "kubeletExtraArgs": [{"name": "node-ip", "value": "10.0.0.5"}],
                              "taints": []}},
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration", "kubernetesVersion": "v1.37.2",
         "networking": {"serviceSubnet": "10.100.0.0/16", "dnsDomain": "corp.local"}},
    ]))
    out = tmp_path / "kubelet"
    out.mkdir()
    done = subprocess.run([str(kubeadm), "init", "phase", "kubelet-start", "--config", str(init), "--dry-run"],
                          capture_output=True, text=True, env={**os.environ, "KUBEADM_INIT_DRYRUN_DIR": str(out)})
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "instance-config.yaml", "kubeadm-flags.env"]
    # The runtime endpoint moved to instance-config.yaml, which kubeadm applies to config.yaml
    # itself: the kubelet (and nodeagent) read only config.yaml.
    assert (out / "instance-config.yaml").read_text() == 'containerRuntimeEndpoint: "unix:///run/test/containerd.sock"\n'
    env = (out / "kubeadm-flags.env").read_text().strip()
    assert env.startswith(KUBEADM_ARGS)
    kubeadm_args = shlex.split(env[len(KUBEADM_ARGS):].strip('"'))
    assert kubeadm_args == ["--hostname-override=kubeadm-node-a", "--node-ip=10.0.0.5"]
    # The unit's command line: kubeadm's kubeconfig and config flags, then KUBELET_KUBEADM_ARGS.
    argv = ["--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--kubeconfig=/etc/kubernetes/kubelet.conf", f"--config={out / 'config.yaml'}", *kubeadm_args]
    command = flags.parse(argv)
    loaded = build(command, read_sources(command.flags.config, None, strict_config=True), kubelet_defaults=True)
    assert loaded.kubelet.container_runtime_endpoint == "unix:///run/test/containerd.sock"
    assert loaded.kubelet.cluster_dns == ["10.100.0.10"] and loaded.kubelet.cluster_domain == "corp.local"
    assert loaded.node_name == "kubeadm-node-a" and loaded.node_ips == ["10.0.0.5"]
    assert loaded.flags.bootstrap_kubeconfig == Path("/etc/kubernetes/bootstrap-kubelet.conf")
