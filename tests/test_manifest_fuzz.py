"""Property-based fuzzing of static pod manifests through the real agent on the real containerd
(tests/manifest_fuzz.py has the strategies and the invariants; ``python -m benchmarks.fuzz``
runs the same with 10,000 cases and writes benchmarks/FUZZ.md)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from tests.manifest_fuzz import Stats, fuzz

FILES_PER_ROUND = 8
# 320 cases, a new seed each run (about 2.5 min of the CI budget); `python -m benchmarks.fuzz`
# runs 10,000 (benchmarks/FUZZ.md).
ROUNDS = int(os.environ.get("NODEAGENT_FUZZ_ROUNDS", "40"))
SEED = int(os.environ.get("NODEAGENT_FUZZ_SEED") or random.randrange(2**32))
RSS_GROWTH_LIMIT_MIB = 150


def test_hostile_manifests_never_crash_the_agent(containerd: Any, tmp_path: Path) -> None:
    stats = Stats()
    print(f"\nfuzz: NODEAGENT_FUZZ_SEED={SEED} replays this run")
    fuzz(containerd, tmp_path, rounds=ROUNDS, files_per_round=FILES_PER_ROUND, seed_value=SEED, stats=stats)
    assert stats.cases >= ROUNDS * FILES_PER_ROUND and stats.problems == 0
    # Both halves of the property were exercised: files refused and files run.
    assert sum(stats.rejected.values()) > 0 and sum(stats.accepted.values()) > 0, (stats.rejected, stats.accepted)
    # Memory stays bounded: what the agent holds for hundreds of rejected files and torn-down pods
    # does not grow with them (the first sample is taken after the agent started).
    first, last = stats.rss_samples[0][1], stats.rss_samples[-1][1]
    assert last - first < RSS_GROWTH_LIMIT_MIB, stats.rss_samples
    print(f"fuzz (NODEAGENT_FUZZ_SEED={SEED}): {stats.cases} cases in {stats.rounds} rounds, "
          f"rejected {dict(stats.rejected)}, accepted {dict(stats.accepted)}, RSS {stats.rss_samples}, "
          f"peak RSS {stats.peak_rss_mib():.0f} MiB")
