"""The ``nodeagent`` command: run the agent, and look inside a running one."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from nodeagent import __version__


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML configuration file (KubeletConfiguration-style field names)")
    p.add_argument("--static-pod-path", dest="staticPodPath", type=Path)
    p.add_argument("--kubeconfig", dest="kubeconfig", type=Path, help="join a cluster as a node")
    p.add_argument("--container-runtime-endpoint", dest="containerRuntimeEndpoint")
    p.add_argument("--node-name", dest="nodeName")
    p.add_argument("--node-ip", dest="nodeIP")
    p.add_argument("--root-dir", dest="rootDir", type=Path)
    p.add_argument("--pod-logs-dir", dest="podLogsDir", type=Path)
    p.add_argument("--max-pods", dest="maxPods", type=int)
    p.add_argument("--healthz-port", dest="healthzPort", type=int)
    p.add_argument("--log-format", dest="logFormat", choices=["console", "json"])
    p.add_argument("--trace-file", dest="traceFile", type=Path)
    p.add_argument("-v", "--verbose", action="store_true", help="also log every bus event")


_OVERRIDES = ("staticPodPath", "kubeconfig", "containerRuntimeEndpoint", "nodeName", "nodeIP", "rootDir", "podLogsDir",
              "maxPods", "healthzPort", "logFormat", "traceFile")


def _config(args: argparse.Namespace) -> Any:
    from nodeagent.config import ConfigError, load

    overrides = {k: getattr(args, k, None) for k in _OVERRIDES}
    if overrides.get("nodeIP") is not None:
        overrides["node_ip"] = overrides.pop("nodeIP")
    try:
        return load(args.config, overrides)
    except ConfigError as exc:
        print(f"nodeagent: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_run(args: argparse.Namespace) -> int:
    import anyio

    from nodeagent import logs
    from nodeagent.agent import run_forever
    from nodeagent.config import ConfigError
    from nodeagent.errors import PluginError

    config = _config(args)
    logs.configure(config.log_format, logging.DEBUG if args.verbose else logging.INFO)
    try:
        anyio.run(run_forever, config, args.verbose)
    except PluginError as exc:
        print(f"nodeagent: plugin configuration error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:  # e.g. a kubelet API without any authentication
        print(f"nodeagent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from nodeagent.registry import discover, installed_phases

    config = _config(args)
    eps = discover()
    joined = installed_phases(eps.values())
    print("installed stage plugins (entry-point group nodeagent.plugins):")
    for name, ep in sorted(eps.items()):
        print(f"  {name:<16} {ep.value:<40} phases: {', '.join(joined[name])}")
    print("\nresolved order (profile from the configuration; undo phases run in reverse):")
    from nodeagent.registry import CONFIGURABLE, ORDER_SOURCE
    from nodeagent.stages import Phase

    for phase in Phase:
        source, reverse = ORDER_SOURCE[phase]
        names = list(config.profile.get(source.value, []))
        if reverse:
            names.reverse()
        print(f"  {phase.value:<10} {', '.join(names) or '-'}")
    missing = sorted({n for ns in config.profile.values() for n in ns} - set(eps))
    if missing:
        print(f"\nerror: the profile names plugins that are not installed: {missing}", file=sys.stderr)
        return 1
    _ = CONFIGURABLE
    live = _running_stages(config)
    if live:  # what the stages of a running agent report (dra: registered drivers, prepared claims)
        print(f"\nrunning agent at {config.endpoint_url}:")
        for name, report in sorted(live.items()):
            print(f"  {name}: " + json.dumps(report, indent=2, sort_keys=True).replace("\n", "\n  "))
    return 0


def _running_stages(config: Any) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{config.endpoint_url}/plugins", timeout=2) as resp:
            return dict(json.loads(resp.read()).get("stages") or {})
    except (OSError, ValueError):  # no agent running: the installed plugins are all there is to show
        return {}


def cmd_phases(args: argparse.Namespace) -> int:
    from nodeagent.stages import PHASES

    print(f"{'phase':<10} {'cycle':<10} {'verdicts':<32} {'undo':<10} summary")
    for spec in PHASES:
        verdicts = ",".join(sorted(v.value for v in spec.verdicts)) or "-"
        undo = spec.undo.value if spec.undo else "-"
        print(f"{spec.phase.value:<10} {spec.cycle:<10} {verdicts:<32} {undo:<10} {spec.summary}")
    return 0


def cmd_lifecycle(args: argparse.Namespace) -> int:
    from nodeagent.lifecycle import render_table

    print(render_table())
    return 0


def cmd_wiring(args: argparse.Namespace) -> int:
    from nodeagent import facts
    from nodeagent.bus import TOPOLOGY
    from nodeagent.registry import DEFAULT_PROFILE, stage_classes

    print(TOPOLOGY.render())
    print()
    print(facts.render(stage_classes(DEFAULT_PROFILE)))
    return 0


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"nodeagent: {url}: {exc.code} {exc.read().decode().strip()}") from None
    except (urllib.error.URLError, ConnectionError) as exc:
        raise SystemExit(f"nodeagent: no agent answers at {url} ({exc}); is `nodeagent run` up, "
                         "and is --healthz-port the same?") from None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def cmd_pods(args: argparse.Namespace) -> int:
    config = _config(args)
    rows = _get(f"{config.endpoint_url}/pods")
    if args.output == "json":
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'NAMESPACE':<12} {'NAME':<40} {'STATE':<12} {'PHASE':<28} {'RESTARTS':<9} {'IP':<15} AGE")
    for r in sorted(rows, key=lambda r: (r["namespace"], r["name"])):
        phase = r["phase"] + (f" ({r['reason']})" if r["reason"] else "")
        print(f"{r['namespace']:<12} {r['name']:<40} {r['state']:<12} {phase:<28} {r['restarts']:<9} "
              f"{r['podIP'] or '-':<15} {_age(r['age_seconds'])}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    config = _config(args)
    chain = _get(f"{config.endpoint_url}/trace/{args.pod}")
    if args.output == "json":
        print(json.dumps(chain, indent=1))
        return 0
    start = chain[0]["at"] if chain else 0
    for e in chain:
        detail = {k: v for k, v in e.items() if k not in ("id", "pod", "source", "at", "cause", "kind",
                                                             "since_previous_seconds", "since_cause_seconds",
                                                             "pod_spec")}
        took = f"+{e['since_previous_seconds']:.3f}s"
        cause = f" <-#{e['cause']}" if e.get("cause") else ""
        print(f"{time.strftime('%H:%M:%S', time.localtime(e['at']))} {e['at'] - start:8.3f}s {took:>10} "
              f"#{e['id']:<5}{cause:<8} {e['source']:<14} {e['kind']:<22} "
              f"{json.dumps(detail, separators=(',', ':')) if detail else ''}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """A container's log, read straight from podLogsDir (the agent only helps find the pod)."""
    from nodeagent import logreader as lr

    config = _config(args)

    def fetch() -> Any:
        try:
            with urllib.request.urlopen(f"{config.endpoint_url}/pods", timeout=5) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):  # the agent is down: the log directories still tell
            return None

    try:
        since = time.time_ns() - int(lr.parse_since(args.since) * 1e9) if args.since else None
        target = lr.find_pod(args.pod, config.pod_logs_dir, fetch(), config.node_name)
        container = lr.choose_container(target, args.container)
        path, attempt = lr.log_file(target, container, previous=args.previous)
    except (lr.LogsError, ValueError) as exc:
        print(f"nodeagent: {exc}", file=sys.stderr)
        return 1
    tail = args.tail if args.tail >= 0 else None
    out = sys.stdout.buffer
    try:
        if not args.follow or args.previous:
            for lines in lr.stream(path, tail, since):
                out.write(b"".join(line.render(args.timestamps) for line in lines))
            out.flush()
            return 0
        for lines, _initial in lr.follow(path, lr.writer_alive(target, container, attempt, fetch), tail=tail,
                                         since_nanos=since):
            out.write(b"".join(line.render(args.timestamps) for line in lines))
            out.flush()  # a follower is read as it goes (often through a pipe)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nodeagent logs -f POD | head`
        return 0
    return 0


