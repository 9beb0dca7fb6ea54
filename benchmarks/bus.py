"""CPU per fact on the bus: nodeagent's Bus and Inbox against plain anyio memory streams.

The agent publishes ~130 facts per pod over a start and a teardown (StageCompleted per stage
and phase, the lifecycle facts, the stages' own), each to the standalone subscribers that want
it (trace, metrics, eventlog; the dispatcher its few kinds). This measures the process CPU the
bus itself costs for that, with subscribers that do nothing, in the same run as the baseline:
the same streams driven with anyio's ``send()`` and ``async for`` (a checkpoint, so an event
loop pass, on every send and every receive), which is how the bus worked before.

    python -m benchmarks.bus [--pods 30] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import anyio

from nodeagent import events as ev
from nodeagent.bus import Bus

FACTS_PER_POD = 134  # measured: 4,020 publishes for 30 pods started and torn down (cProfile)
YIELD_EVERY = 3  # a worker awaits a CRI call or a stage between a few facts


def _facts(pods: int) -> list[ev.Event]:
    ref = ev.PodRef(uid="u", namespace="default", name="p")
    return [ev.StageCompleted(source="runtime", pod=ref, phase="prepare", verdict="Continue", duration_seconds=0.0)
            for _ in range(pods * FACTS_PER_POD)]


async def _through_bus(facts: list[ev.Event]) -> float:
    bus = Bus()
    names = [s.name for s in bus.topology.subscribers if not s.cluster_only]

    async def drain(name: str) -> None:
        async with bus.stream(name) as inbox:
            async for _ in inbox:
                pass

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(drain, name)
        await anyio.sleep(0)
        started = time.process_time()
        for i, fact in enumerate(facts):
            await bus.publish(fact)
            if i % YIELD_EVERY == 0:
                await anyio.sleep(0)
        bus.close()
    return time.process_time() - started


async def _through_plain_streams(facts: list[ev.Event]) -> float:
    """The baseline: one anyio memory stream per subscriber that wants StageCompleted, with
    ``send()`` and ``async for``."""
    bus = Bus()
    wanted = [s for s in bus.topology.subscribers if not s.cluster_only and s.wants("StageCompleted")]
    streams = [anyio.create_memory_object_stream[ev.Event](bus.capacity) for _ in wanted]

    async def drain(receive: anyio.abc.ObjectReceiveStream[ev.Event]) -> None:
        async with receive:
            async for _ in receive:
                pass

    async with anyio.create_task_group() as tg:
        for _, receive in streams:
            tg.start_soon(drain, receive)
        await anyio.sleep(0)
        started = time.process_time()
        for i, fact in enumerate(facts):
            for send, _ in streams:
                await send.send(fact)
            if i % YIELD_EVERY == 0:
                await anyio.sleep(0)
        for send, _ in streams:
            send.close()
    return time.process_time() - started


def _median_ms_per_pod(run: Callable[[list[ev.Event]], object], facts: list[ev.Event], pods: int,
                       repeat: int) -> float:
    return statistics.median(anyio.run(run, facts) for _ in range(repeat)) * 1000 / pods  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    facts = _facts(args.pods)
    baseline = _median_ms_per_pod(_through_plain_streams, facts, args.pods, args.repeat)
    ours = _median_ms_per_pod(_through_bus, facts, args.pods, args.repeat)
    subscribers = sum(1 for s in Bus().topology.subscribers if not s.cluster_only and s.wants("StageCompleted"))
    hops = FACTS_PER_POD * subscribers  # per pod
    print(f"{args.pods} pods x {FACTS_PER_POD} facts, {subscribers} subscribers each, median of {args.repeat}:")
    for label, ms in (("plain anyio streams (send + async for)", baseline), ("nodeagent Bus + Inbox", ours)):
        print(f"  {label:<40} {ms:5.2f} ms CPU per pod, {ms * 1000 / hops:5.1f} us CPU per hop, "
              f"{hops / ms * 1000:,.0f} hops per CPU second")
    print(f"  ratio {ours / baseline:.2f} (perf.md B9 guards: a hop <= 10 us, >= 100,000 events/s)")


if __name__ == "__main__":
    main()
