"""CLI: python -m devenv {up,down,status,packages,images,runtime} [--dir DIR].

`runtime build` builds containerd 2.x into its cache (`up` does it on first use);
`runtime which` prints the runtime $NODEAGENT_RUNTIME selects.

`up` prints only the CRI endpoint on stdout (progress goes to stderr), so that
`export CONTAINER_RUNTIME_ENDPOINT=$(python -m devenv up)` works.
"""

from __future__ import annotations

import argparse
import sys
import time

from devenv import runtime as _runtime
from devenv.containerd import DEFAULT_SUBNET, Containerd
from devenv.images import build_images
from devenv.lifecycle import DEFAULT_DIR, down, up
from devenv.packages import ensure_packages

EXIT_NOT_RUNNING = 3  # like `systemctl status`: distinguishes "down" from "broken"


def _err(msg: str) -> None:
    print(f"devenv: {msg}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["runtime"]:
        return _runtime.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m devenv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="install, build images, start containerd (idempotent)")
    p_up.add_argument("--subnet", default=None,
                      help=f"pod subnet, on a first start only (default {DEFAULT_SUBNET} for "
                           "the default dir, else one derived from the dir)")
    p_up.add_argument("--no-install", action="store_true", help="never call apt-get")
    p_down = sub.add_parser("down", help="remove pods, stop containerd, clean the host")
    p_down.add_argument("--purge", action="store_true", help="also delete the directory")
    p_status = sub.add_parser("status", help=f"exit 0 if running, {EXIT_NOT_RUNNING} if not")
    sub.add_parser("packages", help="install missing Debian packages")
    sub.add_parser("images", help="build (or find cached) image archives, print their paths")
    sub.add_parser("runtime", help="`runtime build`: build containerd 2.x; `runtime which`")
    for p in (p_up, p_down, p_status):
        p.add_argument("--dir", default=str(DEFAULT_DIR), help=f"base dir (default {DEFAULT_DIR})")
    args = parser.parse_args(argv)

    if args.command == "up":
        t0 = time.monotonic()
        was_running = Containerd(args.dir).is_running()
        try:
            env = up(args.dir, subnet=args.subnet, install=not args.no_install)
        except RuntimeError as e:  # e.g. the other runtime already runs there
            _err(str(e))
            return 1
        state = "already running" if was_running else "started"
        v = env.version()
        _err(f"{env.runtime.name} ({v.get('runtime_name')} {v.get('runtime_version')}) {state} "
             f"(pid {env.pid()}) in {time.monotonic() - t0:.1f}s; log {env.log_path}")
        print(env.endpoint)
    elif args.command == "down":
        env = down(args.dir, purge=args.purge)
        _err(f"stopped {env.base_dir}" + (" and deleted it" if args.purge else ""))
    elif args.command == "status":
        env = Containerd(args.dir)
        pid = env.pid()
        if pid is None:
            print(f"not running ({env.base_dir})")
            return EXIT_NOT_RUNNING
        version = env.version()
        print(f"running pid {pid}\nendpoint {env.endpoint}\n"
              f"runtime {version.get('runtime_name')} {version.get('runtime_version')} "
              f"(CRI {version.get('runtime_api_version')})\nlog {env.log_path}\n"
              f"images {' '.join(n for n in sorted(env.images()) if not n.startswith('sha256:'))}")
    elif args.command == "packages":
        installed = ensure_packages()
        _err("installed " + " ".join(installed) if installed else "all packages present")
    elif args.command == "images":
        for archive in build_images():
            print(archive.path, *archive.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
