"""CLI: python -m controlplane {build,up,down,status,node-kubeconfig} [--dir DIR].

`up` prints only the admin kubeconfig path on stdout (progress goes to stderr),
so that `export KUBECONFIG=$(python -m controlplane up)` works. The control
plane keeps running after `up` returns; `down` stops it (`--purge` also
deletes the directory).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from controlplane import build as _build
from controlplane.cluster import (
    ControlPlane,
    ControlPlaneError,
    probe_running,
    stop_from_state,
)

DEFAULT_DIR = Path("/tmp/nodeagent-controlplane")
EXIT_NOT_RUNNING = 3


def _err(msg: str) -> None:
    print(f"controlplane: {msg}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build"]:
        return _build.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m controlplane", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the binaries into the cache (idempotent); "
                                 "`build --help` for options")
    p_up = sub.add_parser("up", help="build if needed, start, wait until ready (idempotent)")
    p_up.add_argument("--timeout", type=float, default=120.0)
    p_down = sub.add_parser("down", help="stop the components")
    p_down.add_argument("--purge", action="store_true", help="also delete the directory")
    sub.add_parser("status", help=f"exit 0 if /readyz is ok, {EXIT_NOT_RUNNING} if not")
    p_node = sub.add_parser("node-kubeconfig", help="print the path of a node's kubeconfig")
    p_node.add_argument("node_name")
    for p in (p_up, p_down, sub.choices["status"], p_node):
        p.add_argument("--dir", default=str(DEFAULT_DIR), help=f"base dir (default {DEFAULT_DIR})")
    args = parser.parse_args(argv)
    base = Path(args.dir)

    if args.command == "up":
        cp = ControlPlane(base, die_with_parent=False)
        if probe_running(base):
            _err(f"already running at {cp.server_url}")
        else:
            stop_from_state(base)  # leftovers of a half-dead previous run
            try:
                cp.start(timeout=args.timeout)
            except ControlPlaneError as e:
                _err(str(e))
                return 1
            _err(f"up: {cp.server_url}, logs in {cp.log_dir}")
        print(cp.kubeconfig_admin)
        return 0
    if args.command == "down":
        stopped = stop_from_state(base)
        _err(f"stopped: {', '.join(stopped) or 'nothing'}")
        if args.purge and base.exists():
            shutil.rmtree(base)
        return 0
    if args.command == "status":
        ok = probe_running(base)
        _err("ready" if ok else "not running")
        return 0 if ok else EXIT_NOT_RUNNING
    if args.command == "node-kubeconfig":
        if not (base / "config.json").exists():
            _err(f"no control plane in {base}; run `up` first")
            return 1
        print(ControlPlane(base, build=False).node_kubeconfig(args.node_name))
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
