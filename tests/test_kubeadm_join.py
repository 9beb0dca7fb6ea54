"""A kubeadm-style join with nodeagent in the kubelet's place (issue 16, done-when).

The real control plane (a dedicated one: its controller-manager signs for two minutes, so that
certificates rotate within the test) with kubeadm's bootstrap-token authentication and RBAC; a
bootstrap token Secret; kubeadm's own output for the node (``kubeadm init phase kubelet-start``:
config.yaml and kubeadm-flags.env); and nodeagent started as the kubelet's unit starts the
kubelet, binary path changed, plus what an administrator adds (KUBELET_EXTRA_ARGS: the root and
certificate directories of this test, a drop-in directory moving ports and paths off the host's,
and nodeagent's own configuration). Then:

* the node asks for its client certificate with the bootstrap token, the controller-manager
  approves (csrapproving) and signs (csrsigning) it, the node registers and becomes Ready;
* the serving certificate comes from a kubernetes.io/kubelet-serving CSR approved with
  ``kubectl certificate approve``; the kubelet API presents it;
* a pod the scheduler places runs, ``kubectl logs`` and ``kubectl exec`` reach it through the
  node's detected InternalIP (the address of the default route's interface, as the kubelet finds it);
* the client certificate is renewed (self renewal, approved by the controller-manager) and so is
  the serving one, in the same process; the node stays Ready, its Lease renewed, new pods run.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from controlplane import build as cpbuild
from controlplane.cluster import ControlPlane, free_port
from cri import RuntimeClient
from nodeagent.certificates.pem import parse_certificate, split_pem
from tests.agent_helpers import BUSYBOX_IMAGE, runtime_objects, wait_for

REPO = Path(__file__).resolve().parent.parent
SIGNING = "2m0s"
"""--cluster-signing-duration: NotBefore is backdated 5 minutes, so a certificate lives 7 minutes
and is renewed 4.9 to 6.3 minutes after NotBefore: at most 78 s after it was issued."""


@pytest.fixture(scope="module")
def short_lived_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path_factory.mktemp("join-cp"),
                      extra_args={"kube-controller-manager": [f"--cluster-signing-duration={SIGNING}"]})
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


def kubectl_json(cp: ControlPlane, *args: str) -> Any:
    done = cp.kubectl(*args, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def wait(what: str, probe: Any, timeout: float, log: Path | None = None, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as exc:  # noqa: BLE001 - a probe that fails is a probe not yet true
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:]) if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})\n{tail}")


def ready(cp: ControlPlane, node: str) -> bool:
    obj = kubectl_json(cp, "get", "node", node)
    conditions = {c["type"]: c["status"] for c in ((obj or {}).get("status") or {}).get("conditions") or []}
    return conditions.get("Ready") == "True"


def csrs(cp: ControlPlane, signer: str, user: str | None = None) -> list[dict[str, Any]]:
    listed = kubectl_json(cp, "get", "csr") or {"items": []}
    return [c for c in listed["items"] if c["spec"]["signerName"] == signer
            and (user is None or c["spec"].get("username") == user)]


def approve_serving(cp: ControlPlane, node: str) -> list[str]:
    """What an operator does for kubelet-serving CSRs (the controller-manager never approves them)."""
    approved = []
    for csr in csrs(cp, "kubernetes.io/kubelet-serving", f"system:node:{node}"):
        if not (csr.get("status") or {}).get("conditions"):
            cp.kubectl("certificate", "approve", csr["metadata"]["name"])
            approved.append(csr["metadata"]["name"])
    return approved


def served_certificate(port: int, ca: Path) -> bytes:
    """The kubelet API's certificate, verified against the cluster CA (PEM)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False  # names are checked below
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der).encode()


def current_target(path: Path) -> str:
    return os.readlink(path) if path.is_symlink() else ""


