"""python -m conformance.e2e {run,list,build,images,report,compare}

  run      the whole unattended run against nodeagent; writes the report
  list     print the selection (RUN/SKIP per test), building e2e.test if needed
  build    build e2e.test, agnhost, nnp (cached) and the image archives
  images   build the image archives; print built names and what is not built
  report   re-render a report from JUnit files of an earlier run
  compare  the tests whose result differs between two runs' results.json
  side-by-side  two runs test by test, as markdown (nodeagent's and the kubelet's columns)

See conformance/e2e/README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.e2e import runner


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--focus", help="only selected tests whose name matches this (Python) regex")
    p.add_argument("--slice", choices=["ci"], help="a fixed slice of the selection (ci-slice.yaml)")
    p.add_argument("--storage-suites", action="store_true",
                   help="also the upstream storage test suites against the hostpath CSI test driver "
                        "(External Storage [Driver: hostpath.csi.nodeagent.test], storage.py)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="bring up everything, run the tests, write the report")
    _common(p_run)
    p_run.add_argument("--workdir", type=Path, default=runner.DEFAULT_WORKDIR,
                       help=f"everything of the run lives here (default {runner.DEFAULT_WORKDIR}; "
                            "keep it short: containerd's socket path must stay < 108 bytes)")
    p_run.add_argument("--report-dir", type=Path, help="default WORKDIR/report")
    p_run.add_argument("--markdown", type=Path,
                       help="also copy report.md here (e.g. docs/conformance-report.md)")
    p_run.add_argument("--nodes", type=int, default=1,
                       help="parallel ginkgo processes (N>1: ginkgo CLI, then [Serial] tests alone)")
    p_run.add_argument("--node", choices=["nodeagent", "kubelet"], default="nodeagent",
                       help="what runs the node: nodeagent (default), or the upstream kubelet "
                            "built from the same module, as a baseline of this environment")
    p_run.add_argument("--runtime", choices=["containerd2", "containerd1.6"], default=None,
                       help="the containerd the node runs on (default $NODEAGENT_RUNTIME, else "
                            "containerd2: 2.x built from the Go module proxy; containerd1.6: Debian's)")
    p_run.add_argument("--node-name", default=runner.DEFAULT_NODE)
    p_run.add_argument("--node-timeout", type=float, default=180.0,
                       help="seconds to wait for the Node to be Ready")
    p_run.add_argument("--suite-timeout",
                       help="ginkgo --timeout of a pass (default 8h; 30m with --slice ci, so that "
                            "CI stays bounded even if many tests hit their own 5-minute timeouts)")
    p_run.add_argument("--keep", action="store_true", help="leave the environment running")
    p_run.add_argument("--dry-run", action="store_true", help="only print the selection")
    p_run.add_argument("--nodeagent-arg", action="append", default=[], dest="nodeagent_args",
                       help="extra argument for `nodeagent run` (or the kubelet; repeatable)")
    p_run.add_argument("--e2e-arg", action="append", default=[], dest="e2e_args",
                       help="extra argument for e2e.test (repeatable)")
    p_list = sub.add_parser("list", help="print the selection")
    _common(p_list)
    sub.add_parser("build", help="build e2e.test, agnhost, nnp and the image archives")
    sub.add_parser("images", help="build the image archives and list them")
    p_rep = sub.add_parser("report", help="re-render a report from JUnit files")
    _common(p_rep)
    p_rep.add_argument("junit", type=Path, nargs="*", help="junit_01.xml files of the run")
    p_rep.add_argument("--log", type=Path, help="e2e.log of the run, for tests no JUnit file has")
    p_rep.add_argument("--title", help="report title")
    p_rep.add_argument("--note", action="append", default=[], help="a note for the report header")
    p_rep.add_argument("--out", type=Path, required=True)
    p_cmp = sub.add_parser("compare", help="tests whose result differs between two runs "
                                           "(e.g. nodeagent vs. --node kubelet)")
    p_cmp.add_argument("results", type=Path, nargs=2, help="results.json of two runs")
    p_sbs = sub.add_parser("side-by-side", help="two runs' results test by test, as markdown "
                                                "(docs/conformance-report.md's kubelet column)")
    p_sbs.add_argument("results", type=Path, nargs=2,
                       help="results.json (or report.md) of the nodeagent run, then of the kubelet run")
    args = parser.parse_args(argv)

    if args.command == "run":
        opts = runner.Options(workdir=args.workdir, report_dir=args.report_dir, focus=args.focus,
                              slice=args.slice, nodes=args.nodes, node_name=args.node_name,
                              node_timeout=args.node_timeout, suite_timeout=args.suite_timeout,
                              markdown=args.markdown, keep=args.keep, dry_run=args.dry_run,
                              nodeagent_args=args.nodeagent_args, e2e_args=args.e2e_args,
                              node=args.node, runtime=args.runtime, storage_suites=args.storage_suites)
        return runner.run(opts)
    if args.command == "list":
        return runner.run(runner.Options(focus=args.focus, slice=args.slice, dry_run=True,
                                         storage_suites=args.storage_suites))
    if args.command in ("build", "images"):
        from conformance.e2e import images
        if args.command == "build":
            runner.ensure_binaries()
        archives = images.build_all()
        for a in archives:
            for n in a.names:
                note = f"  (stand-in: {images.STAND_INS[n]})" if n in images.STAND_INS else ""
                print(f"built      {n}  {a.path}{note}")
        for n, why in images.NOT_BUILT.items():
            print(f"not built  {n}: {why}")
        return 0
    if args.command == "report":
        from conformance.e2e import report as rep
        from conformance.e2e import selection as sel
        from controlplane import build as cpbuild
        opts = runner.Options(focus=args.focus, slice=args.slice, storage_suites=args.storage_suites)
        selected, reasons = runner.compute_selection(cpbuild.binary("e2e.test"), opts)
        parsed = rep.parse_junit(args.junit)
        if args.log:
            parsed = rep.merge(parsed, rep.parse_log(args.log, [s.name for s in selected]))
        cases = rep.build_cases([(s.name, s.location) for s in selected], reasons, parsed,
                                "the run did not reach it")
        info = rep.RunInfo(selection=f"{len(selected)} tests", kubernetes=cpbuild.K8S_VERSION,
                           command="python -m conformance.e2e " + " ".join(sys.argv[1:]),
                           suite_failures=parsed.suite_failures, notes=list(args.note),
                           nodeagent_commit=runner.git_commit())
        if args.title:
            info.title = args.title
        _ = sel
        print(rep.write_all(args.out, cases, info))
        return 0
    if args.command == "compare":
        import json
        a, b = (json.loads(r.read_text()) for r in args.results)
        ca = {c["name"]: c for c in a["cases"]}
        cb = {c["name"]: c for c in b["cases"]}
        print(f"A: {args.results[0]}: {a['summary']}\nB: {args.results[1]}: {b['summary']}")
        both = [n for n in sorted(ca.keys() & cb.keys())
                if "not-run" not in (ca[n]["state"], cb[n]["state"])]
        print(f"{len(both)} tests ran in both; those whose result differs:")
        for name in both:
            x, y = ca[name], cb[name]
            if x["status"] != y["status"]:
                why = x["reason"] if x["status"] == "failed" else y["reason"]
                print(f"A {x['status']:<7} B {y['status']:<7} {name}\n    {why}")
        return 0
    if args.command == "side-by-side":
        from conformance.e2e import report as rep
        runs = [line for label, path in zip(("nodeagent", "kubelet"), args.results, strict=True)
                for line in rep.run_lines(label, path)]
        print("\n".join([*runs, "", *rep.side_by_side_lines(*(rep.read_cases(r) for r in args.results))]))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
