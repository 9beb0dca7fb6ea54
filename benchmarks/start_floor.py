"""The start-skew floor of N runtimes on this machine: the part of a gang's skew no agent controls.

A gang's start skew is the spread of its members' container starts across nodes. Once every
member's container is created (the agents create them while the gang waits), that spread has two
parts: when each node's agent learns of the commit (the barrier's share), and how long each
runtime's StartContainer takes from there (runc creates and starts the task inside that one call;
CRI cannot split it). The second part is measured here with no agent at all: one pod's container
created in each of N private containerds, then the N StartContainer calls sent at one instant from
one process. The spread of the runtimes' own ``startedAt`` is the floor for that many nodes on this
machine: on N real hosts it is one call's jitter; with 8 containerds on 2 cores and one disk it is
what the calls queueing for the CPU and for the disk cost (the runtimes' metadata writes: see
``--runtime-dir`` of benchmarks/gang_e2e.py).

The pods are the raw-CRI baseline's (benchmarks/pod_start.py: the agent's sandbox and container
configs). With ``gpus``, each container also gets that many fake GPUs through CDI, as a gang
member does (the fake driver's CDI spec: per device a device node, a bind mount and an
environment variable, which runc sets up inside StartContainer), so that the floor and the
members' starts do the same work in the runtime.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

import devenv
from benchmarks.pod_start import Baseline, BaselinePod
from cri import RuntimeClient
from drivers.fakegpu import FakeGpuDriver

FLOOR_CLAIM_UID = "start-floor"
"""The claim the floor's fake GPUs are prepared for (its CDI spec's file name carries it)."""


def fake_gpus(cdi_dir: Path, workdir: Path, gpus: int) -> tuple[FakeGpuDriver, list[str]]:
    """``gpus`` devices of a fake GPU driver prepared for one claim, its CDI spec written in
    ``cdi_dir`` (the runtime's): the driver, and the CDI names a container asks for."""
    driver = FakeGpuDriver(registry_dir=workdir / "registry", plugin_dir=workdir / "plugin", cdi_dir=cdi_dir,
                           devices=gpus)
    driver.set_up()
    answer, error = driver.prepare("floor", FLOOR_CLAIM_UID, "floor",
                                   allocated=[(f"gpu{i}", "gpus") for i in range(gpus)])
    if error:
        raise RuntimeError(f"preparing the floor's fake GPUs: {error}")
    return driver, [name for device in answer for name in device["cdi_device_ids"]]


async def simultaneous_start(endpoints: Sequence[str], workdir: Path, *, cdi_dirs: Sequence[Path] = (),
                             gpus: int = 0) -> dict[str, float]:
    """One container created on each runtime, all started at once, then torn down: the skew of
    the runtimes' ``startedAt`` and the StartContainer calls' mean and longest seconds. With
    ``gpus``, each container gets that many fake GPUs from the runtime's CDI dir (``cdi_dirs``)."""
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(RuntimeClient(ep)) for ep in endpoints]
        baselines: list[Baseline] = []
        drivers: list[FakeGpuDriver] = []

        def unprepare() -> None:
            for driver in drivers:
                driver.unprepare("floor", FLOOR_CLAIM_UID, "floor")

        stack.callback(unprepare)
        for i, client in enumerate(clients):
            image = await client.image_status(devenv.BUSYBOX_IMAGE)
            if image is None:
                raise RuntimeError(f"{devenv.BUSYBOX_IMAGE} is not in the runtime at {endpoints[i]}")
            devices: list[str] = []
            if gpus:
                driver, devices = fake_gpus(cdi_dirs[i], workdir / f"floor-gpus-{i}", gpus)
                drivers.append(driver)
            baselines.append(Baseline(client, f"floor{i}", workdir / f"floor-logs-{i}", image.id,
                                      concurrency=1, grace=0, cdi_devices=devices))
        pods = [b.pods(1)[0] for b in baselines]
        calls: list[float] = []

        async def start(b: Baseline, p: BaselinePod) -> None:
            began = time.monotonic()
            await b.start_created(p)
            calls.append(time.monotonic() - began)

        try:
            async with anyio.create_task_group() as tg:
                for b, p in zip(baselines, pods, strict=True):
                    tg.start_soon(functools.partial(b.create, p, start=False))
            async with anyio.create_task_group() as tg:
                for b, p in zip(baselines, pods, strict=True):
                    tg.start_soon(start, b, p)
            started = []
            for b, p in zip(baselines, pods, strict=True):
                status = await b.client.container_status(p.container_ids[0])
                started.append(status.started_at / 1e9)
        finally:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    for b, p in zip(baselines, pods, strict=True):
                        if p.sandbox_id:
                            tg.start_soon(b.teardown, [p])
    return {"skew": max(started) - min(started), "call_mean": sum(calls) / len(calls), "call_max": max(calls)}


async def measure(endpoints: Sequence[str], workdir: Path, rounds: int, *, cdi_dirs: Sequence[Path] = (),
                  gpus: int = 0) -> list[dict[str, float]]:
    """``rounds`` of :func:`simultaneous_start` after one untimed round (the first sandbox of a
    runtime pays its first-use costs in containerd and the CNI)."""
    await simultaneous_start(endpoints, workdir, cdi_dirs=cdi_dirs, gpus=gpus)
    return [await simultaneous_start(endpoints, workdir, cdi_dirs=cdi_dirs, gpus=gpus) for _ in range(rounds)]
