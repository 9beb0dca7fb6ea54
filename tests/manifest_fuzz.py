"""Hostile static pod manifests against the real agent: the strategies and the round runner shared
by tests/test_manifest_fuzz.py (CI, ~500 cases) and ``python -m benchmarks.fuzz`` (10,000).

A case is a valid pod (one of :data:`BASES`) mutated field by field: a value replaced by a
wrong type, a huge or negative number, a path-like string (``../../etc``), a NUL byte, unicode,
a very long string; a key deleted or added; an item duplicated; or a node replaced by raw YAML
(``!!binary``, ``!!timestamp``, ``!!set``, ``!!python/object``, anchors and aliases up to a
"billion laughs", deep nesting, non-string keys, duplicate keys). Each round writes several such
files into the manifest directory of one running agent and checks:

* every file is reported: rejected (a "static pod manifest rejected" / "duplicate static pod"
  log line from the source, i.e. a ManifestRejected fact) or accepted — then its pod reaches a
  clean state (running, completed, rejected or failed with a status, or retrying with a
  reason) within the round's timeout;
* nothing raised anywhere: no log line carries an exception (``stage raised``, ``observe stage
  failed``, ``undo phase failed``, ``static pod manifest could not be loaded``, ...), the
  dispatcher never saw an invalid spec, the agent is still running;
* the good pod written before the first round keeps running untouched (same container, no
  restart);
* no error message quotes the secret env value every base pod carries.
"""

from __future__ import annotations

import copy
import json
import re
import resource
import time
import traceback
import zlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
import yaml
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from nodeagent import labels as L
from nodeagent.lifecycle import PodState
from nodeagent.sources.manifest import ManifestError
from nodeagent.sources.staticpod import parse_documents
from tests.agent_helpers import (
    BUSYBOX_IMAGE,
    AgentEnv,
    pod_manifest,
    running_agent,
    wait_for,
)

SECRET = "s3cr3t-Zq7-never-in-a-message"
NAME = "__NAME__"
SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"


def _rich(name: str) -> list[dict[str, Any]]:
    """Many of the fields the stages read, in one running pod."""
    return [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "fuzz", "tier": "t1"}, "annotations": {"note": "hello"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Always",
            "initContainers": [{"name": "init", "image": BUSYBOX_IMAGE, "command": ["true"]}],
            "containers": [{
                "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", SLEEP], "workingDir": "/",
                "env": [{"name": "SECRET", "value": SECRET},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}}],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"},
                                 {"name": "info", "mountPath": "/etc/podinfo", "readOnly": True}],
                "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 5},
                "livenessProbe": {"tcpSocket": {"port": 8080}, "initialDelaySeconds": 3600},
                "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["NET_RAW"]}},
            }],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}},
                        {"name": "info", "downwardAPI": {"items": [
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                            {"path": "cpu", "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"}}]}}],
            "securityContext": {"fsGroup": 2000, "supplementalGroups": [3000]},
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["fuzz.local"]}],
            "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
            "activeDeadlineSeconds": 3600,
            "enableServiceLinks": False,
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
        },
    }]


def _job(name: str) -> list[dict[str, Any]]:
    """A sidecar, HTTP probes, a job that completes; a kubectl copy's status and metadata."""
    return [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "fuzz", "resourceVersion": "42",
                     "uid": "0b5d7c3e-1111-4222-8333-944455556666", "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "initContainers": [{"name": "side", "image": BUSYBOX_IMAGE, "restartPolicy": "Always",
                                "command": ["sh", "-c", SLEEP],
                                "startupProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}}],
            "containers": [{"name": "job", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", "echo done"],
                            "env": [{"name": "TOKEN", "value": SECRET}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": 8080,
                                                           "httpHeaders": [{"name": "X-Token", "value": SECRET}]}},
                            "resources": {"limits": {"cpu": "50m", "memory": "32Mi"}}}],
            "resources": {"limits": {"cpu": "200m", "memory": "128Mi"}},
            "readinessGates": [{"conditionType": "example.com/ready"}],
        },
        "status": {"phase": "Succeeded", "startTime": "2024-01-01T00:00:00Z", "podIP": "10.0.0.9",
                   "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2024-01-01T00:00:00Z"}]},
    }]


