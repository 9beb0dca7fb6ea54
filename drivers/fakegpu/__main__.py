"""``python -m drivers.fakegpu``: run the fake GPU DRA driver until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

import anyio

from drivers.fakegpu import DRIVER_NAME, FakeGpuDriver
from nodeagent import logs
from nodeagent.apiclient import make_api_client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drivers.fakegpu", description=__doc__.splitlines()[0])
    parser.add_argument("--driver-name", default=DRIVER_NAME, help=f"the DRA driver name (default {DRIVER_NAME})")
    parser.add_argument("--registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"),
                        help="where the registration socket goes (the agent's pluginsRegistryDir)")
    parser.add_argument("--plugin-dir", type=Path, default=None,
                        help="the driver's own directory: DRA socket, device nodes, per-claim info "
                             "(default /var/lib/kubelet/plugins/<driver>)")
    parser.add_argument("--cdi-dir", type=Path, default=Path("/var/run/cdi"),
                        help="where CDI specs are written (one of the agent's cdiSpecDirs)")
    parser.add_argument("--devices", type=int, default=4, help="how many fake devices (gpu0..gpuN-1)")
    parser.add_argument("--claims-dir", type=Path, default=None,
                        help="ResourceClaim manifests with status.allocation (standalone: the staticPodPath)")
    parser.add_argument("--services", default="v1.DRAPlugin,v1beta1.DRAPlugin",
                        help="DRA services to advertise, in order of preference")
    parser.add_argument("--fail", choices=["none", "prepare", "prepare-rpc", "unprepare"], default="none",
                        help="misbehave on purpose (for tests)")
    parser.add_argument("--call-log", type=Path, default=None, help="append each DRA call here as a JSON line")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="cluster mode: publish a ResourceSlice and read claims from this API server "
                             "(the node's kubeconfig is enough)")
    parser.add_argument("--node-name", default=None, help="the node (and pool) the driver serves (default: hostname)")
    args = parser.parse_args(argv)
    logs.configure("console", logging.INFO)
    driver = FakeGpuDriver(
        registry_dir=args.registry_dir,
        plugin_dir=args.plugin_dir or Path("/var/lib/kubelet/plugins") / args.driver_name,
        cdi_dir=args.cdi_dir, driver_name=args.driver_name, devices=args.devices, claims_dir=args.claims_dir,
        services=[s for s in args.services.split(",") if s], fail=args.fail, call_log=args.call_log,
        node_name=args.node_name)

    async def serve() -> None:
        if args.kubeconfig is not None:
            driver.api = make_api_client(args.kubeconfig, field_manager="fakegpu")
        try:
            async with anyio.create_task_group() as tg:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    tg.start_soon(driver.run)
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        break
        finally:
            if driver.api is not None:
                with anyio.CancelScope(shield=True):
                    await driver.api.close()

    anyio.run(serve)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