def test_a_kubeadm_node_joins_with_a_bootstrap_token_and_rotates_its_certificates(
        short_lived_control_plane: ControlPlane, containerd: Any, tmp_path: Path) -> None:
    cp = short_lived_control_plane
    cpbuild.build(["kubeadm"])
    node = f"join-{uuid.uuid4().hex[:8]}"
    token_id = uuid.uuid4().hex[:6]
    bootstrap = cp.bootstrap_kubeconfig(f"bootstrap-{node}", token_id=token_id)

    # --- what kubeadm writes for this node -------------------------------------------------------
    init = tmp_path / "init.yaml"
    init.write_text(yaml.safe_dump_all([
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
         "nodeRegistration": {"name": node, "criSocket": containerd.endpoint, "taints": []}},
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration", "kubernetesVersion": "v1.37.2"},
    ]))
    kubelet_dir = tmp_path / "var-lib-kubelet"
    kubelet_dir.mkdir()
    subprocess.run([str(cpbuild.binary("kubeadm")), "init", "phase", "kubelet-start", "--config", str(init),
                    "--dry-run"], check=True, capture_output=True,
                   env={**os.environ, "KUBEADM_INIT_DRYRUN_DIR": str(kubelet_dir)})
    env_line = (kubelet_dir / "kubeadm-flags.env").read_text().strip()
    kubeadm_args = shlex.split(env_line.split("=", 1)[1].strip('"'))
    assert f"--hostname-override={node}" in kubeadm_args
    assert not [a for a in kubeadm_args if a.startswith("--node-ip")]  # the node's address is detected
    host_ip = default_route_address()

    # --- what the administrator adds (KUBELET_EXTRA_ARGS) ----------------------------------------
    root = tmp_path / "root"
    port, healthz = free_port(), free_port()
    dropins = tmp_path / "kubelet.conf.d"
    dropins.mkdir()
    (dropins / "50-this-host.conf").write_text(yaml.safe_dump({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "port": port, "healthzPort": healthz, "staticPodPath": str(tmp_path / "manifests"),
        "podLogsDir": str(tmp_path / "pods"), "authentication": {"x509": {"clientCAFile": str(cp.ca_file)}},
        "serverTLSBootstrap": True, "nodeStatusUpdateFrequency": "2s"}))
    (tmp_path / "manifests").mkdir()
    agent = tmp_path / "nodeagent.yaml"
    agent.write_text(yaml.safe_dump({
        "apiVersion": "nodeagent.io/v1alpha1", "kind": "NodeAgentConfiguration",
        "pluginsRegistryDir": str(tmp_path / "plugins_registry"),
        "plugins": {"logs": {"containerLogsSymlinkDir": str(tmp_path / "containers")}}}))
    kubeconfig = tmp_path / "etc-kubernetes" / "kubelet.conf"
    cert_dir = root / "pki"
    argv = [sys.executable, "-m", "nodeagent", "kubelet",
            f"--bootstrap-kubeconfig={bootstrap}", f"--kubeconfig={kubeconfig}",
            f"--config={kubelet_dir / 'config.yaml'}", *kubeadm_args,
            f"--root-dir={root}", f"--cert-dir={cert_dir}", f"--config-dir={dropins}", f"--agent-config={agent}"]
    log = tmp_path / "nodeagent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        # --- TLS bootstrap ------------------------------------------------------------------------
        client_csr = wait("the bootstrap CSR, approved and signed by the controller-manager", lambda: next(
            (c for c in csrs(cp, "kubernetes.io/kube-apiserver-client-kubelet", f"system:bootstrap:{token_id}")
             if (c.get("status") or {}).get("certificate")), None), 90, log)
        approved = {c["type"]: c for c in client_csr["status"]["conditions"]}["Approved"]
        assert approved["reason"] == "AutoApproved"
        assert approved["message"] == "Auto approving kubelet client certificate after SubjectAccessReview."
        assert sorted(client_csr["spec"]["usages"]) == ["client auth", "digital signature"]
        current = cert_dir / "kubelet-client-current.pem"
        wait("kubelet-client-current.pem", current.is_symlink, 30, log)
        first = current_target(current)
        assert Path(first).name.startswith("kubelet-client-20") and Path(first).stat().st_mode & 0o777 == 0o600
        cert = parse_certificate(split_pem(current.read_bytes())[0])
        assert (cert.common_name, cert.organizations) == (f"system:node:{node}", ("system:nodes",))
        written = yaml.safe_load(kubeconfig.read_text())
        assert written["users"] == [{"name": "default-auth", "user": {"client-certificate": str(current),
                                                                       "client-key": str(current)}}]
        assert written["current-context"] == "default-context"
        wait(f"node {node} Ready", lambda: ready(cp, node), 90, log)
        obj = kubectl_json(cp, "get", "node", node)
        labels = obj["metadata"]["labels"]
        for key in ("kubernetes.io/os", "beta.kubernetes.io/os", "kubernetes.io/arch", "beta.kubernetes.io/arch"):
            assert key in labels, labels
        assert obj["metadata"]["annotations"]["volumes.kubernetes.io/controller-managed-attach-detach"] == "true"
        # Detected as the kubelet does: the address of the default route's interface.
        assert {"type": "InternalIP", "address": host_ip} in obj["status"]["addresses"], obj["status"]["addresses"]
        # kubeadm's cgroupDriver: systemd is not honoured, and the Node says so once.
        def unsupported_events() -> list[dict[str, Any]]:
            found = kubectl_json(cp, "get", "events", "-A", "--field-selector",
                                 f"involvedObject.name={node},reason=NodeAgentConfigurationUnsupported") or {}
            return list(found.get("items") or [])

        events = wait("the NodeAgentConfigurationUnsupported Event", unsupported_events, 30, log)
        assert 'cgroupDriver="systemd"' in events[0]["message"] and events[0]["type"] == "Warning", events

        # --- the serving certificate ------------------------------------------------------------
        serving = wait("a kubelet-serving CSR", lambda: csrs(cp, "kubernetes.io/kubelet-serving",
                                                             f"system:node:{node}"), 60, log)
        assert sorted(serving[0]["spec"]["usages"]) == ["digital signature", "server auth"]
        assert not (serving[0].get("status") or {}).get("conditions")  # never approved by the controller
        approve_serving(cp, node)
        pem = wait("the kubelet API serving the approved certificate",
                   lambda: served_certificate(port, cp.ca_file), 60, log)
        served = parse_certificate(pem)
        assert served.common_name == f"system:node:{node}" and host_ip in served.ip_addresses
        assert node in served.dns_names

        # --- a scheduled pod, its logs and exec through the API server ------------------------------
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello", "namespace": "default"},
               "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                        "command": ["sh", "-c", "echo hello from $(hostname); sleep 3600"]}]}}
        cp.kubectl("apply", "-f", "-", input=json.dumps(pod))
        wait("pod hello Running", lambda: (kubectl_json(cp, "get", "pod", "hello") or {}).get(
            "status", {}).get("phase") == "Running", 90, log)
        wait("kubectl logs", lambda: "hello from hello" in cp.kubectl("logs", "hello", check=False).stdout, 30, log)
        approve_serving(cp, node)
        executed = cp.kubectl("exec", "hello", "--", "sh", "-c", "echo exec-ok $((6*7))", check=False)
        assert executed.stdout.strip() == "exec-ok 42", executed

        # --- rotation ---------------------------------------------------------------------------------
        def rotated() -> bool:
            approve_serving(cp, node)  # the serving certificate renews as well, and needs an approval
            return current_target(current) != first

        wait("the client certificate's renewal", rotated, 180, log, interval=2.0)
        renewal = [c for c in csrs(cp, "kubernetes.io/kube-apiserver-client-kubelet", f"system:node:{node}")
                   if (c.get("status") or {}).get("certificate")]
        assert renewal, "the renewal is requested with the node's own certificate (selfnodeclient)"
        assert {c["type"]: c for c in renewal[0]["status"]["conditions"]}["Approved"]["message"] == \
            "Auto approving self kubelet client certificate after SubjectAccessReview."
        rotated_at = time.time()

        def renewed_serving() -> bool:
            approve_serving(cp, node)
            return parse_certificate(served_certificate(port, cp.ca_file)).pem != served.pem

        wait("the kubelet API presenting a renewed serving certificate", renewed_serving, 180, log, interval=2.0)
        assert proc.poll() is None, "one process all along"

        def lease_renewed_after_rotation() -> bool:
            lease = kubectl_json(cp, "get", "lease", "-n", "kube-node-lease", node) or {}
            renew = lease.get("spec", {}).get("renewTime", "")
            return bool(renew) and datetime.fromisoformat(renew.replace("Z", "+00:00")).timestamp() > rotated_at
        wait("the Lease renewed after the rotation", lease_renewed_after_rotation, 60, log)
        assert ready(cp, node)
        # The pod source's watch still delivers: a new pod runs.
        cp.kubectl("apply", "-f", "-", input=json.dumps({**pod, "metadata": {"name": "after", "namespace": "default"}}))
        wait("pod after Running", lambda: (kubectl_json(cp, "get", "pod", "after") or {}).get(
            "status", {}).get("phase") == "Running", 90, log)
        assert "certificate rotated" in log.read_text()
    finally:
        # The agent tears its pods down before it stops (stopping leaves pods running).
        cp.kubectl("delete", "pods", "hello", "after", "--grace-period=1", "--ignore-not-found", "--wait=true",
                   "--timeout=90s", check=False, timeout=120)
        try:
            anyio.run(_runtime_empty, containerd.endpoint, node)
        finally:
            _stop(proc)
            cp.kubectl("delete", "node", node, "--wait=false", check=False)


def default_route_address() -> str:
    """The host's source address towards the default route, by ip(8) (not nodeagent's code)."""
    done = subprocess.run(["ip", "-j", "route", "get", "8.8.8.8"], capture_output=True, text=True, check=True)
    return str(json.loads(done.stdout)[0]["prefsrc"])


async def _runtime_empty(endpoint: str, node: str) -> None:
    async with RuntimeClient(endpoint) as client:
        async def empty() -> bool:
            sandboxes, containers = await runtime_objects(client, node)
            return not sandboxes and not containers

        await wait_for(empty, 60, f"no runtime objects left for node {node}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
