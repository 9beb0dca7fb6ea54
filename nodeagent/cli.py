"""The ``nodeagent`` command: run the agent, and look inside a running one."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodeagent import __version__


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    """nodeagent's own options; every other option is the kubelet's (``--kubeconfig``,
    ``--node-ip``, ``--container-runtime-endpoint``, ``--max-pods``, ``--config-dir``, ...)."""
    p.add_argument("--config", type=Path,
                   help="a KubeletConfiguration, a NodeAgentConfiguration, both (two YAML documents), or "
                        "nodeagent's earlier single-document format")
    p.add_argument("--agent-config", type=Path, help="a NodeAgentConfiguration (nodeagent.io/v1alpha1)")
    p.add_argument("--node-name", dest="nodeName", help="the node's name (the kubelet's --hostname-override)")
    p.add_argument("--static-pod-path", dest="staticPodPath", type=Path, help="sets staticPodPath")
    p.add_argument("--pod-logs-dir", dest="podLogsDir", type=Path, help="sets podLogsDir")
    p.add_argument("--log-format", dest="logFormat", choices=["console", "json"])
    p.add_argument("--trace-file", dest="traceFile", type=Path)
    p.add_argument("--verbose", action="store_true", help="also log every bus event")


_OWN_OPTIONS = {"config", "agent-config", "node-name", "static-pod-path", "pod-logs-dir", "log-format", "trace-file",
                "verbose", "output", "container", "previous", "follow", "tail", "timestamps", "since", "kubelet",
                "help", "version"}


def split_kubelet_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(nodeagent's arguments, the kubelet's flags with their values): the kubelet's long flags
    are recognised by name (pflag's table), so argparse never sees, or misreads, them."""
    from nodeagent.kubeletconfig.flags import BY_NAME

    own: list[str] = []
    kubelet: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg[2:].split("=", 1)[0].replace("_", "-") if arg.startswith("--") else ""
        if name and name not in _OWN_OPTIONS and name in BY_NAME:
            kubelet.append(arg)
            if "=" not in arg and not BY_NAME[name].bool_ and i + 1 < len(args):
                kubelet.append(args[i + 1])
                i += 1
        elif arg == "--":
            own.extend(args[i:])
            break
        else:
            own.append(arg)
        i += 1
    return own, kubelet


def _parser(prog: str, help: str) -> argparse.ArgumentParser:  # noqa: A002 - argparse's word
    return argparse.ArgumentParser(prog=prog, description=help, allow_abbrev=False)


def _fail(message: str, code: int = 2) -> SystemExit:
    print(f"nodeagent: {message}", file=sys.stderr)
    return SystemExit(code)


def _config(args: argparse.Namespace, rest: list[str] | None = None) -> Any:
    """The effective configuration of ``nodeagent run``-style arguments: nodeagent's options
    and the kubelet's flags (``rest``)."""
    from nodeagent.config import DEFAULT_ROOT_DIR, ConfigError, build, read_sources
    from nodeagent.kubeletconfig import flags as kflags
    from nodeagent.kubeletconfig.load import Origin

    try:
        command = kflags.parse(list(rest or []), defaults={"root_dir": DEFAULT_ROOT_DIR})
    except kflags.FlagError as exc:
        raise _fail(f"failed to parse kubelet flag: {exc}") from None
    if getattr(args, "nodeName", None):
        command.flags = command.flags.model_copy(update={"hostname_override": args.nodeName})
        command.given.add("hostname_override")
    for field, flag in (("staticPodPath", "--static-pod-path"), ("podLogsDir", "--pod-logs-dir")):
        value = getattr(args, field, None)
        if value is not None:
            command.config[field] = str(Path(value).absolute())
            command.config_flags[field] = flag
    try:
        sources = read_sources(getattr(args, "config", None), getattr(args, "agent_config", None),
                               strict_config=False)
        for field in ("logFormat", "traceFile"):
            value = getattr(args, field, None)
            if value is not None:
                sources.agent[field] = str(value)
        config = build(command, sources)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    if config.assembled is not None:
        for field in ("logFormat", "traceFile"):
            if getattr(args, field, None) is not None:
                config.assembled.origins[f"agent.{field}"] = Origin("flag", f"--{field}")
    return config


def _parse_run(name: str, argv: list[str], help: str) -> tuple[argparse.Namespace, Any]:
    p = _parser(f"nodeagent {name}", help)
    _add_config_flags(p)
    p.add_argument("-v", dest="v_short", action="store_true", help=argparse.SUPPRESS)
    own, kubelet = split_kubelet_flags(argv)
    args = p.parse_args(own)
    args.verbose = args.verbose or args.v_short
    return args, _config(args, kubelet)


def cmd_run(argv: list[str]) -> int:
    args, config = _parse_run("run", argv, "run the agent (nodeagent's options and the kubelet's flags)")
    return _run(config, verbose=args.verbose)