def cmd_shutdown(args: argparse.Namespace) -> int:
    """Graceful node shutdown where there is no systemd-logind (plugins/shutdown): ask the agent
    to stop its pods as before a power-off (or cancel), optionally waiting until they are down."""
    config = _config(args)
    section = config.plugins.get("shutdown", {})
    request = config.root_dir / section.get("shutdownRequestFile", "graceful_node_shutdown_request")
    if args.cancel:
        request.unlink(missing_ok=True)
        print(f"shutdown cancelled ({request} removed)")
        return 0
    request.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
    print(f"shutdown requested ({request})")
    if args.wait is None:
        return 0
    state = config.root_dir / "graceful_node_shutdown_state"
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        try:
            recorded = json.loads(state.read_text())
            if recorded.get("endTime", "").startswith("0001") is False and \
                    recorded.get("endTime", "") >= recorded.get("startTime", "~") >= request.read_text().strip():
                print(f"pods stopped at {recorded['endTime']}")
                return 0
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    print(f"nodeagent: the pods were not all stopped within {args.wait:g}s", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nodeagent", description="Run Kubernetes pods on a CRI runtime.")
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, doc in (
        ("run", cmd_run, "run the agent"),
        ("plugins", cmd_plugins, "installed stage plugins and the resolved order"),
        ("pods", cmd_pods, "the running agent's pods"),
        ("trace", cmd_trace, "the causal chain of events for one pod"),
    ):
        p = sub.add_parser(name, help=doc)
        _add_config_flags(p)
        p.set_defaults(fn=fn)
        if name in ("pods", "trace"):
            p.add_argument("-o", "--output", choices=["table", "json"], default="table")
        if name == "trace":
            p.add_argument("pod", help="pod UID, NAMESPACE/NAME or NAME")
    for name, fn, doc in (
        ("phases", cmd_phases, "the phases and their contracts"),
        ("lifecycle", cmd_lifecycle, "the pod lifecycle transition table"),
        ("wiring", cmd_wiring, "who publishes and who subscribes on the bus"),
    ):
        p = sub.add_parser(name, help=doc)
        p.set_defaults(fn=fn)
    logs = sub.add_parser("logs", help="a container's log (kubectl logs, from podLogsDir)")
    _add_config_flags(logs)
    logs.set_defaults(fn=cmd_logs)
    logs.add_argument("pod", help="pod UID, NAMESPACE/NAME or NAME")
    logs.add_argument("-c", "--container", help="the container (needed when the pod has several)")
    logs.add_argument("-p", "--previous", action="store_true", help="the previous instance (restartCount - 1)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing as the container writes")
    logs.add_argument("--tail", type=int, default=-1, help="only the last N lines (-1: all)")
    logs.add_argument("--timestamps", action="store_true", help="prefix each line with its RFC3339Nano time")
    logs.add_argument("--since", help="only lines newer than this: seconds, or a duration like 5m")
    shutdown = sub.add_parser("shutdown", help="graceful node shutdown without systemd-logind: stop the pods")
    _add_config_flags(shutdown)
    shutdown.set_defaults(fn=cmd_shutdown)
    shutdown.add_argument("--cancel", action="store_true", help="the shutdown is not happening after all")
    shutdown.add_argument("--wait", type=float, metavar="SECONDS", help="wait until the pods are down")
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    raise SystemExit(main())
