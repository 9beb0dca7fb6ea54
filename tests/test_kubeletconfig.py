"""KubeletConfiguration v1beta1 as the 1.37 kubelet reads it (nodeagent/kubeletconfig): the
schema against the pinned Go source, defaulting, the strict decoder's and validation's words,
drop-ins, the command line, what is reported, config explain, and the docs table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.config import AgentConfig, ConfigError, build, read_sources
from nodeagent.kubeletconfig import defaults, flags, support
from nodeagent.kubeletconfig.decode import DecodeError, StrictDecodingError, decode
from nodeagent.kubeletconfig.schema import KubeletConfiguration
from nodeagent.kubeletconfig.validation import errors_of

REPO = Path(__file__).resolve().parent.parent
HEADER = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def _go_source(relative: str) -> str:
    """A file of the pinned Go modules (the module cache the control plane is built from)."""
    done = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True)
    path = Path(done.stdout.strip()) / relative
    if not path.exists():
        subprocess.run(["go", "mod", "download", "k8s.io/kubelet", "k8s.io/kubernetes"],
                       cwd=REPO / "conformance" / "k8s", check=True, capture_output=True)
    return path.read_text()


def _json_names(struct: str, source: str) -> set[str]:
    body = re.search(rf"^type {struct} struct \{{\n(.*?)^}}", source, re.M | re.S)
    assert body, struct
    lines = [line for line in body.group(1).splitlines() if not line.strip().startswith("//")]
    return {m for line in lines for m in re.findall(r'json:"([A-Za-z0-9]+)', line)}


def test_every_field_of_the_1_37_kubelet_is_in_the_schema_and_the_support_table() -> None:
    source = _go_source("k8s.io/kubelet@v0.37.2/config/v1beta1/types.go")
    go = _json_names("KubeletConfiguration", source)
    ours = {f.alias or name for name, f in KubeletConfiguration.model_fields.items()}
    assert go == ours, (sorted(go - ours), sorted(ours - go))
    assert len(go) == 126
    # Nested structs too.
    from nodeagent.kubeletconfig import schema
    for struct in ("KubeletAuthentication", "KubeletX509Authentication", "KubeletWebhookAuthentication",
                   "KubeletAnonymousAuthentication", "KubeletAuthorization", "KubeletWebhookAuthorization",
                   "MemorySwapConfiguration", "CrashLoopBackOffConfig", "UserNamespaces", "MemoryReservation",
                   "ShutdownGracePeriodByPodPriority"):
        model = getattr(schema, struct)
        assert _json_names(struct, source) == {f.alias or n for n, f in model.model_fields.items()}, struct
    # What nodeagent does with each: every top-level field has an entry, and only real fields do.
    assert {p.split(".")[0] for p in support.FIELDS} == go


def test_the_v1beta1_defaults_are_the_kubelets() -> None:
    d = defaults.defaulted().to_json()
    expected = {
        "enableServer": True, "syncFrequency": "1m0s", "fileCheckFrequency": "20s", "address": "0.0.0.0",
        "port": 10250, "readOnlyPort": 0, "registryPullQPS": 5, "registryBurst": 10, "eventRecordQPS": 50,
        "eventBurst": 100, "healthzPort": 10248, "healthzBindAddress": "127.0.0.1", "oomScoreAdj": -999,
        "clusterDomain": "", "streamingConnectionIdleTimeout": "4h0m0s", "nodeStatusUpdateFrequency": "10s",
        "nodeStatusReportFrequency": "5m0s", "nodeLeaseDurationSeconds": 40, "imageMinimumGCAge": "2m0s",
        "imageMaximumGCAge": "0s", "imageGCHighThresholdPercent": 85, "imageGCLowThresholdPercent": 80,
        "volumeStatsAggPeriod": "1m0s", "cgroupsPerQOS": True, "cgroupDriver": "cgroupfs", "cpuManagerPolicy": "none",
        "memoryManagerPolicy": "None", "topologyManagerPolicy": "none", "topologyManagerScope": "container",
        "runtimeRequestTimeout": "2m0s", "hairpinMode": "promiscuous-bridge", "maxPods": 110, "podPidsLimit": -1,
        "resolvConf": "/etc/resolv.conf", "cpuCFSQuota": True, "cpuCFSQuotaPeriod": "100ms",
        "nodeStatusMaxImages": 50, "maxOpenFiles": 1000000, "contentType": "application/vnd.kubernetes.protobuf",
        "kubeAPIQPS": 50, "kubeAPIBurst": 100, "serializeImagePulls": True, "failSwapOn": True,
        "containerLogMaxSize": "10Mi", "containerLogMaxFiles": 5, "containerLogMaxWorkers": 1,
        "containerLogMonitorInterval": "10s", "configMapAndSecretChangeDetectionStrategy": "Watch",
        "enforceNodeAllocatable": ["pods"], "seccompDefault": False, "failCgroupV1": True, "registerNode": True,
        "memoryReservationPolicy": "None", "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "podLogsDir": "/var/log/pods", "imagePullCredentialsVerificationPolicy": "NeverVerifyPreloadedImages",
        "crashLoopBackOff": {"maxContainerRestartPeriod": "5m0s"},
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%",
                         "imagefs.available": "15%", "imagefs.inodesFree": "5%"},
        "authentication": {"x509": {"clientCAFile": ""}, "webhook": {"enabled": True, "cacheTTL": "2m0s"},
                           "anonymous": {"enabled": False}},
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "5m0s", "cacheUnauthorizedTTL": "30s"}},
    }
    assert {k: d.get(k) for k in expected} == expected
    assert d["logging"]["format"] == "text" and d["logging"]["flushFrequency"] == "5s"
    # The rules that depend on other fields.
    kc = defaults.apply(KubeletConfiguration(node_status_update_frequency=20.0, max_parallel_image_pulls=3,
                                             pod_pids_limit=-7))
    assert (kc.node_status_report_frequency, kc.serialize_image_pulls, kc.pod_pids_limit) == (20.0, False, -1)
    off = defaults.apply(KubeletConfiguration(feature_gates={"KubeletCrashLoopBackOffMax": False,
                                                             "KubeletEnsureSecretPulledImages": False}))
    assert off.crash_loop_back_off.max_container_restart_period is None
    assert off.image_pull_credentials_verification_policy == ""
    # Without --config, the command line's defaults.
    legacy = defaults.legacy(defaults.apply(KubeletConfiguration()))
    assert (legacy.authentication.anonymous.enabled, legacy.authentication.webhook.enabled,
            legacy.authorization.mode, legacy.read_only_port) == (True, False, "AlwaysAllow", 10255)


@pytest.mark.parametrize(("body", "message"), [
    ("port: abc\n", "failed to decode: json: cannot unmarshal string into Go struct field KubeletConfiguration.port "
                    "of type int32"),
    ("syncFrequency: 10\n", "failed to decode: json: cannot unmarshal number into Go struct field "
                            "KubeletConfiguration.syncFrequency of type string"),
    ("syncFrequency: 1d\n", 'failed to decode: time: unknown unit "d" in duration "1d"'),
    ("maxPods: 1.5\n", "failed to decode: json: cannot unmarshal number 1.5 into Go struct field "
                       "KubeletConfiguration.maxPods of type int32"),
    ("authentication: {anonymous: {enabled: maybe}}\n",
     "failed to decode: json: cannot unmarshal string into Go struct field "
     "KubeletAnonymousAuthentication.authentication.anonymous.enabled of type bool"),
    ("fooBar: 1\nmaxpods: 3\nauthentication: {x509: {caFile: x}}\n",
     'strict decoding error: unknown field "fooBar", unknown field "maxpods", unknown field "authentication.x509.caFile"'),
    ("port: 1\nport: 2\n", 'strict decoding error: yaml: unmarshal errors:\n  line 4: key "port" already set in map'),
])
def test_the_strict_decoder_refuses_in_the_kubelets_words(body: str, message: str) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(HEADER + body)
    assert str(caught.value) == message
    assert isinstance(caught.value, StrictDecodingError) == message.startswith("strict")


def test_type_meta_and_empty_files_as_the_kubelet_says(tmp_path: Path) -> None:
    with pytest.raises(DecodeError, match="^failed to decode: Object 'Kind' is missing in"):
        decode("apiVersion: kubelet.config.k8s.io/v1beta1\nport: 1\n")
    with pytest.raises(DecodeError, match='no kind "KubeletConfiguration" is registered for version '
                                          '"kubelet.config.k8s.io/v1"'):
        decode("apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n")
    path = tmp_path / "config.yaml"
    path.write_text("")
    with pytest.raises(ConfigError) as caught:
        read_sources(path, None, strict_config=True)
    assert str(caught.value) == (f"failed to load kubelet config file, path: {path}, error: failed to load Kubelet "
                                 f'config file {path}, error kubelet config file "{path}" was empty')


def test_relative_paths_are_resolved_against_the_file() -> None:
    body = decode(HEADER + "staticPodPath: manifests\ntlsCertFile: pki/c.crt\npodLogsDir: /abs\n"
                  "authentication: {x509: {clientCAFile: ca.crt}}\n", Path("/etc/k/config.yaml"))
    assert body["staticPodPath"] == "/etc/k/manifests" and body["tlsCertFile"] == "/etc/k/pki/c.crt"
    assert body["authentication"]["x509"]["clientCAFile"] == "/etc/k/ca.crt" and body["podLogsDir"] == "/abs"


@pytest.mark.parametrize(("changes", "message"), [
    ({"max_pods": -1}, "invalid configuration: maxPods (--max-pods) -1 must not be a negative number"),
    ({"port": 70000}, "invalid configuration: port (--port) 70000 must be between 1 and 65535, inclusive"),
    ({"image_gc_low_threshold_percent": 90},
     "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 90 must be less than "
     "imageGCHighThresholdPercent (--image-gc-high-threshold) 85"),
    ({"run_once": True}, "invalid configuration: runOnce (--runOnce) true, Runonce mode has been deprecated and "
                         "should not be set"),
    ({"container_log_max_files": 1}, "invalid configuration: containerLogMaxFiles must be greater than 1"),
    ({"container_log_monitor_interval": 1.0},
     "invalid configuration: containerLogMonitorInterval must be a positive time duration greater than or equal "
     "to 3s"),
    ({"pod_logs_dir": "logs"}, 'invalid configuration: pod logs path "logs" must be absolute path'),
    ({"topology_manager_policy": "tight"},
     'invalid configuration: topologyManagerPolicy (--topology-manager-policy) "tight" must be one of: '
     '["none" "best-effort" "restricted" "single-numa-node"]'),
    ({"feature_gates": {"NoSuchGate": True}}, "unrecognized feature gate: NoSuchGate"),
    ({"feature_gates": {"NodeSwap": False}}, "cannot set feature gate NodeSwap to false, feature is locked to true"),
    ({"enforce_node_allocatable": ["pods", "none"]},
     'invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional '
     'enforcements when "none" is specified'),
    ({"shutdown_grace_period": 0.5},
     "invalid configuration: shutdownGracePeriod 500ms must be either zero or otherwise >= 1 sec"),
])
def test_validation_says_what_the_kubelet_says(changes: dict[str, object], message: str) -> None:
    kc = defaults.defaulted().model_copy(update=changes)
    assert message in errors_of(kc)
    assert errors_of(defaults.defaulted()) == []


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _load(argv: list[str], agent: Path | None = None) -> AgentConfig:
    command = flags.parse(argv)
    return build(command, read_sources(command.flags.config, agent, strict_config=True), kubelet_defaults=True)


def test_drop_ins_merge_in_lexical_order_and_flags_win(tmp_path: Path) -> None:
    config = _write(tmp_path / "config.yaml", HEADER + "maxPods: 20\nclusterDNS: [10.96.0.10]\n"
                    "featureGates: {KubeletCrashLoopBackOffMax: true}\nsystemReserved: {cpu: 100m, memory: 1Gi}\n")
    drop = tmp_path / "conf.d"
    _write(drop / "20-pods.conf", HEADER + "maxPods: 30\nregisterNode: false\n")
    _write(drop / "10-dns.conf", HEADER + "maxPods: 25\nclusterDNS: [10.0.0.10]\nclusterDomain: example.org\n")
    _write(drop / "15" / "nested.conf", HEADER + "clusterDomain: nested.example\n")
    _write(drop / "30-unset.conf", HEADER + "clusterDNS: null\n")
    _write(drop / "99-ignored.yaml", HEADER + "maxPods: 99\n")
    loaded = _load([f"--config={config}", f"--config-dir={drop}", "--max-pods=40",
                    "--feature-gates=KubeletEnsureSecretPulledImages=true", "--system-reserved=cpu=200m"])
    kc = loaded.kubelet
    assert kc.max_pods == 40  # flags last
    assert kc.cluster_domain == "nested.example"  # 15/nested.conf after 10-dns.conf, as WalkDir walks
    assert kc.cluster_dns is None  # a null in a merge patch removes the field
    assert kc.register_node is False
    # Feature gates merge key by key; any other map flag replaces the field.
    assert kc.feature_gates == {"KubeletCrashLoopBackOffMax": True, "KubeletEnsureSecretPulledImages": True}
    assert kc.system_reserved == {"cpu": "200m"}
    assembled = loaded.assembled
    assert assembled is not None
    origins = {path: str(origin) for path, origin in assembled.origins.items()}
    assert origins["maxPods"] == "flag --max-pods"
    assert origins["clusterDomain"] == f"drop-in {drop / '15' / 'nested.conf'}"
    assert origins["registerNode"] == f"drop-in {drop / '20-pods.conf'}"
    assert [p.name for p in assembled.skipped] == ["99-ignored.yaml"]


def test_drop_ins_need_their_type_meta(tmp_path: Path) -> None:
    drop = tmp_path / "conf.d"
    _write(drop / "10.conf", "maxPods: 3\n")
    with pytest.raises(ConfigError, match=r"failed to load kubelet dropin file, path: .*10.conf, no apiVersion/kind"):
        _load([f"--config-dir={drop}"])
    _write(drop / "10.conf", "apiVersion: v1\nkind: ConfigMap\n")
    with pytest.raises(ConfigError, match="unknown apiVersion/kind: v1, Kind=ConfigMap"):
        _load([f"--config-dir={drop}"])


def test_kubeadms_flags_parse_and_removed_ones_fail_as_the_kubelets() -> None:
    command = flags.parse(["--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                           "--kubeconfig=/etc/kubernetes/kubelet.conf", "--config=/var/lib/kubelet/config.yaml",
                           "--hostname-override=Node-A", "--register-with-taints=dedicated=gpu:NoSchedule,spot:NoExecute",
                           "--container-runtime-endpoint", "unix:///run/containerd/containerd.sock",
                           "--node-ip=10.0.0.5,fd00::5", "--node-labels=tier=gpu", "--cert-dir=/var/lib/kubelet/pki",
                           "--root-dir=/var/lib/kubelet", "--v=2", "--runtime-cgroups=/system.slice/containerd.service"])
    assert command.flags.hostname_override == "Node-A" and command.flags.node_ip == "10.0.0.5,fd00::5"
    assert command.config["registerWithTaints"] == [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                                                    {"key": "spot", "value": "", "effect": "NoExecute"}]
    assert command.config["logging"] == {"verbosity": 2}
    assert ("Flag --register-with-taints has been deprecated, This parameter should be set via the config file "
            "specified by the Kubelet's --config flag.") in command.warnings[0]
    for argv, message in ((["--pod-infra-container-image=registry.k8s.io/pause:3.10"],
                           "unknown flag: --pod-infra-container-image"),
                          (["--register-schedulable=false"], "unknown flag: --register-schedulable"),
                          (["--node-ip"], "flag needs an argument: --node-ip"),
                          (["--max-pods=many"], 'invalid argument "many" for "--max-pods" flag: strconv.ParseInt: '
                                                'parsing "many": invalid syntax'),
                          (["-q"], "unknown shorthand flag: 'q' in -q"),
                          (["--rotate-certificates", "false"], "unknown command false")):
        with pytest.raises(flags.FlagError) as caught:
            flags.parse(argv)
        assert str(caught.value) == message


def test_the_kubelet_entry_point_fails_as_the_kubelet_does(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "nodeagent", "kubelet",
                           "--pod-infra-container-image=registry.k8s.io/pause:3.10"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: failed to parse kubelet flag: unknown flag: --pod-infra-container-image"
    labels = subprocess.run([sys.executable, "-m", "nodeagent", "kubelet", "--node-labels=node-role.kubernetes.io/gpu=",
                             f"--root-dir={tmp_path}"], capture_output=True, text=True, cwd=REPO)
    assert labels.returncode == 1
    assert ("Error: failed to validate kubelet flags: unknown 'kubernetes.io' or 'k8s.io' labels specified with "
            "--node-labels: [node-role.kubernetes.io/gpu]") in labels.stderr


def test_only_fields_off_their_default_are_reported(tmp_path: Path) -> None:
    plain = _write(tmp_path / "plain.yaml", HEADER + "failSwapOn: true\ncgroupDriver: cgroupfs\n")
    assert _load([f"--config={plain}"]).unsupported_fields() == {}
    odd = _write(tmp_path / "odd.yaml", HEADER + "cgroupDriver: systemd\nregistryPullQPS: 10\n"
                 "failSwapOn: false\nmaxPods: 30\nimageGCHighThresholdPercent: 90\n")
    # failSwapOn: false is what nodeagent does anyway; maxPods and imageGC* (the gc stage) are honoured.
    assert _load([f"--config={odd}"]).unsupported_fields() == {"cgroupDriver": "systemd",
                                                               "registryPullQPS": 10}


def test_config_explain_shows_each_fields_source_and_what_nodeagent_does(tmp_path: Path) -> None:
    config = _write(tmp_path / "config.yaml", HEADER + "cgroupDriver: systemd\nclusterDNS: [10.96.0.10]\n")
    drop = tmp_path / "conf.d"
    _write(drop / "10.conf", HEADER + "maxPods: 12\n")
    done = subprocess.run([sys.executable, "-m", "nodeagent", "config", "explain", "-o", "json", "--config",
                           str(config), "--config-dir", str(drop), "--node-ip", "10.1.2.3", "--healthz-port", "0"],
                          capture_output=True, text=True, cwd=REPO, check=True)
    rows = {r["field"]: r for r in json.loads(done.stdout)["kubeletConfiguration"]}
    assert rows["cgroupDriver"] == {"field": "cgroupDriver", "value": "systemd", "source": f"file {config}",
                                    "nodeagent": "unsupported", "note": support.FIELDS["cgroupDriver"].note,
                                    "reported": True}
    assert rows["clusterDNS"]["nodeagent"] == "honoured" and not rows["clusterDNS"]["reported"]
    assert rows["maxPods"]["source"] == f"drop-in {drop / '10.conf'}"
    assert rows["healthzPort"]["source"] == "flag --healthz-port"
    assert rows["syncFrequency"]["source"] == "default" and rows["syncFrequency"]["value"] == "1m0s"
    table = subprocess.run([sys.executable, "-m", "nodeagent", "config", "explain", "--config", str(config)],
                           capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert re.search(r"^! cgroupDriver +\"systemd\" +file .*unsupported: pod cgroups use the cgroupfs layout",
                     table, re.M), table


def test_docs_carry_the_compatibility_table() -> None:
    docs = (REPO / "docs" / "cluster-mode.md").read_text()
    assert support.render_table() in docs, "docs/cluster-mode.md: paste nodeagent.kubeletconfig.support.render_table()"


def test_nodeagents_earlier_format_still_loads(tmp_path: Path) -> None:
    legacy = _write(tmp_path / "agent.yaml", "nodeName: n1\nstaticPodPath: /etc/kubernetes/manifests\n"
                    "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\nmaxPods: 30\n"
                    "fileCheckFrequency: 5\ncdiSpecDirs: [/etc/cdi]\nallowPrivileged: false\n"
                    "profile: {admit: [podsecurity, noderesources]}\n")
    command = flags.parse([])
    config = build(command, read_sources(legacy, None, strict_config=False))
    assert (config.node_name, config.kubelet.max_pods, config.kubelet.file_check_frequency) == ("n1", 30, 5.0)
    assert config.plugins == {"dra": {"cdiSpecDirs": ["/etc/cdi"]}, "podsecurity": {"allowPrivileged": False}}
    assert config.profile == {"admit": ["podsecurity", "noderesources"]}
    # nodeagent's mode-dependent defaults, not the kubelet file's.
    assert config.kubelet.enable_server is None and config.kubelet.authorization.mode is None
    assert config.kubelet.cluster_domain == "cluster.local"


def test_both_documents_in_one_file(tmp_path: Path) -> None:
    both = _write(tmp_path / "node.yaml", HEADER + "maxPods: 7\n---\napiVersion: nodeagent.io/v1alpha1\n"
                  "kind: NodeAgentConfiguration\nlogFormat: json\nkubeletFlags: {hostnameOverride: From-File}\n"
                  "plugins: {gang: {recheckSeconds: 2}}\n")
    command = flags.parse([])
    config = build(command, read_sources(both, None, strict_config=False))
    assert (config.kubelet.max_pods, config.log_format, config.node_name) == (7, "json", "from-file")
    assert config.kubelet.enable_server is True  # a KubeletConfiguration: the kubelet's defaults
    given = flags.parse(["--hostname-override=from-flag"])
    assert build(given, read_sources(both, None, strict_config=False)).node_name == "from-flag"


def test_plugin_sections_are_validated_by_the_plugins_model(tmp_path: Path) -> None:
    agent = _write(tmp_path / "agent.yaml", "apiVersion: nodeagent.io/v1alpha1\nkind: NodeAgentConfiguration\n"
                   "plugins:\n  gang: {recheckSeconds: -1, unknownThing: 1}\n  volumes: {x: 1}\n")
    done = subprocess.run([sys.executable, "-m", "nodeagent", "plugins", "--agent-config", str(agent)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2, done
    assert "invalid configuration for plugin 'gang':" in done.stderr
    assert "plugins.gang.recheckSeconds: Input should be greater than 0" in done.stderr
    assert "plugins.gang.unknownThing: Extra inputs are not permitted" in done.stderr
    listing = subprocess.run([sys.executable, "-m", "nodeagent", "plugins"], capture_output=True, text=True,
                             cwd=REPO, check=True).stdout
    assert "dra (DraConfig):" in listing and "cdiSpecDirs: list[Path] = ['/etc/cdi', '/var/run/cdi']" in listing
    assert "pluginsRegistryDir" not in listing  # the core's (NodeAgentConfiguration), not a plugin's
    assert "volumes (NoConfig):" in listing and "This plugin takes no configuration of its own." in listing


@pytest.mark.parametrize("doc", ["README.md", "docs/PLUGINS.md", "docs/DRA.md", "docs/NODE.md",
                                 "examples/required-label/README.md"])
def test_the_configurations_the_docs_show_load(doc: str, tmp_path: Path) -> None:
    from nodeagent.registry import configuration, discover

    text = (REPO / doc).read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "NodeAgentConfiguration" in b]
    assert blocks, doc
    installed = discover()
    for block in blocks:
        path = _write(tmp_path / "config.yaml", block)
        config = build(flags.parse([]), read_sources(path, None, strict_config=False))
        for name, section in config.plugins.items():
            if name in installed:
                configuration(name, installed[name].load(), section)


def test_honoured_fields_reach_what_uses_them(tmp_path: Path) -> None:
    """tlsMinVersion (the kubelet API), syncFrequency (apivolumes' resync), podsPerCore (pods)."""
    import ssl
    from types import SimpleNamespace

    from nodeagent.kubeletserver.certs import CertificateError, server_context, serving_pair
    from plugins.apivolumes import Settings
    from plugins.apivolumes import plugin as apivolumes

    config = AgentConfig(root_dir=tmp_path, node_ip="10.1.2.3", tls_min_version="VersionTLS13", sync_frequency=30)
    cert, key = serving_pair(config)
    assert server_context(cert, key, None, min_version=config.kubelet.tls_min_version).minimum_version \
        is ssl.TLSVersion.TLSv1_3
    assert server_context(cert, key, None).minimum_version is ssl.TLSVersion.TLSv1_2
    with pytest.raises(CertificateError, match="unrecognized TLS version: VersionTLS99"):
        server_context(cert, key, None, min_version="VersionTLS99")
    handle = SimpleNamespace(settings=config.node_config())
    assert apivolumes(Settings(), handle)._resync == 30.0  # type: ignore[arg-type]
    assert apivolumes(Settings(resync_seconds=5), handle)._resync == 5.0  # type: ignore[arg-type]


def _stages(config: AgentConfig) -> dict[str, object]:
    """The stages the agent builds from ``config`` (factories do no I/O)."""
    from nodeagent.agent import Agent

    return dict(Agent(config, verbose=False).load_pipeline().stages)


def test_the_node_managers_read_the_kubelets_fields_at_the_top_level(tmp_path: Path) -> None:
    """eviction, gc and shutdown act on the KubeletConfiguration's own fields (and the kubelet's
    container GC flags); their plugin sections hold only nodeagent's knobs."""
    from nodeagent.agent import node_allocatable

    both = _write(tmp_path / "node.yaml", HEADER +
                  "evictionHard: {memory.available: 1Gi}\nmergeDefaultEvictionSettings: true\n"
                  "evictionSoft: {nodefs.available: 20%}\nevictionSoftGracePeriod: {nodefs.available: 1m30s}\n"
                  "evictionPressureTransitionPeriod: 30s\nevictionMaxPodGracePeriod: 7\n"
                  "localStorageCapacityIsolation: false\n"
                  "imageGCHighThresholdPercent: 70\nimageGCLowThresholdPercent: 60\nimageMinimumGCAge: 5m\n"
                  "imageMaximumGCAge: 48h\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n"
                  "volumeStatsAggPeriod: 15s\ncgroupsPerQOS: false\nenforceNodeAllocatable: []\nenableServer: false\n"
                  "---\napiVersion: nodeagent.io/v1alpha1\nkind: NodeAgentConfiguration\neventedRelistPeriod: 3s\n"
                  "plugins:\n  eviction: {evictionMonitoringPeriod: 2s}\n  gc: {imageGCPeriod: 1m}\n"
                  "  shutdown: {shutdownTrigger: request-file}\n")
    config = build(flags.parse(["--maximum-dead-containers-per-container=3", "--minimum-container-ttl-duration=1m"]),
                   read_sources(both, None, strict_config=False))
    stages = _stages(config.replace(root_dir=tmp_path))
    eviction = stages["eviction"].config  # type: ignore[attr-defined]
    assert eviction.hard() == {**defaults.DEFAULT_EVICTION_HARD, "memory.available": "1Gi"}
    assert (eviction.eviction_soft, eviction.eviction_soft_grace_period) == ({"nodefs.available": "20%"},
                                                                             {"nodefs.available": "1m30s"})
    assert (eviction.eviction_pressure_transition_period, eviction.eviction_max_pod_grace_period) == (30.0, 7)
    assert (eviction.local_storage_capacity_isolation, eviction.eviction_monitoring_period) == (False, 2.0)
    gc = stages["gc"].config  # type: ignore[attr-defined]
    assert (gc.image_gc_high_threshold_percent, gc.image_gc_low_threshold_percent) == (70, 60)
    assert (gc.image_minimum_gc_age, gc.image_maximum_gc_age, gc.image_gc_period) == (300.0, 172800.0, 60.0)
    assert (gc.maximum_dead_containers_per_container, gc.minimum_container_ttl_duration) == (3, 60.0)
    shutdown = stages["shutdown"].config  # type: ignore[attr-defined]
    assert [(g.priority, g.shutdown_grace_period_seconds) for g in shutdown.groups()] == [(0, 20),
                                                                                          (2_000_000_000, 10)]
    assert shutdown.shutdown_trigger == "request-file"
    assert (config.kubelet.volume_stats_agg_period, config.kubelet.cgroups_per_qos) == (15.0, False)
    assert config.agent.evented_relist_period == 3.0
    # The kubelet keeps evictionHard's memory.available out of allocatable (1Gi here, not 100Mi).
    default = node_allocatable(AgentConfig())["memory"]
    assert default - node_allocatable(config)["memory"] == 2**30 - 100 * 2**20
    # Without a KubeletConfiguration field, the kubelet's defaults.
    plain = _stages(AgentConfig(root_dir=tmp_path))
    assert plain["eviction"].config.hard() == defaults.DEFAULT_EVICTION_HARD  # type: ignore[attr-defined]
    assert plain["gc"].config.image_gc_high_threshold_percent == 85  # type: ignore[attr-defined]
    assert plain["shutdown"].config.groups() == []  # type: ignore[attr-defined]


def test_a_kubelet_field_in_a_plugin_section_is_refused_with_where_it_belongs(tmp_path: Path) -> None:
    agent = _write(tmp_path / "agent.yaml", "apiVersion: nodeagent.io/v1alpha1\nkind: NodeAgentConfiguration\n"
                   "plugins:\n  eviction: {evictionHard: {memory.available: 1Gi}}\n")
    done = subprocess.run([sys.executable, "-m", "nodeagent", "plugins", "--agent-config", str(agent)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2, done
    assert ("plugins.eviction.evictionHard: a KubeletConfiguration field: set it at the top level of the "
            "KubeletConfiguration") in done.stderr


def test_the_earlier_format_sends_the_node_managers_kubelet_fields_to_the_kubelet_configuration(
        tmp_path: Path) -> None:
    """nodeagent's earlier format took them in the plugin sections; they still load, each in its home."""
    legacy = _write(tmp_path / "agent.yaml", "nodeName: n1\nvolumeStatsAggPeriod: 1s\neventedRelistPeriod: 2s\n"
                    "plugins:\n  eviction: {evictionMonitoringPeriod: 1s, evictionHard: {memory.available: 0%}}\n"
                    "  gc: {imageGCHighThresholdPercent: 100, maximumDeadContainersPerContainer: 0, "
                    "imageGCPeriod: 1s}\n  shutdown: {shutdownGracePeriod: 12s, shutdownTrigger: request-file}\n")
    config = build(flags.parse([]), read_sources(legacy, None, strict_config=False))
    assert config.kubelet.eviction_hard == {"memory.available": "0%"}
    assert (config.kubelet.image_gc_high_threshold_percent, config.kubelet.shutdown_grace_period) == (100, 12.0)
    assert config.flags.maximum_dead_containers_per_container == 0
    assert (config.kubelet.volume_stats_agg_period, config.agent.evented_relist_period) == (1.0, 2.0)
    assert config.plugins == {"eviction": {"evictionMonitoringPeriod": "1s"}, "gc": {"imageGCPeriod": "1s"},
                              "shutdown": {"shutdownTrigger": "request-file"}}
    flat = AgentConfig(plugins={"eviction": {"evictionHard": {"memory.available": "0%"}}})
    assert flat.kubelet.eviction_hard == {"memory.available": "0%"} and flat.plugins == {"eviction": {}}


def test_a_configuration_written_as_a_file_reads_back_the_same(tmp_path: Path) -> None:
    """AgentConfig.to_yaml: what tests and benchmarks hand an agent they start as a process. Its
    model dump does not load (sections are not a file's documents); this does, unchanged."""
    config = AgentConfig(node_name="n1", kubeconfig=tmp_path / "node.kubeconfig", root_dir=tmp_path / "root",
                         container_runtime_endpoint="unix:///run/c.sock", static_pod_path=tmp_path / "manifests",
                         healthz_port=0, max_pods=12, plugins_registry_dir=tmp_path / "registry",
                         plugins={"gang": {"graceSeconds": 5}}, node_status_update_frequency=1.0)
    path = _write(tmp_path / "agent.yaml", config.to_yaml())
    back = build(flags.parse([f"--config={path}"]), read_sources(path, None, strict_config=False))
    # The command-line settings travel in the file's kubeletFlags and come back as the flags.
    assert back.agent.model_copy(update={"kubelet_flags": config.agent.kubelet_flags}) == config.agent
    assert back.flags.model_copy(update={"config": None}) == config.flags
    # Cluster mode: the mode-dependent fields come out as a file's defaults give them.
    assert back.kubelet.model_copy(update={"authentication": config.kubelet.authentication,
                                           "authorization": config.kubelet.authorization,
                                           "enable_server": config.kubelet.enable_server}) == config.kubelet
    assert (back.kubelet.authorization.mode, back.kubelet.authentication.webhook.enabled,
            back.kubelet.enable_server) == ("Webhook", True, True)