def _run(config: Any, *, verbose: bool) -> int:
    import anyio

    from nodeagent import logs
    from nodeagent.agent import run_forever
    from nodeagent.config import ConfigError
    from nodeagent.errors import PluginError
    from nodeagent.nodeip import NodeIPError

    # Only an agent with an API server bootstraps certificates (and needs `cryptography`, about
    # 10 MiB of RSS): a standalone agent does not import them.
    startup_errors: tuple[type[Exception], ...] = (ConfigError, NodeIPError)
    if config.kubeconfig is not None:
        from nodeagent.certificates.client import BootstrapError

        startup_errors = (*startup_errors, BootstrapError)

    verbose = verbose or config.kubelet.logging.verbosity >= 4
    logs.configure(config.log_format, logging.DEBUG if verbose else logging.INFO)
    try:
        anyio.run(run_forever, config, verbose)
    except PluginError as exc:
        print(f"nodeagent: plugin configuration error: {exc}", file=sys.stderr)
        return 2
    except startup_errors as exc:  # e.g. a kubelet API without authentication
        print(f"nodeagent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def cmd_kubelet(argv: list[str]) -> int:
    """The kubelet's command line, unchanged: an installer's unit file works by pointing its
    ExecStart at ``nodeagent kubelet`` (or the ``nodeagent-kubelet`` script)."""
    from nodeagent.config import ConfigError, build, read_sources
    from nodeagent.kubeletconfig import flags as kflags

    agent_config = None
    kept: list[str] = []
    i = 0
    while i < len(argv):  # --agent-config is nodeagent's, the only flag the kubelet lacks
        arg = argv[i]
        if arg == "--agent-config" and i + 1 < len(argv):
            agent_config, i = Path(argv[i + 1]), i + 2
            continue
        if arg.startswith("--agent-config="):
            agent_config = Path(arg.split("=", 1)[1])
        else:
            kept.append(arg)
        i += 1
    try:
        command = kflags.parse(kept)
    except kflags.FlagError as exc:
        print(f"Error: failed to parse kubelet flag: {exc}", file=sys.stderr)
        return 1
    if command.help:
        print("nodeagent kubelet: the kubelet's command line (v1.37), run by nodeagent\n\n"
              "Usage:\n  nodeagent kubelet [flags]\n\n" + kflags.usage()
              + "\n  --agent-config string  nodeagent's own NodeAgentConfiguration (not a kubelet flag)")
        return 0
    if command.version:
        from nodeagent.cluster.node import KUBELET_VERSION

        print(f"Kubernetes {KUBELET_VERSION}")
        return 0
    for warning in command.warnings:
        print(warning, file=sys.stderr)
    try:
        sources = read_sources(command.flags.config, agent_config, strict_config=True)
        config = build(command, sources, kubelet_defaults=True)
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return _run(config, verbose=False)


def cmd_config(argv: list[str]) -> int:
    """``nodeagent config explain [run's arguments]``; ``--kubelet`` reads the kubelet's
    command line instead (``nodeagent config explain --kubelet -- --config=... --kubeconfig=...``)."""
    from nodeagent.kubeletconfig.explain import render

    p = _parser("nodeagent config", "the effective configuration")
    p.add_argument("action", choices=["explain"])
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.add_argument("--kubelet", action="store_true", help="the arguments are the kubelet's command line")
    _add_config_flags(p)
    if "--kubelet" in argv:  # everything after is the kubelet's command line (after an optional --)
        at = argv.index("--kubelet")
        rest = argv[at + 1:]
        args = p.parse_args([*argv[:at], "--kubelet"])
        config = _kubelet_config(rest[1:] if rest[:1] == ["--"] else rest)
    else:
        own, kubelet = split_kubelet_flags(argv)
        args = p.parse_args(own)
        config = _config(args, kubelet)
    print(render(config, output=args.output))
    return 0


def _kubelet_config(argv: list[str]) -> Any:
    from nodeagent.config import ConfigError, build, read_sources
    from nodeagent.kubeletconfig import flags as kflags

    try:
        command = kflags.parse(argv)
        return build(command, read_sources(command.flags.config, None, strict_config=True), kubelet_defaults=True)
    except kflags.FlagError as exc:
        raise _fail(f"failed to parse kubelet flag: {exc}", 1) from None
    except ConfigError as exc:
        raise _fail(str(exc), 1) from None


def cmd_plugins(args: argparse.Namespace, config: Any) -> int:
    from nodeagent.errors import PluginError
    from nodeagent.pluginconfig import describe
    from nodeagent.registry import config_models, configuration, discover, installed_phases

    eps = discover()
    joined = installed_phases(eps.values())
    models = config_models(eps.values())
    for name, section in config.plugins.items():  # a bad section is refused here as the agent refuses it
        if name not in eps:
            print(f"nodeagent: configuration has a section for unknown plugin {name!r}; installed: {sorted(eps)}",
                  file=sys.stderr)
            return 2
        try:
            configuration(name, eps[name].load(), section)
        except PluginError as exc:
            print(f"nodeagent: plugin configuration error: {exc}", file=sys.stderr)
            return 2
    print("installed stage plugins (entry-point group nodeagent.plugins):")
    for name, ep in sorted(eps.items()):
        print(f"  {name:<16} {ep.value:<40} phases: {', '.join(joined[name])}")
    print("\nconfiguration (the plugins.<name> section of the NodeAgentConfiguration; the kubelet's fields are"
          " the KubeletConfiguration's):")
    for name in sorted(eps):
        model = models.get(name)
        if model is None:
            print(f"  {name}: (declares no model: its section is passed as it is)")
            continue
        lines = describe(model)
        print(f"  {name} ({model.__name__}):")
        for line in lines:
            print(f"    {line}")
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


def cmd_pods(args: argparse.Namespace, config: Any) -> int:
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


def cmd_trace(args: argparse.Namespace, config: Any) -> int:
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


def cmd_logs(args: argparse.Namespace, config: Any) -> int:
    """A container's log, read straight from podLogsDir (the agent only helps find the pod)."""
    from nodeagent import logreader as lr


    def fetch() -> Any:
        try:
            with urllib.request.urlopen(f"{config.endpoint_url}/pods", timeout=5) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):  # the agent is down: the log directories still tell
            return None

    try:
        since = time.time_ns() - int(lr.parse_since(args.since) * 1e9) if args.since else None
        target = lr.find_pod(args.pod, Path(config.kubelet.pod_logs_dir), fetch(), config.node_name)
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


