"""One run of Kubernetes' node e2e suite (test/e2e_node) with nodeagent as the node under test.

    python -m conformance.node_e2e run [--focus REGEX] [--node nodeagent|kubelet]

1. builds e2e_node.test when missing (harness.build; not into the control plane's cache);
2. lists its specs, selects the [NodeConformance] ones (narrowed by --focus), minus skip.yaml;
3. brings up, under --workdir: a private containerd (devenv.Containerd) with devenv's and
   conformance/e2e's images imported under their exact names; the suite's internal services
   (`e2e_node.test --run-services-mode`: etcd, kube-apiserver on 127.0.0.1:6443, namespace
   controller); and the node, `python -m nodeagent run --kubeconfig <token kubeconfig> ...`
   (or the upstream kubelet, confined as conformance/e2e confines it); waits for it to be Ready;
4. runs the tests (`e2e_node.test --start-services=false --prepull-images=false ...`) with an
   exact focus and a PATH without systemd-run/systemctl (harness.py says why this split);
5. writes the report with conformance/e2e/report.py; tears everything down (unless --keep).

Exit status: 0 every spec that ran passed, 1 some failed, 2 the environment did not come up.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.e2e import report as rep
from conformance.e2e.runner import (
    EnvironmentError_,
    _cmdline_has,
    _kill,
    _kill_group,
    _unmount_below,
    git_commit,
    passes,
    tail,
)
from conformance.node_e2e import harness
from conformance.node_e2e import selection as sel
from controlplane.kubeletconfig import THIS_HOST

REPO = Path(__file__).resolve().parents[2]
DEFAULT_WORKDIR = Path("/tmp/nodeagent-node-e2e")
# The self-signed serving cert the suite's API server writes when absent (the option's default
# CertDirectory); removed at teardown only if this run created the directory.
APISERVER_CERT_DIR = Path("/var/run/kubernetes")


def log(msg: str) -> None:
    print(f"conformance.node_e2e: {msg}", file=sys.stderr, flush=True)


@dataclass
class Options:
    workdir: Path = DEFAULT_WORKDIR
    report_dir: Path | None = None
    focus: str | None = None
    node_only: bool = False             # only the specs defined in test/e2e_node
    slice: bool = False                 # only ci-slice.yaml's specs
    node: str = "nodeagent"             # or "kubelet": the upstream kubelet, a baseline
    # The harness's own kubelet keeps the host name (no --hostname-override unless --node-name);
    # the suite takes whatever single Node registers.
    node_name: str = field(default_factory=lambda: socket.gethostname().lower())
    node_timeout: float = 120.0
    services_timeout: float = 120.0
    suite_timeout: str = "2h"
    nodes: int = 1                      # ginkgo processes (>1: a parallel pass, then [Serial] alone)
    keep: bool = False
    dry_run: bool = False
    binary: Path | None = None
    nodeagent_args: list[str] = field(default_factory=list)
    e2e_args: list[str] = field(default_factory=list)
    runtime: str | None = None

    @property
    def reports(self) -> Path:
        return self.report_dir or (self.workdir / "report")


# --- the suite's API server, as the node and the runner see it ---------------------------------

class API:
    """GETs on the suite's API server with its bearer token (its cert is self-signed)."""

    def __init__(self, token: str, host: str = harness.SERVICES_HOST) -> None:
        self.token, self.host = token, host
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        req = urllib.request.Request(self.host + path, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, context=self._tls, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError as e:
            return 0, str(e).encode()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


# --- environment ---------------------------------------------------------------------------

class Environment:
    """containerd + the suite's services + the node, under one work directory."""

    def __init__(self, opts: Options, binary: Path) -> None:
        from devenv.containerd import Containerd
        from devenv.runtime import selected
        self.opts = opts
        self.binary = binary
        self.work = opts.workdir
        self.token = secrets.token_hex(16)
        self.api = API(self.token)
        self.ctd = Containerd(self.work / "ctd", runtime=selected(opts.runtime))
        # The handler upstream's node e2e CI configures (runtimeclass.PreconfiguredRuntimeClassHandler,
        # test/e2e/framework/node/runtimeclass): the RuntimeClass and pod overhead specs name it.
        self.ctd.extra_runc_handlers = ("test-handler",)
        self.services_dir = self.work / "services"
        self.services_log = self.work / "services.log"
        self.node_dir = self.work / "node"
        self.node_log = self.work / f"{opts.node}.log"
        self.services: subprocess.Popen[bytes] | None = None
        self.node: subprocess.Popen[bytes] | None = None
        self.node_argv: list[str] = []
        self.created_cert_dir = False

    def _pid_files(self) -> list[Path]:
        return [self.work / "services.pid", self.work / "node.pid"]

    def clean(self) -> None:
        """Leftovers of an earlier run in the same directory (only processes naming it)."""
        for pid_file in self._pid_files():
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if _cmdline_has(pid, str(self.work)) or _cmdline_has(pid, str(self.binary)):
                _kill(pid)
        if (self.work / "ctd").exists():
            self.ctd.stop()
        _unmount_below(self.node_dir)
        for sub in ("ctd", "node", "services", "tests", "path"):
            shutil.rmtree(self.work / sub, ignore_errors=True)

    def up(self) -> None:
        from conformance.e2e import images
        from devenv.images import build_images
        from devenv.packages import ensure_packages
        self.work.mkdir(parents=True, exist_ok=True)
        self.clean()
        busy = [p for p in harness.PORTS if not _port_free(p)]
        if busy:
            raise EnvironmentError_(f"port(s) {busy} in use: the suite's API server needs 6443 and its "
                                    "specs dial the node on 10250/10248; another node e2e run?")
        t0 = time.monotonic()
        ensure_packages()
        # agnhost and nonewprivs come from controlplane/build.py's cache as they are, built only when
        # missing (a stamp check could rebuild them under another run that is using them).
        from controlplane import build as cpbuild
        missing = not (cpbuild.is_built("agnhost") and cpbuild.is_built("nonewprivs"))
        archives = build_images() + images.build_all(build_binaries=missing)
        log(f"images built in {time.monotonic() - t0:.1f}s: {', '.join(images.names_of(archives))}")
        t0 = time.monotonic()
        self.ctd.start()
        self.ctd.import_images(archives)
        version = self.ctd.version()
        log(f"{self.ctd.runtime.name} ({version.get('runtime_name')} {version.get('runtime_version')}) up "
            f"with images imported in {time.monotonic() - t0:.1f}s ({self.ctd.endpoint})")
        self.start_services()
        self.start_node()
        self.wait_node_ready()

    # the suite's internal services

    def start_services(self) -> None:
        self.services_dir.mkdir(parents=True, exist_ok=True)
        self.created_cert_dir = not APISERVER_CERT_DIR.exists()
        argv = harness.services_argv(self.binary, self.token)
        log(f"starting the suite's services: {shlex.join(a if 'token' not in a else '--bearer-token=…' for a in argv)}"
            f" (log {self.services_log})")
        t0 = time.monotonic()
        with open(self.services_log, "wb") as out:
            # cwd: it writes known_tokens.csv where it runs
            self.services = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             cwd=self.services_dir, start_new_session=True)
        (self.work / "services.pid").write_text(f"{self.services.pid}\n")
        deadline = t0 + self.opts.services_timeout
        while time.monotonic() < deadline:
            if self.services.poll() is not None:
                raise EnvironmentError_(f"the suite's services exited with {self.services.returncode}",
                                        tail(self.services_log))
            code, body = self.api.get("/healthz", timeout=2)
            if code == 200 and body.strip() == b"ok":
                log(f"API server up in {time.monotonic() - t0:.1f}s ({harness.SERVICES_HOST})")
                return
            time.sleep(1)
        raise EnvironmentError_(f"the suite's API server not healthy within {self.opts.services_timeout:.0f}s",
                                tail(self.services_log))

    # the node

    def kubeconfig(self) -> Path:
        path = self.node_dir / "kubeconfig"
        path.write_text(harness.kubeconfig(self.token))
        path.chmod(0o600)
        return path

    def node_config(self) -> dict[str, Any]:
        """The KubeletConfiguration of the node: the harness's overrides for its own kubelet
        (services/kubelet.go: anonymous authentication, no webhook, AlwaysAllow -- the API
        server's node proxy sends no credentials, and the suite reads /configz through it --
        and the read-only port 10255), a static pod directory of its own, and eviction
        thresholds a shared disk does not trip."""
        (self.node_dir / "manifests").mkdir(parents=True, exist_ok=True)
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "port": harness.KUBELET_PORT,
            "healthzPort": harness.KUBELET_HEALTHZ_PORT,
            "readOnlyPort": harness.KUBELET_READ_ONLY_PORT,
            # Pod cgroups at the kubelet's /kubepods/<qos>/pod<uid>: the Cgroup Manager specs
            # hard-code that path (pods_container_manager_test.go). Safe for the kubelet's orphan
            # cleanup only because nothing else uses /kubepods here: one run per machine (the
            # fixed ports), and `--node kubelet` refuses while another kubelet runs.
            "cgroupRoot": "/",
            "containerRuntimeEndpoint": self.ctd.endpoint,
            "podLogsDir": str(self.node_dir / "pods"),
            "staticPodPath": str(self.node_dir / "manifests"),
            "fileCheckFrequency": "10s",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "evictionHard": THIS_HOST["evictionHard"],
            "serializeImagePulls": THIS_HOST["serializeImagePulls"],
        }

    def nodeagent_argv(self) -> list[str]:
        cfg = self.node_dir / "kubelet-config.json"
        cfg.write_text(json.dumps(self.node_config(), indent=1) + "\n")
        return [sys.executable, "-m", "nodeagent", "run", f"--config={cfg}",
                "--kubeconfig", str(self.kubeconfig()),
                "--node-name", self.opts.node_name,
                "--root-dir", str(self.node_dir / "root"),
                *self.opts.nodeagent_args]

    def kubelet_argv(self) -> list[str]:
        """The upstream kubelet (the same module's), kept from changing the shared host as
        conformance/e2e keeps it (controlplane/confine.py)."""
        from controlplane import build as cpbuild
        from controlplane import confine
        config = {**THIS_HOST, **self.node_config()}
        cfg = self.node_dir / "kubelet-config.json"
        cfg.write_text(json.dumps(config, indent=1) + "\n")
        root = self.node_dir / "root"
        root.mkdir(parents=True, exist_ok=True)
        argv = [str(cpbuild.binary("kubelet")), f"--config={cfg}", f"--kubeconfig={self.kubeconfig()}",
                f"--root-dir={root}", f"--cert-dir={root / 'pki'}",
                f"--hostname-override={self.opts.node_name}", "--v=2", *self.opts.nodeagent_args]
        return confine.confine(argv, self.node_dir, root, "/")

    def start_node(self) -> None:
        self.node_dir.mkdir(parents=True, exist_ok=True)
        argv = self.kubelet_argv() if self.opts.node == "kubelet" else self.nodeagent_argv()
        self.node_argv = argv
        log(f"starting {self.opts.node}: {shlex.join(argv)} (log {self.node_log})")
        with open(self.node_log, "wb") as out:
            self.node = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=REPO, start_new_session=True)
        (self.work / "node.pid").write_text(f"{self.node.pid}\n")

    def node_status(self) -> tuple[bool, str]:
        code, body = self.api.get(f"/api/v1/nodes/{self.opts.node_name}")
        if code != 200:
            return False, f"GET node: {code}"
        for cond in json.loads(body).get("status", {}).get("conditions", []):
            if cond.get("type") == "Ready":
                return cond.get("status") == "True", f"Ready={cond.get('status')} ({cond.get('reason', '')})"
        return False, "no Ready condition"

    def wait_node_ready(self) -> None:
        t0 = time.monotonic()
        last = ""
        while time.monotonic() < t0 + self.opts.node_timeout:
            assert self.node is not None
            if self.node.poll() is not None:
                raise EnvironmentError_(f"{self.opts.node} exited with {self.node.returncode} before its Node "
                                        f"was Ready (see {self.node_log.name})", tail(self.node_log))
            ok, last = self.node_status()
            if ok:
                log(f"node {self.opts.node_name} Ready after {time.monotonic() - t0:.1f}s")
                # What the suite reads before every spec: the node's config through the API server.
                code, body = self.api.get(f"/api/v1/nodes/{self.opts.node_name}/proxy/configz")
                log(f"/configz through the API server's node proxy: {code} "
                    f"{body[:120].decode(errors='replace')!r}")
                return
            time.sleep(1)
        raise EnvironmentError_(f"Node {self.opts.node_name} not Ready within {self.opts.node_timeout:.0f}s "
                                f"({last}; see {self.node_log.name})", tail(self.node_log))

    def down(self) -> None:
        if self.node is not None and self.node.poll() is None:
            _kill(self.node.pid, proc=self.node)
        try:
            self.ctd.stop()
        except Exception as e:  # noqa: BLE001 -- teardown must go on
            log(f"containerd stop: {e}")
        if self.services is not None and self.services.poll() is None:
            _kill(self.services.pid, proc=self.services)
        from controlplane import confine
        try:
            # The QoS tiers either node made under cgroupRoot / (pods' cgroups went with them).
            confine.remove_cgroup_root(harness.POD_CGROUPS)
            if self.opts.node == "kubelet":
                confine.remove_iptables_chains()
        except Exception as e:  # noqa: BLE001
            log(f"releasing what the node held on the host: {e}")
        _unmount_below(self.node_dir)
        if self.created_cert_dir:
            shutil.rmtree(APISERVER_CERT_DIR, ignore_errors=True)


