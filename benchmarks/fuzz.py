"""Hostile static pod manifests against a real agent, at scale: the CI fuzz test
(tests/test_manifest_fuzz.py, ~500 cases) with any number of cases, and a report.

Starts a private containerd (devenv, under /tmp, stopped at the end), runs one in-process agent
and feeds it rounds of mutated manifests (tests/manifest_fuzz.py: the strategies and the
invariants — every file rejected or its pod settled cleanly, no exception anywhere in the agent,
the good pod untouched, no secret in a message). Stops at the first broken invariant.

    python -m benchmarks.fuzz --cases 10000                 # writes benchmarks/FUZZ.md
    python -m benchmarks.fuzz --cases 200 --no-report --seed 7
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import devenv
from tests.manifest_fuzz import RAW_FRAGMENTS, Stats, fuzz

REPORT = Path(__file__).with_name("FUZZ.md")


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def report(stats: Stats, seed: int, files_per_round: int, seconds: float, load_before: str, outcome: str) -> str:
    rejected = sum(stats.rejected.values())
    accepted = sum(stats.accepted.values())
    lines = [
        "# Manifest fuzzing: hostile static pods against the real agent",
        "",
        "`python -m benchmarks.fuzz --cases N` (the CI test tests/test_manifest_fuzz.py runs the same with ~500).",
        "Each case is one of three valid pods (many stage-relevant fields; a sidecar job copied from",
        "`kubectl get -o yaml`; a pod with its ResourceClaim) mutated 1–3 times: a value tweaked (another valid",
        "value), replaced (wrong type, huge, negative, `../../etc`, NUL, unicode, 70 KB strings), retyped,",
        "deleted, added (a plausible field anywhere, or junk), duplicated, or replaced by raw YAML",
        f"({len(RAW_FRAGMENTS)} fragments: `!!binary`, `!!timestamp`, `!!set`, `!!python/object`, a billion laughs,",
        "3000-deep nesting, recursive and unknown aliases, merges, non-string and duplicate keys, 200 KB scalars).",
        f"{files_per_round} files per round are written into one agent's manifest directory; a round passes when",
        "every file is rejected (ManifestRejected) or its pod settled cleanly (running, completed, rejected or",
        "retrying with a reason), no log line carries an exception, the agent's tasks are all alive, the good",
        "pod written first still runs the same container with no restart, and no message or status quotes",
        "the secret value every base pod carries in an env var or header.",
        "",
        f"- outcome: **{outcome}**",
        f"- commit: {_commit()}; seed: {seed} (`--seed {seed}` replays it)",
        f"- cases: {stats.cases} in {stats.rounds} rounds",
        f"- rejected: {rejected} — " + ", ".join(f"{k} {v}" for k, v in stats.rejected.most_common()),
        f"- accepted: {accepted} — " + ", ".join(f"{k} {v}" for k, v in stats.accepted.most_common()),
        f"- crashes found (exceptions in the agent, agent stopped, good pod disturbed): {stats.problems}",
        f"- duration: {seconds / 60:.1f} min ({seconds / max(stats.cases, 1) * 1000:.0f} ms per case)",
        f"- peak RSS of the process (agent, fuzzer, hypothesis): {stats.peak_rss_mib():.0f} MiB",
        "- RSS by cases done: " + ", ".join(f"{n}: {mib:.0f} MiB" for n, mib in _thin(stats.rss_samples)),
        "- what the agent holds at the end: " + ", ".join(f"{k} {v}" for k, v in stats.held.items()),
        f"- machine: {os.cpu_count()} cores, load before {load_before}, after {_load()}; containerd from devenv",
        "",
    ]
    return "\n".join(lines)


def _thin(samples: list[tuple[int, float]], keep: int = 12) -> list[tuple[int, float]]:
    if len(samples) <= keep:
        return samples
    step = (len(samples) - 1) / (keep - 1)
    return [samples[round(i * step)] for i in range(keep)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--files-per-round", type=int, default=8)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rounds = -(-args.cases // args.files_per_round)
    devenv.ensure_packages()
    archives = devenv.build_images()
    workdir = Path(tempfile.mkdtemp(prefix="na-fuzz-", dir="/tmp"))
    containerd = devenv.Containerd(workdir / "cd")
    stats = Stats()
    load_before = _load()
    began = time.monotonic()
    outcome = "passed"

    def progress(s: Stats) -> None:
        if s.rounds % 50 == 0:
            print(f"{s.cases} cases, {time.monotonic() - began:.0f} s, rejected {sum(s.rejected.values())}, "
                  f"accepted {sum(s.accepted.values())}, RSS {s.rss_samples[-1][1]:.0f} MiB", file=sys.stderr)

    try:
        containerd.start()
        containerd.import_images(archives)
        print(f"containerd {containerd.endpoint}; seed {seed}; {rounds} rounds", file=sys.stderr)
        fuzz(containerd, workdir / "agent", rounds=rounds, files_per_round=args.files_per_round, seed_value=seed,
             stats=stats, after_round=progress)
    except AssertionError as exc:
        outcome = f"FAILED after {stats.cases} cases: {str(exc).splitlines()[0][:300]}"
        stats.problems = max(stats.problems, 1)
        raise
    except BaseException as exc:
        outcome = f"not completed ({type(exc).__name__} after {stats.cases} cases)"
        raise
    finally:
        containerd.stop()
        text = report(stats, seed, args.files_per_round, time.monotonic() - began, load_before, outcome)
        print(text)
        if not args.no_report and not outcome.startswith("not completed"):
            args.report.write_text(text)
        if outcome == "passed":
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