def _claimed(name: str) -> list[dict[str, Any]]:
    """A ResourceClaim beside the pod that uses it (standalone DRA; no driver here, so the pod
    waits in prepare with a reason)."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu-" + name},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "gpu", "driver": "gpu.example.com", "pool": "p", "device": "gpu0"}]}}}}
    pod = pod_manifest(name, SLEEP, resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu-" + name}],
                       container={"resources": {"claims": [{"name": "gpu"}]},
                                  "env": [{"name": "KEY", "value": SECRET}]})
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    return [claim, pod]


BASES: tuple[Callable[[str], list[dict[str, Any]]], ...] = (_rich, _job, _claimed)

# --- hostile values ---------------------------------------------------------------------------

_STRINGS = ["", " ", "..", ".", "../../etc", "../../etc/passwd", "/etc/shadow", "a/../../b", "/", "//x", "\\..\\..",
            "\x00", "a\x00b", "\x1b[31m", "\u202eevil", "ümlaut", "日本語", "😀", "\ufeff", "\n", "a\nb", "UPPER",
            "with space", "-lead", "trail-", "a.b", "a_b", "a/b", "a/b/c", "${HOME}", "$(SECRET)", "1Gi", "100m",
            "-1", "0", "1e999999999", "0x10", "1.5.5", "+-1", "true", "null", "2024-01-01T00:00:00Z", "a" * 63,
            "a" * 64, "a" * 253, "a" * 254, "x" * 5000, "y" * 70_000, "kubernetes.io/x", "example.com/foo",
            "metadata.annotations['x']", "TCP", "Always", "Never", "NoExecute", "In", "Exists", "Localhost",
            "localhost:1/x:1", "registry.invalid/x:1", "docker.io/library/busybox:1.36 ", "@sha256:zzz"]
_INTS = [0, 1, -1, 2, 255, 256, 65535, 65536, 70000, 2**31 - 1, 2**31, -(2**31) - 1, 2**32, 2**53, 2**63 - 1,
         -(2**63), 10**12, 0o777, 0o1000, 3600]


def _scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(_STRINGS), st.text(max_size=40), st.sampled_from(_INTS), st.integers(),
        st.sampled_from([0.5, -0.0, 1.5, 2.0, 1e308, -1e-9]), st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(), st.none(),
    )


_PLAUSIBLE_STRINGS = [
    "a", "main", "x-1", "side", "init", "/tmp", "/dev/null", "/etc/hosts", "/proc/self", "/", "/scratch", "sh", "true",
    "Always", "Never", "OnFailure", "IfNotPresent", "TCP", "UDP", "SCTP", "HTTP", "HTTPS", "File",
    "FallbackToLogsOnError", "Memory", "", "NoSchedule", "NoExecute", "Exists", "Equal", "In", "NotIn", "Gt", "1",
    "100m", "1Gi", "0", "example.com/ready", "metadata.name", "metadata.labels['app']", "metadata.annotations['note']",
    "status.podIP", "spec.nodeName", "limits.memory", "requests.cpu", "RuntimeDefault", "Unconfined", "Localhost",
    "profiles/x.json", "ClusterFirst", "None", "Default", "8080", "http", "linux", "windows", "DirectoryOrCreate",
    "FileOrCreate", "Socket", "HostToContainer", "Bidirectional", "NET_ADMIN", "SYS_ADMIN", "ALL",
    "kernel.shm_rmid_forced", "net.ipv4.ping_group_range", "0 2147483647", "10.0.0.1", "::1", BUSYBOX_IMAGE,
    "Unmasked", "RestartContainer", "NotRequired", "cpu", "memory", "example.com/gpu", "hugepages-2Mi", "2Mi",
    "OnRootMismatch", "Strict", "Restart", "RestartAllContainers", "$(POD)", "$$(POD)", "sub/dir", "group-a",
    # The longest valid names: a label (container, volume, namespace) and, with the node suffix,
    # a pod name (file names built from them can exceed what a file system allows).
    "l" * 63, "n" * 240, "d" * 60 + "." + "e" * 60 + "." + "f" * 60,
]
_PLAUSIBLE_INTS = [0, 1, 2, 3, 5, 10, 30, 60, 80, 443, 1000, 3600, 8080, 65535, 0o644, 0o400]
# Fields that make sense in some object of a pod: added anywhere, they are either honoured where
# they belong or reported as not honoured elsewhere.
_PLAUSIBLE_FIELDS: list[tuple[str, Any]] = [
    ("hostNetwork", True), ("hostPID", True), ("hostIPC", True), ("shareProcessNamespace", True),
    ("privileged", True), ("readOnlyRootFilesystem", True), ("runAsNonRoot", True), ("runAsUser", 1000),
    ("runAsGroup", 0), ("procMount", "Unmasked"), ("seccompProfile", {"type": "RuntimeDefault"}),
    ("appArmorProfile", {"type": "Unconfined"}), ("subPath", "sub"), ("subPathExpr", "$(POD)"),
    ("mountPropagation", "HostToContainer"), ("readOnly", True),
    ("startupProbe", {"httpGet": {"port": "http", "path": "/x"}, "failureThreshold": 1}),
    ("lifecycle", {"preStop": {"sleep": {"seconds": 0}}, "postStart": {"tcpSocket": {"port": 1}}}),
    ("sysctls", [{"name": "kernel.shm_rmid_forced", "value": "1"}]), ("tty", True), ("stdin", True),
    ("hostPath", {"path": "/tmp", "type": "Directory"}), ("emptyDir", {"medium": "Memory"}),
    ("configMap", {"name": "cm"}), ("secret", {"secretName": "s"}),
    ("projected", {"sources": [{"serviceAccountToken": {"path": "token"}}]}),
    ("resizePolicy", [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]),
    ("restartPolicy", "OnFailure"), ("restartPolicyRules", [{"action": "Restart", "exitCodes": {"operator": "In",
                                                                                               "values": [42]}}]),
    ("envFrom", [{"configMapRef": {"name": "cm"}, "prefix": "P_"}]), ("hostname", "h"), ("subdomain", "s"),
    ("hostnameOverride", "other"), ("setHostnameAsFQDN", True), ("dnsPolicy", "None"),
    ("dnsConfig", {"nameservers": ["1.1.1.1"], "searches": ["a.b"]}), ("schedulingGroup", {"podGroupName": "g"}),
    ("workloadRef", {"name": "w", "podGroup": "g"}), ("os", {"name": "linux"}), ("priority", 1000),
    ("overhead", {"cpu": "10m"}), ("runtimeClassName", "runc"), ("imagePullSecrets", [{"name": "reg"}]),
    ("topologySpreadConstraints", [{"maxSkew": 1}]), ("schedulingGates", [{"name": "g"}]),
    ("preemptionPolicy", "Never"), ("ephemeralContainers", [{"name": "dbg", "image": BUSYBOX_IMAGE}]),
    ("terminationMessagePath", "/tmp/msg"), ("terminationMessagePolicy", "FallbackToLogsOnError"),
    ("hostPort", 18080), ("hostIP", "127.0.0.1"), ("finalizers", ["example.com/f"]), ("generateName", "g-"),
    ("ownerReferences", [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}]),
]


# Valid values that would make a round wait for long: a grace period is honoured in full by a
# container that ignores SIGTERM (a mutated command may), a preStop sleep too.
_BOUNDED_KEYS = frozenset({"terminationGracePeriodSeconds", "seconds"})
_BOUNDED = [0, 1, 2, -1, "1", 1.5, None, True, 2**63, -(2**63) - 1]


def plausible_values(current: Any, key: Any = None) -> st.SearchStrategy[Any]:
    """Another value of the same kind, mostly a valid one: pods that run, with unusual values."""
    if key in _BOUNDED_KEYS:
        return st.sampled_from(_BOUNDED)
    if isinstance(current, bool):
        return st.just(not current)
    if isinstance(current, int):
        return st.one_of(st.sampled_from(_PLAUSIBLE_INTS), st.integers(-2, 70_000))
    if isinstance(current, str):
        return st.sampled_from(_PLAUSIBLE_STRINGS)
    if isinstance(current, list):
        return st.one_of(st.just([]), st.just(current[1:]), st.just(current + current[:1]), st.just(current[::-1]))
    if isinstance(current, dict) and current:
        return st.sampled_from(sorted(current)).map(lambda k: {x: v for x, v in current.items() if x != k})
    return st.sampled_from(_PLAUSIBLE_STRINGS)


def hostile_values() -> st.SearchStrategy[Any]:
    scalar = _scalars()
    return st.one_of(
        scalar, scalar, scalar,
        st.lists(scalar, max_size=3),
        st.dictionaries(st.sampled_from(["", "a", "name", "a/b/c", "x" * 300, "😀"]), scalar, max_size=2),
        st.just([{}]), st.just({"name": {}}),
    )


_BOMB = "[" + ", ".join(
    f"&l{i} [" + ", ".join([f"*l{i - 1}" if i else '"lol"'] * 10) + "]" for i in range(9)) + "]"
RAW_FRAGMENTS = [
    "!!binary aGVsbG8=", "!!timestamp 2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z", "2001-12-14", "!!set {a, b}",
    "!!python/object:os.system {}", "!!python/object/apply:os.system [echo pwned]", "!!python/name:os.system",
    "!!omap [{a: 1}]", "!!pairs [{a: 1}]", "!custom x", "!!float .inf", ".nan", "-.inf", "!!int 0x1F", "!!int zz",
    "!!str 123", "!!bool yes", "yes", "on", "~", "0o17", "0b101", "1_000", "1:30", "12e03", "1.0e+400",
    _BOMB, "[" * 64 + "]" * 64, "[" * 65 + "]" * 65, "[" * 3000 + "]" * 3000, "{a: " * 100 + "1" + "}" * 100,
    "&r [*r]", "*nowhere", "{<<: {a: 1}, b: 2}", "{<<: [{a: 1}, {b: 2}]}", "{<<: 5}", "{1: a}", "{true: a}",
    "{null: a}", "{? [a] : b}", "{a: 1, a: 2}", '"' + "z" * 200_000 + '"', '"\\ud800"', '"\\x00"', "&a 5",
    "'single ''quoted'''", "|\n    literal",
]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """One mutated manifest file."""
    base = draw(st.integers(0, len(BASES) - 1))
    docs = BASES[base](NAME)
    raws: list[str] = []
    steps: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        targets = _paths(docs)
        # Mostly inside the objects (kind and apiVersion only refuse). Hypothesis favours small
        # draws, so the rare choice is the large one.
        if draw(st.integers(0, 9)) != 9:
            targets = [t for t in targets if len(t[1]) > 1 or t[1][:1] in (("metadata",), ("spec",))] or targets
        doc_index, path = draw(st.sampled_from(targets))
        parent, key = _locate(docs[doc_index], path)
        action = draw(st.sampled_from(["tweak"] * 6 + ["replace"] * 3 + ["retype", "delete", "add", "add", "append",
                                                                         "raw"]))
        where = f"doc{doc_index}:{'/'.join(map(str, path)) or '<root>'}"
        if parent is None:  # the document itself
            if action == "raw":
                raws.append(draw(st.sampled_from(RAW_FRAGMENTS)))
                docs[doc_index] = f"__RAW{len(raws) - 1}__"
            else:
                docs[doc_index] = draw(hostile_values())
            steps.append(f"{action} {where}")
            continue
        current = parent[key]
        if action == "tweak":
            parent[key] = copy.deepcopy(draw(plausible_values(current, key)))
        elif action == "replace":
            parent[key] = draw(st.sampled_from(_BOUNDED) if key in _BOUNDED_KEYS else hostile_values())
        elif action == "retype":
            parent[key] = draw(st.sampled_from([[current], {"value": current}, json.dumps(current), None]))
        elif action == "delete":
            del parent[key]
        elif action == "add" and isinstance(current, dict):
            if draw(st.booleans()):
                name, value = draw(st.sampled_from(_PLAUSIBLE_FIELDS))
                current[name] = copy.deepcopy(value)
            else:
                current[draw(st.sampled_from(["extra", "status", "name", "x" * 300, "", "ports"]))] = \
                    draw(hostile_values())
        elif action == "append" and isinstance(current, list):
            current.append(copy.deepcopy(current[0]) if current and draw(st.booleans()) else draw(hostile_values()))
        else:
            raws.append(draw(st.sampled_from(RAW_FRAGMENTS)))
            parent[key] = f"__RAW{len(raws) - 1}__"
            action = "raw"
        steps.append(f"{action} {where}")
    render = draw(st.sampled_from(["json", "json-ascii", "yaml", "yaml"]))
    return Case(base, docs, raws, render, steps)


def _paths(docs: list[Any]) -> list[tuple[int, tuple[Any, ...]]]:
    out: list[tuple[int, tuple[Any, ...]]] = []
    for i, doc in enumerate(docs):
        stack: list[tuple[Any, tuple[Any, ...]]] = [(doc, ())]
        while stack:
            node, path = stack.pop()
            out.append((i, path))
            if isinstance(node, dict):
                stack.extend((v, (*path, k)) for k, v in node.items())
            elif isinstance(node, list):
                stack.extend((v, (*path, j)) for j, v in enumerate(node))
    # A stable order that does not start at the document root (hypothesis favours the first).
    return sorted(out, key=lambda t: zlib.crc32(repr(t).encode()))


def _locate(doc: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    if not path:
        return None, None
    node = doc
    for p in path[:-1]:
        node = node[p]
    return node, path[-1]


@dataclass
class Case:
    base: int
    docs: list[Any]
    raws: list[str]
    render: str
    steps: list[str]

    def text(self, name: str) -> str:
        docs = json.loads(json.dumps(self.docs).replace(NAME, name))
        if self.render.startswith("json"):
            parts = [json.dumps(d, ensure_ascii=self.render == "json-ascii") for d in docs]
            text = "\n---\n".join(parts)
            for i, raw in enumerate(self.raws):
                text = text.replace(f'"__RAW{i}__"', raw.replace("\n", " "))
        else:
            text = yaml.safe_dump_all(docs, allow_unicode=True, sort_keys=False, width=10**9)
            for i, raw in enumerate(self.raws):
                text = text.replace(f"__RAW{i}__", raw if "\n" not in raw else raw.replace("\n", " "))
        return text


# --- watching the agent's logs -------------------------------------------------------------------


@dataclass
class LogWatch:
    """A structlog processor: records rejections by file and anything that carries an
    exception; every event is dropped afterwards (nothing is rendered)."""

    rejected: dict[str, list[str]] = field(default_factory=dict)
    """File → the reasons it was rejected for (one per rejection)."""
    messages: dict[str, list[str]] = field(default_factory=dict)
    """File → the rejection messages."""
    problems: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> Any:
        name = event.get("event")
        if name in ("static pod manifest rejected", "duplicate static pod"):
            path = str(event.get("path"))
            self.rejected.setdefault(path, []).append(str(event.get("reason", "DuplicatePod")))
            self.messages.setdefault(path, []).append(str(event.get("error", "")))
        if event.get("exc_info") or method in ("exception", "critical") or name == "invalid pod spec":
            detail = traceback.format_exc() if event.get("exc_info") else ""
            self.problems.append(f"{method}: {name} {_short(event)}\n{detail}")
        if method in ("error", "warning") and SECRET in repr(event):
            self.leaked.append(f"{method}: {name}")
        raise structlog.DropEvent


def _short(event: dict[str, Any]) -> str:
    return ", ".join(f"{k}={str(v)[:200]}" for k, v in event.items() if k not in ("event", "exc_info"))


class watching_logs:
    """Route every structlog event through a LogWatch for the duration (restored after)."""

    def __init__(self) -> None:
        self.watch = LogWatch()

    def __enter__(self) -> LogWatch:
        self._old = structlog.get_config()
        structlog.configure(processors=[structlog.processors.add_log_level, self.watch],
                            cache_logger_on_first_use=False)
        return self.watch

    def __exit__(self, *exc: object) -> None:
        structlog.configure(**self._old)


# --- one round against the agent -----------------------------------------------------------------

AGENT_TASKS = frozenset({"source:file", "dispatcher", "status", "pleg"})
RUNTIME_REQUEST_TIMEOUT_SECONDS = 20.0
"""The agent's runtimeRequestTimeout (the kubelet's default is 2 min): a call the runtime never
answers ends within a round's settle time. containerd 2.4.2 (with devenv's runc 1.5.3) never
answers the StartContainer of a container whose executable name is 100 kB long; the kubelet,
like the agent, gets DEADLINE_EXCEEDED when the timeout ends it (StartError, exit 128), and the
fuzzer makes such names."""
SETTLED = {PodState.RUNNING, PodState.COMPLETED, PodState.REJECTED, PodState.TERMINATED}
RETRYING = {"PodWaiting", "StageFailed"}


@dataclass
class Stats:
    cases: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    accepted: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    started: float = field(default_factory=time.monotonic)
    rss_samples: list[tuple[int, float]] = field(default_factory=list)
    """(cases so far, resident MiB of this process, agent included)."""
    problems: int = 0
    failure: str = ""
    held: dict[str, int] = field(default_factory=dict)

    def peak_rss_mib(self) -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Fuzzer:
    def __init__(self, env: AgentEnv, watch: LogWatch, stats: Stats, settle_timeout: float = 90.0) -> None:
        self.env = env
        self.watch = watch
        self.stats = stats
        self.settle_timeout = settle_timeout
        self.good_id = ""
        self.counter = 0
        self.recent: deque[tuple[str, Case]] = deque(maxlen=64)
        """The last cases by pod name: a problem may show while an earlier round's pod tears down."""

    async def start(self) -> None:
        self.env.write("good.yaml", pod_manifest("good", SLEEP, terminationGracePeriodSeconds=1))
        self.good_id = (await self.env.wait_running("good", timeout=60)).id
        await wait_for(lambda: self._good_seen(), 30, "the good pod running in the agent's view")

    async def _good_seen(self) -> bool:
        statuses = self.env.status_of("good").get("containerStatuses") or []
        return bool(statuses) and "running" in statuses[0].get("state", {})

    async def round(self, batch: list[Case]) -> None:
        env = self.env
        files: dict[str, tuple[Case, list[str] | None]] = {}
        for case in batch:
            self.counter += 1
            filename = f"c{self.counter:05d}.yaml"
            text = case.text(f"fz{self.counter}")
            self.recent.append((f"fz{self.counter}", case))
            path = env.manifests / filename
            try:
                pods, _ = parse_documents(path, text, env.node, 0.0, env.agent.objects)
                expected: list[str] | None = [p["metadata"]["uid"] for p in pods]
            except ManifestError as exc:
                assert SECRET not in str(exc), f"the error quotes a secret: {case.steps}"
                expected = None
            tmp = env.manifests / f".{filename}.tmp"
            tmp.write_text(text)
            tmp.rename(path)
            files[str(path)] = (case, expected)
        self.stats.cases += len(batch)
        self.stats.rounds += 1
        try:
            try:
                await wait_for(lambda: self._all_settled(files), self.settle_timeout, "every file reported or settled")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; not settled: {self._unsettled(files)}") from None
            # Each rejection the source logged went out on the bus as a ManifestRejected fact.
            await wait_for(lambda: self._facts_match(), 10, "a ManifestRejected fact for every rejection")
        finally:
            self._check_invariants(files)
        for path in files:
            Path(path).unlink()
        # The agent tears the round's pods down while the next round is written; only wait for
        # the previous round's workers, so at most two rounds' pods exist at once.
        await wait_for(lambda: self._few_workers(len(batch) * 3), 120, "the previous rounds' pods torn down")

    async def _facts_match(self) -> bool:
        logged = sum(len(r) for r in self.watch.rejected.values())
        return self.env.agent.metrics.counters.get("ManifestRejected", 0) == logged

    async def _few_workers(self, limit: int) -> bool:
        return len(self.env.agent.dispatcher.workers) <= limit + 1  # + the good pod

    def agent_alive(self) -> None:
        """The agent's long-lived tasks are all still there (an exception in any of them ends
        the agent's task group, and so the agent)."""
        running = {t.name for t in anyio.get_running_tasks()}
        missing = sorted(AGENT_TASKS - running)
        assert not missing, f"the agent stopped: its tasks {missing} are gone"

    async def _all_settled(self, files: dict[str, tuple[Case, list[str] | None]]) -> bool:
        self.agent_alive()
        return all(self._outcome(path, expected) is not None for path, (_, expected) in files.items())

    def _unsettled(self, files: dict[str, tuple[Case, list[str] | None]]) -> list[str]:
        """What the files still waiting show: their pods' states and their last facts."""
        found = []
        for path, (case, expected) in files.items():
            if self._outcome(path, expected) is not None:
                continue
            if expected is None:
                found.append(f"{Path(path).name} (steps {case.steps}): our parse rejects it, the agent reported nothing")
                continue
            every = self.env.agent.status.all()
            for uid in expected:
                state = every[uid][3].value if uid in every else "unknown to the status writer"
                kinds = [e["kind"] + (f"({e['verdict']})" if e.get("verdict") else "")
                         for e in self.env.agent.trace.chain(uid)][-8:]
                found.append(f"{Path(path).name} (steps {case.steps}): pod {uid} {state}, last facts {kinds}")
        return found

    def _outcome(self, path: str, expected: list[str] | None) -> str | None:
        reasons = self.watch.rejected.get(path)
        if reasons:
            return "rejected:" + reasons[0]
        if expected is None:
            return None  # rejected by our parse: the agent must report it
        status = self.env.agent.status
        outcomes = []
        for uid in expected:
            record = status.all().get(uid)
            if record is None:
                return None
            state = record[3]
            status.get(uid)  # computing the status must work, whatever the pod
            if state in SETTLED:
                outcomes.append(state.value)
                continue
            chain = self.env.agent.trace.chain(uid)
            if any(e["kind"] in RETRYING or e.get("verdict") in ("RETRY", "REJECT", "WAIT") for e in chain):
                outcomes.append("Retrying")
                continue
            return None
        return "accepted:" + ",".join(outcomes)

    def _check_invariants(self, files: dict[str, tuple[Case, list[str] | None]]) -> None:
        if self.watch.problems:
            text = "\n".join(self.watch.problems[:5])
            named = [f"{name}: {case.steps}\n{case.text(name)[:3000]}" for name, case in self.recent
                     if re.search(rf"\b{name}-", text)]
            raise AssertionError("exceptions in the agent:\n" + text + "\nthe cases they name:\n" + "\n".join(named)
                                 + "\nthis round's cases:\n" + "\n".join(f"{p}: {c.steps}" for p, (c, _) in files.items()))
        assert not self.watch.leaked, f"a log line quotes the secret: {self.watch.leaked[:3]}"
        for path, (case, expected) in files.items():
            outcome = self._outcome(path, expected)
            assert outcome is not None, f"{path} neither rejected nor settled: {case.steps}\n{case.text('x')[:2000]}"
            kind, _, detail = outcome.partition(":")
            (self.stats.rejected if kind == "rejected" else self.stats.accepted)[detail] += 1
            for uid in expected or []:
                status = self.env.agent.status.get(uid)
                assert SECRET not in json.dumps(status), f"the status of {path} quotes the secret"

    async def check_good(self) -> None:
        self.agent_alive()
        running = await self.env.running_containers("good")
        assert [c.id for c in running] == [self.good_id], "the good pod's container changed"
        assert running[0].annotations[L.CONTAINER_RESTART_COUNT] == "0"
        statuses = self.env.status_of("good").get("containerStatuses") or [{}]
        assert statuses[0].get("restartCount") == 0, "the good pod restarted"