def _running_kubelets() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "kubelet":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return sorted(pids)


# --- the tests -------------------------------------------------------------------------------

def run_tests(env: Environment, names: list[str], report_dir: Path, log_path: Path, nodes: int = 1) -> int:
    focus = sel.focus_regex(names)
    ginkgo = None
    if nodes > 1:
        from controlplane import build as cpbuild
        cpbuild.build(["ginkgo"])
        ginkgo = cpbuild.binary("ginkgo")
    report_dir.mkdir(parents=True, exist_ok=True)
    cwd = env.work / "tests"  # the suite makes kubelet.conf.d and such in its working directory
    cwd.mkdir(parents=True, exist_ok=True)
    argv = harness.tests_argv(env.binary, token=env.token, focus=focus, report_dir=report_dir,
                              runtime_endpoint=env.ctd.endpoint, timeout=env.opts.suite_timeout,
                              extra=env.opts.e2e_args, ginkgo=ginkgo, nodes=nodes)
    path = harness.path_without_systemd(env.work / "path")
    shown = [a.split("=", 1)[0] + f"=<exact names of {len(names)} specs>" if a.startswith(("--ginkgo.focus=", "--focus="))
             else "--bearer-token=…" if a.startswith("--bearer-token=") else a for a in argv]
    log(f"running {len(names)} specs: {shlex.join(shown)} (log {log_path}; PATH without "
        f"{', '.join(sorted(harness.HIDDEN_COMMANDS))})")
    (report_dir / "command.txt").write_text(shlex.join(shown) + "\n")
    t0 = time.monotonic()
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, "PATH": path}, start_new_session=True)
        try:
            rc = proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
    log(f"tests done in {(time.monotonic() - t0) / 60:.1f} min, exit {rc}")
    return rc