def cmd_shutdown(args: argparse.Namespace, config: Any) -> int:
    """Graceful node shutdown where there is no systemd-logind (plugins/shutdown): ask the agent
    to stop its pods as before a power-off (or cancel), optionally waiting until they are down."""
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
    argv = list(sys.argv[1:] if argv is None else argv)
    # Commands that take the kubelet's flags parse them themselves (pflag rules, not argparse's).
    direct = {"run": cmd_run, "kubelet": cmd_kubelet, "config": cmd_config}
    if argv and argv[0] in direct:
        return int(direct[argv[0]](argv[1:]))
    parser = argparse.ArgumentParser(prog="nodeagent", description="Run Kubernetes pods on a CRI runtime.",
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the agent (nodeagent's options and the kubelet's flags)", add_help=False)
    sub.add_parser("kubelet", help="run the agent from the kubelet's own command line", add_help=False)
    sub.add_parser("config", help="config explain: the effective configuration, where each value came from",
                   add_help=False)
    for name, fn, doc in (
        ("plugins", cmd_plugins, "installed stage plugins, their configuration and the resolved order"),
        ("pods", cmd_pods, "the running agent's pods"),
        ("trace", cmd_trace, "the causal chain of events for one pod"),
    ):
        p = sub.add_parser(name, help=doc, allow_abbrev=False)
        _add_config_flags(p)
        p.set_defaults(fn=fn, needs_config=True)
        if name in ("pods", "trace"):
            p.add_argument("-o", "--output", choices=["table", "json"], default="table")
        if name == "trace":
            p.add_argument("pod", help="pod UID, NAMESPACE/NAME or NAME")
    plain: tuple[tuple[str, Callable[[argparse.Namespace], int], str], ...] = (
        ("phases", cmd_phases, "the phases and their contracts"),
        ("lifecycle", cmd_lifecycle, "the pod lifecycle transition table"),
        ("wiring", cmd_wiring, "who publishes and who subscribes on the bus"),
    )
    for name, plain_fn, doc in plain:
        p = sub.add_parser(name, help=doc)
        p.set_defaults(fn=plain_fn, needs_config=False)
    logs = sub.add_parser("logs", help="a container's log (kubectl logs, from podLogsDir)", allow_abbrev=False)
    _add_config_flags(logs)
    logs.set_defaults(fn=cmd_logs, needs_config=True)
    logs.add_argument("pod", help="pod UID, NAMESPACE/NAME or NAME")
    logs.add_argument("-c", "--container", help="the container (needed when the pod has several)")
    logs.add_argument("-p", "--previous", action="store_true", help="the previous instance (restartCount - 1)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing as the container writes")
    logs.add_argument("--tail", type=int, default=-1, help="only the last N lines (-1: all)")
    logs.add_argument("--timestamps", action="store_true", help="prefix each line with its RFC3339Nano time")
    logs.add_argument("--since", help="only lines newer than this: seconds, or a duration like 5m")
    shutdown = sub.add_parser("shutdown", help="graceful node shutdown without systemd-logind: stop the pods",
                              allow_abbrev=False)
    _add_config_flags(shutdown)
    shutdown.set_defaults(fn=cmd_shutdown, needs_config=True)
    shutdown.add_argument("--cancel", action="store_true", help="the shutdown is not happening after all")
    shutdown.add_argument("--wait", type=float, metavar="SECONDS", help="wait until the pods are down")
    own, kubelet = split_kubelet_flags(argv)
    args = parser.parse_args(own)
    if not getattr(args, "needs_config", False):
        if kubelet:
            parser.error(f"unrecognized arguments: {' '.join(kubelet)}")
        return int(args.fn(args))
    return int(args.fn(args, _config(args, kubelet)))


def kubelet_main() -> int:
    """The ``nodeagent-kubelet`` console script: ``nodeagent kubelet`` under a name a unit file
    can point its ExecStart at."""
    return cmd_kubelet(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