def fuzz(containerd: Any, base: Path, *, rounds: int, files_per_round: int, seed_value: int, stats: Stats,
         after_round: Callable[[Stats], None] | None = None) -> None:
    """``rounds`` rounds of ``files_per_round`` hostile files against one agent on ``containerd``
    (the session's fixture, or a devenv.Containerd); raises AssertionError on the first broken
    invariant. Hypothesis drives the cases from a thread; the agent runs in a blocking portal."""
    with watching_logs() as watch, start_blocking_portal() as portal, \
            portal.wrap_async_context_manager(running_agent(
                containerd, base, runtime_request_timeout=RUNTIME_REQUEST_TIMEOUT_SECONDS)) as env:
        fuzzer = Fuzzer(env, watch, stats)
        portal.call(fuzzer.start)
        stats.rss_samples.append((0, current_rss_mib()))

        # No shrinking: a failing round already names its cases and their mutations, and
        # replaying rounds against one running agent is slow. The seed replays a run.
        @seed(seed_value)
        @settings(max_examples=rounds, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), print_blob=False)
        @given(st.lists(cases(), min_size=files_per_round, max_size=files_per_round))
        def one_round(batch: list[Case]) -> None:
            portal.call(fuzzer.round, batch)
            portal.call(fuzzer.check_good)
            if stats.rounds % 25 == 0:
                stats.rss_samples.append((stats.cases, current_rss_mib()))
            if after_round is not None:
                after_round(stats)

        try:
            one_round()
            portal.call(settle_all, env)
            portal.call(fuzzer.check_good)
        except BaseException:
            # Shown now: the agent's cleanup on the way out may fail too and hide this one.
            traceback.print_exc()
            stats.failure = traceback.format_exc(limit=3)
            raise
        finally:
            stats.problems = len(watch.problems)
        stats.rss_samples.append((stats.cases, current_rss_mib()))
        stats.held = held(env)


def held(env: AgentEnv) -> dict[str, int]:
    """What the agent still holds after the fuzzing (each is bounded or emptied on teardown)."""
    agent = env.agent
    return {
        "trace pods (a ring of 2000)": len(agent.trace._pods),
        "trace events": sum(len(d.entries) for d in agent.trace._pods.values()),
        "trace names": len(agent.trace._names),
        "status records": len(agent.status.all()),
        "workers": len(agent.dispatcher.workers) if agent.dispatcher else 0,
    }


def current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


async def settle_all(env: AgentEnv, timeout: float = 180) -> None:
    """After the last round: every fuzzed pod torn down."""
    with anyio.move_on_after(timeout):
        while len(env.agent.dispatcher.workers) > 1:
            await anyio.sleep(0.2)
        return
    left = [(str(w.ref), w.state.value, w.pod.spec.termination_grace_period_seconds)
            for w in env.agent.dispatcher.workers.values()]
    raise AssertionError(f"pods not torn down after {timeout}s: {left}")