def run(opts: Options) -> int:
    t_start = time.monotonic()
    binary, secs = harness.build(opts.binary)
    if secs:
        log(f"built {binary} in {secs:.0f}s")
    specs = sel.list_specs(binary)
    selected = sel.select(specs, opts.focus, node_only=opts.node_only)
    if opts.slice:
        selected = sel.apply_slice(selected, sel.load_slice())
    skip_reasons = sel.skip_reasons(selected, sel.load_skips())
    to_run = [s.name for s in selected if s.name not in skip_reasons]
    what = ("[NodeConformance] of e2e_node.test" + (" defined in test/e2e_node" if opts.node_only else "")
            + (", slice ci" if opts.slice else "") + (f", focus {opts.focus!r}" if opts.focus else ""))
    log(f"selected {len(selected)} specs ({what}); {len(skip_reasons)} on the skip list; {len(to_run)} to run")
    if opts.dry_run:
        for s in selected:
            print(("SKIP " if s.name in skip_reasons else "RUN  ") + s.name)
        return 0
    from controlplane import build as cpbuild
    if opts.node == "kubelet" and not cpbuild.binary("kubelet").exists():
        raise SystemExit(f"--node kubelet needs {cpbuild.binary('kubelet')} (python -m controlplane build kubelet)")
    if opts.node == "kubelet" and (others := _running_kubelets()):
        # Its teardown takes the kubelet's iptables chains out of the host's tables
        # (controlplane/confine.py release): the same chains another kubelet here relies on.
        raise SystemExit(f"--node kubelet: other kubelet processes run on this machine (pids {others}); "
                         "the baseline's teardown would remove their iptables chains")
    info = rep.RunInfo(
        title=("Upstream node e2e (test/e2e_node) against nodeagent" if opts.node == "nodeagent" else
               "Upstream node e2e (test/e2e_node) against the upstream kubelet (baseline, not nodeagent)"),
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        nodeagent_commit=git_commit(),
        kubernetes=f"k8s.io/kubernetes {cpbuild.K8S_VERSION} test/e2e_node (e2e_node.test built from the module)",
        command="python -m conformance.node_e2e " + shlex.join(sys.argv[1:]),
        selection=f"{what}: {len(selected)} specs",
    )
    reports = opts.reports
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir(parents=True)
    env = Environment(opts, binary)
    parsed: rep.Parsed | None = None
    not_run = "the run did not reach it"
    rc = 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    log_path = reports / "e2e.log"
    try:
        try:
            env.up()
        except Exception as e:  # noqa: BLE001 -- reported, not raised
            details = getattr(e, "details", "")
            log(f"environment not usable: {e}" + (f"; last lines:\n{details}" if details else ""))
            not_run = "environment not usable: " + rep.first_line(str(e))
            info.notes.append(f"The run could not start: {rep.first_line(str(e))}")
            rc = 2
        else:
            info.node = (f"{opts.node} on containerd {env.ctd.version().get('runtime_version', '?')}: "
                         f"`{shlex.join(a.replace(str(opts.workdir), 'WORKDIR') for a in env.node_argv)}`")
            for label, names, nodes in passes(to_run, opts.nodes):
                if names:
                    run_tests(env, names, reports / f"e2e-{label}", log_path, nodes)
            if env.node is not None and env.node.poll() is not None:
                info.notes.append(f"{opts.node} exited with {env.node.returncode} during the tests "
                                  f"(see {env.node_log.name})")
            junits = sorted(reports.glob("e2e-*/junit*.xml"))
            parsed = rep.parse_junit(junits)
            if log_path.exists() and not junits:
                info.notes.append(f"the suite wrote no JUnit under {reports}/e2e-*; see {log_path}")
                parsed = rep.merge(parsed, rep.parse_log(log_path, to_run))
            info.suite_failures = parsed.suite_failures
            not_run = "the suite stopped before it (interrupted or timed out; see e2e.log)"
            if parsed.suite_failures:
                not_run = "suite setup failed: " + rep.first_line(parsed.suite_failures[0].reason)
    except KeyboardInterrupt:
        info.notes.append("interrupted")
        not_run = "interrupted"
        rc = 130
        parsed = rep.parse_junit(sorted(reports.glob("e2e-*/junit*.xml")))
        if log_path.exists():
            parsed = rep.merge(parsed, rep.parse_log(log_path, to_run))
    finally:
        if opts.keep:
            log(f"--keep: environment left running under {opts.workdir} (node pid "
                f"{env.node.pid if env.node else '-'}, services pid {env.services.pid if env.services else '-'})")
        else:
            env.down()
        for src in (env.node_log, env.services_log, env.ctd.log_path):
            if src.exists():
                shutil.copy(src, reports / src.name)
    info.wall_seconds = time.monotonic() - t_start
    cases = rep.build_cases([(s.name, s.location) for s in selected], skip_reasons, parsed, not_run)
    summary = rep.write_all(reports, cases, info)
    log(f"report: {reports / 'report.md'}, JUnit: {reports / 'junit.xml'}")
    print(summary)
    if rc:
        return rc
    return 0 if all(c.status != rep.FAILED for c in cases) else 1


def side_by_side_report(nodeagent: Path, kubelet: Path) -> str:
    """docs/node-conformance-report.md: the two runs' facts, then both results per spec."""
    lines = ["# Upstream node e2e (test/e2e_node): nodeagent and the upstream kubelet", "",
             "Kubernetes' node e2e suite, its `[NodeConformance]` specs minus the skip list "
             "(conformance/node_e2e/skip.yaml: specs that restart the kubelet through systemd, or use the "
             "host's /var/lib/kubelet), run by `python -m conformance.node_e2e run` once with nodeagent as "
             "the node and once with the kubelet v1.37.2 of the same module (`--node kubelet`), on the same "
             "machine and containerd. docs/node-e2e.md says how the suite runs here, what these machines "
             "lack, and the reading of the differences. Rendered by `python -m conformance.node_e2e report`.",
             "", "## The runs", ""]
    lines += rep.run_lines("nodeagent", nodeagent) + rep.run_lines("kubelet", kubelet)
    lines += ["", "## Spec by spec", ""]
    lines += rep.side_by_side_lines(rep.read_cases(nodeagent), rep.read_cases(kubelet))
    return "\n".join(lines) + "\n"

