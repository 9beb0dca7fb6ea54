"""One unattended run of the upstream e2e tests against nodeagent.

    python -m conformance.e2e run [--slice ci] [--focus REGEX] [--nodes N]

1. builds what is missing (control plane, e2e.test, agnhost, nnp; cached);
2. lists the binary's tests and computes the selection (selection.py), minus
   the skip list (skip.yaml);
3. brings up a fresh environment under --workdir: the control plane
   (controlplane.ControlPlane), a private containerd (devenv.Containerd) with
   devenv's and the e2e images imported, and nodeagent as the cluster's only
   node (`nodeagent run --kubeconfig <node kubeconfig> ...`, a subprocess);
4. waits for the Node to be Ready, then runs e2e.test with an exact --focus
   (one pass, or with --nodes N a parallel pass through the ginkgo CLI plus a
   serial pass for [Serial] tests);
5. parses the JUnit XML and writes the report (report.py) to --report-dir;
6. tears everything down (unless --keep).

Exit status: 0 when every selected test that ran passed, 1 otherwise, 2 when
the environment could not be brought up (the report then says why, and
lists every selected test as not run).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from conformance.e2e import report as rep
from conformance.e2e import selection as sel
from conformance.e2e import storage as st

REPO = Path(__file__).resolve().parents[2]
DEFAULT_WORKDIR = Path("/tmp/nodeagent-e2e")
DEFAULT_NODE = "nodeagent-e2e"


def log(msg: str) -> None:
    print(f"conformance.e2e: {msg}", file=sys.stderr, flush=True)


@dataclass
class Options:
    workdir: Path = DEFAULT_WORKDIR
    report_dir: Path | None = None
    focus: str | None = None
    slice: str | None = None
    nodes: int = 1
    node_name: str = DEFAULT_NODE
    node_timeout: float = 180.0
    suite_timeout: str | None = None  # None: 8h, or 30m for the ci slice
    markdown: Path | None = None
    keep: bool = False
    dry_run: bool = False
    nodeagent_args: list[str] = field(default_factory=list)
    e2e_args: list[str] = field(default_factory=list)
    # "nodeagent" (the point), or "kubelet": the upstream kubelet built from the
    # same module, as a baseline that tells environment limits from agent bugs.
    node: str = "nodeagent"
    # The containerd (devenv.runtime): None is $NODEAGENT_RUNTIME's choice, containerd 2.x by default.
    runtime: str | None = None
    # Also the upstream storage test suites against the hostpath CSI test driver (storage.py).
    storage_suites: bool = False

    @property
    def reports(self) -> Path:
        return self.report_dir or (self.workdir / "report")


class EnvironmentError_(RuntimeError):
    """The environment (control plane, containerd, node) could not be brought up.

    str() is one line for the report; `details` (a log tail) goes to stderr.
    """

    def __init__(self, summary: str, details: str = "") -> None:
        super().__init__(summary)
        self.details = details


# --- build and selection -------------------------------------------------------

def ensure_binaries() -> Path:
    from controlplane import build as cpbuild
    t0 = time.monotonic()
    cpbuild.build(None)  # control plane (default set)
    cpbuild.build(["e2e.test", "agnhost", "nonewprivs"])
    log(f"binaries ready in {time.monotonic() - t0:.1f}s ({cpbuild.bin_dir()})")
    return cpbuild.bin_dir()


def compute_selection(e2e_test: Path, opts: Options) -> tuple[list[sel.Spec], dict[str, str]]:
    """(selected specs, {name: skip reason}) after slice and focus."""
    specs = sel.list_specs(e2e_test, st.e2e_args() if opts.storage_suites else [])
    selected = sel.select(specs)
    if opts.storage_suites:
        selected += sorted((s for s in specs if st.is_selected(s)), key=lambda s: s.name)
    if opts.slice:
        selected = sel.apply_slice(selected, opts.slice)
    if opts.focus:
        import re
        rx = re.compile(opts.focus)
        selected = [s for s in selected if rx.search(s.name)]
    skips = sel.load_skips() + (sel.load_skips(st.SKIP_FILE) if opts.storage_suites else [])
    reasons = {}
    for s in selected:
        r = sel.skip_reason(s.name, skips)
        if r:
            reasons[s.name] = r
    return selected, reasons


# --- environment ---------------------------------------------------------------

class Environment:
    """Control plane + containerd + nodeagent under one work directory."""

    def __init__(self, opts: Options, bin_dir: Path) -> None:
        from controlplane import ControlPlane
        from devenv.containerd import Containerd
        from devenv.runtime import selected
        self.opts = opts
        self.bin_dir = bin_dir
        self.work = opts.workdir
        self.cp = ControlPlane(self.work / "cp", bin_dir=bin_dir)
        self.ctd = Containerd(self.work / "ctd", runtime=selected(opts.runtime))
        self.node_dir = self.work / "node"
        self.nodeagent_log = self.work / f"{opts.node}.log"
        self.nodeagent: subprocess.Popen[bytes] | None = None
        self.node_argv: list[str] = []
        self._registry = contextlib.ExitStack()  # the loopback registry mirror, up to down()
        # The driver registers where the node watches: nodeagent's pluginsRegistryDir (set in
        # nodeagent_argv), or the kubelet's <root-dir>/plugins_registry.
        registry = self.node_dir / ("plugins_registry" if opts.node == "nodeagent" else "root/plugins_registry")
        self.storage = (st.StorageDriver(self.work / "storage", registry, opts.node_name)
                        if opts.storage_suites else None)

    # leftovers of an earlier run in the same directory
    def clean(self) -> None:
        from controlplane.cluster import stop_from_state
        stop_from_state(self.work / "cp")
        if (self.work / "ctd").exists():
            self.ctd.stop()
        pid_file = self.work / "node.pid"
        if pid_file.exists():
            try:
                pid = int(pid_file.read_text())
                if _cmdline_has(pid, str(self.work)):
                    _kill(pid)
            except ValueError:
                pass
        _unmount_below(self.work / "node")
        st.release(self.work / "storage")
        for sub in ("cp", "ctd", "node", "storage"):
            shutil.rmtree(self.work / sub, ignore_errors=True)

    def up(self) -> None:
        from conformance.e2e import images
        from devenv.images import build_images
        from devenv.packages import ensure_packages
        from devenv.registry import serve as serve_registry
        self.work.mkdir(parents=True, exist_ok=True)
        self.clean()
        t0 = time.monotonic()
        ensure_packages()
        archives = build_images() + images.build_all(build_binaries=False)
        log(f"images built in {time.monotonic() - t0:.1f}s: {', '.join(images.names_of(archives))}")
        # What a selected test pulls with Always comes from a registry on loopback that
        # containerd asks first for registry.k8s.io (a 404 there falls back to the real one).
        served = {name.removeprefix(images.REGISTRY_HOST + "/"): a.path
                  for a in archives for name in a.names if name in images.REGISTRY_SERVED}
        mirror = self._registry.enter_context(serve_registry(served))
        self.ctd.registry_mirrors = {images.REGISTRY_HOST: mirror.host}
        log(f"registry mirror of {images.REGISTRY_HOST} on {mirror.host}: {', '.join(sorted(served))}")
        t0 = time.monotonic()
        self.ctd.start()
        self.ctd.import_images(archives)
        version = self.ctd.version()
        log(f"{self.ctd.runtime.name} ({version.get('runtime_name')} {version.get('runtime_version')}) up "
            f"with images imported in {time.monotonic() - t0:.1f}s ({self.ctd.endpoint})")
        t0 = time.monotonic()
        self.cp.start()
        log(f"control plane up in {time.monotonic() - t0:.1f}s ({self.cp.server_url})")
        self.start_nodeagent()
        self.wait_node_ready()
        if self.storage is not None:
            t0 = time.monotonic()
            self.storage.start(self.cp)
            log(f"hostpath CSI test driver registered after {time.monotonic() - t0:.1f}s "
                f"(log {self.storage.log_path})")

    def nodeagent_argv(self) -> list[str]:
        o = self.opts
        extra = list(o.nodeagent_args)
        if self.storage is not None:
            # The user's --config, with the plugin registry the test driver registers in.
            user = next((a for a in extra if a.startswith("--config=")), None)
            extra = [a for a in extra if a != user]
            config = self.node_dir / "nodeagent-storage.yaml"
            config.write_text(st.node_config(Path(user.split("=", 1)[1]) if user else None,
                                             self.storage.registry))
            extra.append(f"--config={config}")
        return [sys.executable, "-m", "nodeagent", "run",
                "--kubeconfig", str(self.cp.node_kubeconfig(o.node_name)),
                "--container-runtime-endpoint", self.ctd.endpoint,
                "--node-name", o.node_name,
                # No --node-ip: the node's address is detected as the kubelet detects it (the
                # default route's interface). Not loopback: the API server refuses to proxy to
                # a loopback node address ("address not allowed"), which fails every test that
                # reads the kubelet's /metrics through nodes/<node>/proxy.
                "--root-dir", str(self.node_dir / "root"),
                "--pod-logs-dir", str(self.node_dir / "pods"),
                *extra]

    def kubelet_argv(self) -> list[str]:
        """The upstream kubelet (baseline), configured like a kubeadm node on our containerd."""
        from controlplane.cluster import free_port
        from controlplane.kubeletconfig import kubelet_config
        o = self.opts
        root = self.node_dir / "root"
        (self.node_dir / "manifests").mkdir(parents=True, exist_ok=True)
        config = kubelet_config(endpoint=self.ctd.endpoint, pod_logs_dir=self.node_dir / "pods",
                                cgroup_root=self.kubelet_cgroup_root, port=free_port(), healthz_port=free_port(),
                                client_ca=self.cp.ca_file, static_pod_path=self.node_dir / "manifests")
        cfg_path = self.node_dir / "kubelet-config.json"
        cfg_path.write_text(json.dumps(config, indent=1) + "\n")
        return [str(self.bin_dir / "kubelet"), f"--config={cfg_path}",
                f"--kubeconfig={self.cp.node_kubeconfig(o.node_name)}",
                f"--root-dir={root}", f"--cert-dir={root / 'pki'}",
                f"--hostname-override={o.node_name}", "--v=2", *o.nodeagent_args]

    @property
    def kubelet_cgroup_root(self) -> str:
        return f"/e2e-kubelet-{self.opts.node_name}"

    def confine_kubelet(self, argv: list[str]) -> list[str]:
        """The kubelet kept from changing this shared host (controlplane/confine.py): kernel
        tunables shadowed in a mount namespace of its own, its root dir a shared mount so that its
        volume mounts reach containerd, a cgroup root of its own."""
        from controlplane import confine
        return confine.confine(argv, self.node_dir, self.node_dir / "root", self.kubelet_cgroup_root)

    def release_kubelet(self) -> None:
        """After the kubelet and the runtime stopped: say which tunables it set (in its copies),
        take its iptables chains out of the host's tables, remove its cgroup root."""
        from controlplane import confine
        tunables = self.node_dir / "tunables"
        if tunables.is_dir():
            log(f"kernel tunables the kubelet set (in its namespace only): {confine.tunables_written(tunables)}")
        removed, left = confine.release(self.kubelet_cgroup_root)
        if removed:
            log(f"removed the kubelet's iptables chains: {', '.join(removed)}")
        if left:
            log(f"cgroups left under {self.kubelet_cgroup_root} (a task still in them): {len(left)}")

    def start_nodeagent(self) -> None:
        self.node_dir.mkdir(parents=True, exist_ok=True)
        argv = (self.confine_kubelet(self.kubelet_argv()) if self.opts.node == "kubelet"
                else self.nodeagent_argv())
        self.node_argv = argv
        log(f"starting {self.opts.node}: {shlex.join(argv)} (log {self.nodeagent_log})")
        with open(self.nodeagent_log, "wb") as out:  # fresh for each run
            self.nodeagent = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT, cwd=REPO,
                                              start_new_session=True)
        (self.work / "node.pid").write_text(f"{self.nodeagent.pid}\n")

    def node_status(self) -> tuple[bool, str]:
        done = self.cp.kubectl("get", "node", self.opts.node_name, "-o", "json", check=False)
        if done.returncode != 0:
            return False, first(done.stderr) or "no Node object"
        node = json.loads(done.stdout)
        for cond in node.get("status", {}).get("conditions", []):
            if cond.get("type") == "Ready":
                return cond.get("status") == "True", f"Ready={cond.get('status')} ({cond.get('reason', '')})"
        return False, "no Ready condition"

    def wait_node_ready(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.opts.node_timeout
        last = ""
        while time.monotonic() < deadline:
            assert self.nodeagent is not None
            if self.nodeagent.poll() is not None:
                raise EnvironmentError_(
                    f"{self.opts.node} exited with {self.nodeagent.returncode} before its Node "
                    f"was Ready (see {self.nodeagent_log.name})", tail(self.nodeagent_log))
            ok, last = self.node_status()
            if ok:
                log(f"node {self.opts.node_name} Ready after {time.monotonic() - t0:.1f}s")
                return
            time.sleep(2)
        raise EnvironmentError_(
            f"Node {self.opts.node_name} not Ready within {self.opts.node_timeout:.0f}s "
            f"({last}; see {self.nodeagent_log.name})", tail(self.nodeagent_log))

    def down(self) -> None:
        if self.storage is not None:
            try:
                self.storage.stop()
            except Exception as e:  # noqa: BLE001 -- teardown must go on
                log(f"hostpath CSI test driver stop: {e}")
        if self.nodeagent is not None and self.nodeagent.poll() is None:
            _kill(self.nodeagent.pid, proc=self.nodeagent)
        try:
            self.ctd.stop()
        except Exception as e:  # noqa: BLE001 -- teardown must go on
            log(f"containerd stop: {e}")
        try:
            self.cp.stop()
        except Exception as e:  # noqa: BLE001
            log(f"control plane stop: {e}")
        self._registry.close()
        if self.opts.node == "kubelet":
            try:
                self.release_kubelet()
            except Exception as e:  # noqa: BLE001 -- teardown must go on
                log(f"releasing what the kubelet held on the host: {e}")
        # Volumes of pods the node had no time to tear down (an interrupted run) stay mounted
        # under its root dir (the kubelet's root dir is itself a bind mount); a next run in this
        # directory could not remove it otherwise.
        _unmount_below(self.work / "node")
        _unmount_below(self.work / "storage")
        st.release(self.work / "storage")


def _unmount_below(path: Path) -> None:
    from devenv.hostclean import unmount_all
    try:
        unmount_all(path)
    except OSError as e:
        log(f"unmounting below {path}: {e}")


def _cmdline_has(pid: int, text: str) -> bool:
    try:
        return text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _kill(pid: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 15.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        elif not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc is not None:
        proc.wait()


def first(text: str) -> str:
    return rep.first_line(text)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --- running e2e.test ------------------------------------------------------------

def e2e_flags(env: Environment, report_dir: Path) -> list[str]:
    o = env.opts
    return [
        f"--kubeconfig={env.cp.kubeconfig_admin}",
        "--provider=local",
        "--num-nodes=1",
        f"--report-dir={report_dir}",
        f"--kubectl-path={env.bin_dir / 'kubectl'}",
        # Fail fast rather than wait the default 30 min for an unschedulable node.
        "--node-schedulable-timeout=3m",
        "--system-pods-startup-timeout=2m",
        f"--container-runtime-endpoint={env.ctd.endpoint}",
        *(st.e2e_args() if o.storage_suites else []),
        *o.e2e_args,
    ]


def passes(names: list[str], nodes: int) -> list[tuple[str, list[str], int]]:
    """(label, tests, ginkgo processes): with nodes > 1 a parallel pass, then the [Serial] and
    [Disruptive] tests alone (they must not share the node with others), as upstream CI does."""
    if nodes <= 1:
        return [("all", names, 1)]
    serial = [n for n in names if "[Serial]" in n or "[Disruptive]" in n]
    return [("parallel", [n for n in names if n not in serial], nodes), ("serial", serial, 1)]


def run_pass(env: Environment, names: list[str], report_dir: Path, nodes: int,
             log_path: Path) -> int:
    """One invocation of the e2e tests on exactly `names`; returns its exit code."""
    from controlplane import build as cpbuild
    focus = sel.focus_regex(names)
    report_dir.mkdir(parents=True, exist_ok=True)
    e2e = cpbuild.binary("e2e.test")
    timeout = env.opts.suite_timeout or ("30m" if env.opts.slice == "ci" else "8h")
    ginkgo_flags = [f"--focus={focus}", f"--timeout={timeout}", "--no-color", "-v"]
    if nodes > 1:
        ginkgo = cpbuild.binary("ginkgo")
        argv = [str(ginkgo), f"--nodes={nodes}", *ginkgo_flags, str(e2e), "--",
                *e2e_flags(env, report_dir)]
    else:
        argv = [str(e2e), *("--ginkgo." + f.lstrip("-") for f in ginkgo_flags),
                *e2e_flags(env, report_dir)]
    shown = [a if not a.startswith(("--focus=", "--ginkgo.focus=")) else
             a.split("=", 1)[0] + f"=<exact names of {len(names)} tests>" for a in argv]
    log(f"running {len(names)} tests: {shlex.join(shown)} (log {log_path})")
    (report_dir / "command.txt").write_text(shlex.join(argv) + "\n")
    t0 = time.monotonic()
    with open(log_path, "ab") as out:
        # Own process group: ginkgo's parallel e2e.test processes go with it on interrupt.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "KUBECONFIG": str(env.cp.kubeconfig_admin)},
                                start_new_session=True)
        try:
            rc = proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
    log(f"pass done in {(time.monotonic() - t0) / 60:.1f} min, exit {rc}")
    return rc


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a pass: SIGINT to ginkgo / e2e.test first, which interrupts the running
    tests, cleans up and still writes the JUnit of what ran (up to 2 min); then
    SIGTERM, then SIGKILL to the whole process group (our own session)."""
    steps = ((signal.SIGINT, False, 120.0), (signal.SIGTERM, True, 20.0),
             (signal.SIGKILL, True, 10.0))
    for sig, group, timeout in steps:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
            os.killpg(proc.pid, 0)  # the leader is gone; is its group?
        except (subprocess.TimeoutExpired, ProcessLookupError, PermissionError):
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
        else:
            time.sleep(1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def git_commit() -> str:
    """HEAD and whether the tree has changes (read-only git calls)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                                  check=False, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    head = git("rev-parse", "--short=12", "HEAD")
    if not head:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head + (" (with uncommitted changes)" if dirty else "")


def run(opts: Options) -> int:
    t_start = time.monotonic()
    from controlplane import build as cpbuild
    bin_dir = ensure_binaries()
    if opts.nodes > 1:
        cpbuild.build(["ginkgo"])
    e2e = cpbuild.binary("e2e.test")
    selected, skip_reasons = compute_selection(e2e, opts)
    to_run = [s.name for s in selected if s.name not in skip_reasons]
    what = (f"slice {opts.slice!r}" if opts.slice else
            "[NodeConformance] + [Conformance] of test/e2e/common + one-node [Conformance] storage"
            + (" + External Storage suites (hostpath CSI test driver)" if opts.storage_suites else ""))
    if opts.focus:
        what += f", focus {opts.focus!r}"
    log(f"selected {len(selected)} tests ({what}); {len(skip_reasons)} on the skip list; "
        f"{len(to_run)} to run")
    if opts.node == "kubelet":
        cpbuild.build(["kubelet"])
    info = rep.RunInfo(
        title=("Upstream node conformance against nodeagent" if opts.node == "nodeagent" else
               "Upstream node conformance against the upstream kubelet (baseline, not nodeagent)"),
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        nodeagent_commit=git_commit(),
        kubernetes=f"k8s.io/kubernetes {cpbuild.K8S_VERSION} test/e2e (e2e.test built from the module)",
        command="python -m conformance.e2e " + shlex.join(sys.argv[1:]),
        selection=f"{what}: {len(selected)} tests",
    )
    if opts.dry_run:
        for s in selected:
            mark = "SKIP " if s.name in skip_reasons else "RUN  "
            print(mark + s.name)
        return 0

    reports = opts.reports
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir(parents=True)
    env = Environment(opts, bin_dir)
    parsed: rep.Parsed | None = None
    not_run = "the run did not reach it"
    rc = 0
    # A SIGTERM (CI timeout) still tears the environment down.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        try:
            env.up()
        except Exception as e:  # noqa: BLE001 -- reported, not raised
            details = getattr(e, "details", "")
            log(f"environment not usable: {e}" + (f"; last lines:\n{details}" if details else ""))
            not_run = "environment not usable: " + first(str(e))
            info.notes.append(f"The run could not start: {first(str(e))}")
            rc = 2
        else:
            info.node = (f"{opts.node} on containerd {env.ctd.version().get('runtime_version', '?')}: "
                         f"`{shlex.join(a.replace(str(opts.workdir), 'WORKDIR') for a in env.node_argv)}`")
            log_path = reports / "e2e.log"
            junits = []
            for label, names, nodes in (planned := passes(to_run, opts.nodes)):
                if not names:
                    continue
                rd = reports / f"e2e-{label}"
                run_pass(env, names, rd, nodes, log_path)
                if env.nodeagent is not None and env.nodeagent.poll() is not None:
                    info.notes.append(
                        f"{opts.node} exited with {env.nodeagent.returncode} during the "
                        f"{label!r} pass (see {env.nodeagent_log.name}); tests after that failed")
                    log(info.notes[-1] + f"; last lines:\n{tail(env.nodeagent_log)}")
                junit = rd / "junit_01.xml"
                if junit.exists():
                    junits.append(junit)
                else:
                    info.notes.append(f"pass {label!r} wrote no JUnit ({junit}); see {log_path}")
            parsed = rep.parse_junit(junits)
            if log_path.exists() and len(junits) < sum(1 for _, n, _ in planned if n):
                # a pass wrote no JUnit (killed): take what its log says
                parsed = rep.merge(parsed, rep.parse_log(log_path, to_run))
            info.suite_failures = parsed.suite_failures
            not_run = "the suite stopped before it (interrupted or timed out; see e2e.log)"
            if parsed.suite_failures:
                not_run = "suite setup failed: " + first(parsed.suite_failures[0].reason)
    except KeyboardInterrupt:
        info.notes.append("interrupted")
        not_run = "interrupted"
        rc = 130
        # an interrupted pass may still have written its JUnit; the log has the rest
        parsed = rep.parse_junit(sorted(reports.glob("e2e-*/junit_01.xml")))
        if (reports / "e2e.log").exists():
            parsed = rep.merge(parsed, rep.parse_log(reports / "e2e.log", to_run))
    finally:
        if opts.keep:
            log(f"--keep: environment left running under {opts.workdir} "
                f"(KUBECONFIG={env.cp.kubeconfig_admin}, nodeagent pid "
                f"{env.nodeagent.pid if env.nodeagent else '-'})")
        else:
            env.down()
        # Keep the logs next to the report.
        for src in (env.nodeagent_log, env.ctd.log_path, *([env.storage.log_path] if env.storage else [])):
            if src.exists():
                shutil.copy(src, reports / src.name)
        cplogs = env.cp.log_dir
        if cplogs.exists():
            shutil.copytree(cplogs, reports / "controlplane-logs", dirs_exist_ok=True)

    info.wall_seconds = time.monotonic() - t_start
    cases = rep.build_cases([(s.name, s.location) for s in selected], skip_reasons, parsed, not_run)
    summary = rep.write_all(reports, cases, info)
    if opts.markdown and opts.markdown.resolve() != (reports / "report.md").resolve():
        opts.markdown.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(reports / "report.md", opts.markdown)
    log(f"report: {reports / 'report.md'}, JUnit: {reports / 'junit.xml'}")
    print(summary)
    if rc:
        return rc
    return 0 if all(c.status != rep.FAILED for c in cases) else 1
