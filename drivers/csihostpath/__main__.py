"""``python -m drivers.csihostpath``: run the hostpath CSI test driver until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
from pathlib import Path

import anyio

from drivers.csihostpath import DRIVER_NAME, HostPathDriver
from drivers.csihostpath.controller import Controller
from nodeagent import logs
from nodeagent.apiclient import make_api_client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drivers.csihostpath", description=__doc__.splitlines()[0])
    parser.add_argument("--driver-name", default=DRIVER_NAME, help=f"the CSI driver name (default {DRIVER_NAME})")
    parser.add_argument("--registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"),
                        help="where the registration socket goes (the agent's pluginsRegistryDir)")
    parser.add_argument("--plugin-dir", type=Path, default=None,
                        help="the driver's socket directory (default /var/lib/kubelet/plugins/<driver>)")
    parser.add_argument("--state-dir", type=Path, required=True, help="where the volumes' data lives")
    parser.add_argument("--node-id", default=socket.gethostname(), help="the node ID (default: the hostname)")
    parser.add_argument("--attach", action="store_true", help="have a ControllerPublishVolume step")
    parser.add_argument("--no-stage", action="store_true", help="no STAGE_UNSTAGE_VOLUME")
    parser.add_argument("--call-log", type=Path, default=None, help="append each CSI call here as a JSON line")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="also run the provisioner, attacher and resizer loops against this cluster")
    args = parser.parse_args(argv)
    logs.configure("console", logging.INFO)
    driver = HostPathDriver(
        registry_dir=args.registry_dir,
        plugin_dir=args.plugin_dir or Path("/var/lib/kubelet/plugins") / args.driver_name,
        state_dir=args.state_dir, node_id=args.node_id, driver_name=args.driver_name, attach_required=args.attach,
        stage=not args.no_stage, call_log=args.call_log)

    async def serve() -> None:
        api = make_api_client(args.kubeconfig, field_manager="csihostpath") if args.kubeconfig else None
        try:
            async with anyio.create_task_group() as tg:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    await tg.start(driver.run)
                    if api is not None:
                        await tg.start(Controller(driver, api, attach=args.attach).run)
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        break
        finally:
            if api is not None:
                with anyio.CancelScope(shield=True):
                    await api.close()

    anyio.run(serve)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
