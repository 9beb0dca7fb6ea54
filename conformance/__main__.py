"""``python -m conformance standalone``: the ported upstream node-conformance tests against a
private containerd and one in-process nodeagent (see docs/conformance-standalone.md).

    python -m conformance standalone [--junit FILE] [--report FILE] [--filter REGEX] [--list]
                                     [--endpoint URL] [--parallel N] [--keep]

Prints a table (test, result, seconds, first line of the reason) and the summary line
``N passed, M failed, K skipped``; exits 1 when a case failed.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import structlog

REPO = Path(__file__).resolve().parent.parent


def _log_to(path: Path) -> None:
    """The agent's log goes to a file in the work directory: the console is for the table."""
    stream = path.open("a")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def standalone(args: argparse.Namespace) -> int:
    from conformance.standalone import report
    from conformance.standalone.framework import all_cases
    from conformance.standalone.runner import CaseResult, run_suite

    cases = all_cases()
    if args.filter:
        try:
            pattern = re.compile(args.filter)
        except re.error as exc:
            print(f"--filter: invalid regular expression: {exc}", file=sys.stderr)
            return 2
        cases = [c for c in cases if pattern.search(c.name) or pattern.search(c.key)]
    if args.list:
        for c in cases:
            print(f"{c.number:>4}  {c.key:<20} {c.name}")
        print(f"{len(cases)} cases")
        return 0
    if not cases:
        print("no case matches --filter", file=sys.stderr)
        return 2

    workdir = Path(tempfile.mkdtemp(prefix="nac-", dir="/tmp"))
    _log_to(workdir / "agent.log")
    done = 0

    def progress(result: CaseResult) -> None:
        nonlocal done
        done += 1
        print(f"[{done:>2}/{len(cases)}] {result.outcome:<4} {result.seconds:6.1f}s  {result.case.name}",
              file=sys.stderr, flush=True)

    print(f"running {len(cases)} cases concurrently; work directory {workdir}", file=sys.stderr, flush=True)
    run = run_suite(cases, workdir, endpoint=args.endpoint, parallel=args.parallel, on_result=progress)
    print(report.table(run.results))
    print()
    print(report.summary(run.results))
    if args.junit:
        report.write_junit(Path(args.junit), run.results, run.wall_seconds)
    if args.report:
        date = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
        Path(args.report).write_text(report.markdown(run.results, wall_seconds=run.wall_seconds,
                                                     commit=report.git_commit(REPO), date=date))
    failed = any(r.outcome == "fail" for r in run.results)
    if failed or args.keep:
        print(f"work directory kept: {workdir} (agent.log, pod logs, status files)", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("standalone", help="the ported upstream node-conformance tests")
    cmd.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    cmd.add_argument("--report", metavar="FILE", help="write the markdown report (docs/conformance-standalone.md)")
    cmd.add_argument("--filter", metavar="REGEX", help="run only cases whose name or key matches")
    cmd.add_argument("--list", action="store_true", help="list the cases and exit")
    cmd.add_argument("--endpoint", metavar="URL",
                     help="use this containerd (unix://...) instead of starting a private one")
    cmd.add_argument("--parallel", type=int, metavar="N", help="run at most N cases at once (default: all)")
    cmd.add_argument("--keep", action="store_true", help="keep the work directory even when every case passed")
    args = parser.parse_args(argv)
    return standalone(args)


if __name__ == "__main__":
    sys.exit(main())
