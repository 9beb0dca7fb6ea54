"""python -m conformance.node_e2e {run,list,build,report}

  run     containerd, the suite's services and the node; the [NodeConformance] specs; the report
  list    the selection (RUN/SKIP per spec), building e2e_node.test if needed
  build   build e2e_node.test (go test -c k8s.io/kubernetes/test/e2e_node)
  report  docs/node-conformance-report.md from a nodeagent run and a kubelet run (results.json)

See docs/node-e2e.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.node_e2e import harness, runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.node_e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="bring up everything, run the specs, write the report")
    p_list = sub.add_parser("list", help="print the selection: RUN/SKIP per spec")
    p_build = sub.add_parser("build", help="build e2e_node.test")
    for p in (p_run, p_list, p_build):
        p.add_argument("--binary", type=Path, default=None,
                       help=f"e2e_node.test to use or build (default $NODEAGENT_E2E_NODE_TEST or {harness.binary_path()})")
    for p in (p_run, p_list):
        p.add_argument("--focus", help="only selected specs whose name matches this (Python) regex")
        p.add_argument("--slice", choices=["ci"], help="only the specs of ci-slice.yaml (pass here in seconds)")
        p.add_argument("--node-only", action="store_true",
                       help="only the specs defined in test/e2e_node (not those of test/e2e/common)")
    p_run.add_argument("--workdir", type=Path, default=runner.DEFAULT_WORKDIR,
                       help=f"everything of the run lives here (default {runner.DEFAULT_WORKDIR})")
    p_run.add_argument("--report-dir", type=Path, help="default WORKDIR/report")
    p_run.add_argument("--node", choices=["nodeagent", "kubelet"], default="nodeagent",
                       help="the node under test: nodeagent, or the upstream kubelet as a baseline")
    p_run.add_argument("--node-name", help="the Node's name (default: the host name, as the harness's kubelet)")
    p_run.add_argument("--runtime", choices=["containerd2", "containerd1.6"], default=None)
    p_run.add_argument("--node-timeout", type=float, default=120.0, help="seconds to wait for the Node to be Ready")
    p_run.add_argument("--suite-timeout", default="2h", help="ginkgo --timeout (default 2h)")
    p_run.add_argument("--nodes", type=int, default=1,
                       help="ginkgo processes (N>1: the ginkgo CLI, then [Serial] and [Disruptive] specs alone)")
    p_run.add_argument("--keep", action="store_true", help="leave the environment running")
    p_run.add_argument("--nodeagent-arg", action="append", default=[], dest="nodeagent_args",
                       help="extra argument for `nodeagent run` (or the kubelet; repeatable)")
    p_run.add_argument("--e2e-arg", action="append", default=[], dest="e2e_args",
                       help="extra argument for the tests' e2e_node.test (repeatable)")
    p_build.add_argument("--force", action="store_true", help="rebuild even if present")
    p_report = sub.add_parser("report", help="both nodes' runs side by side, as markdown")
    p_report.add_argument("nodeagent", type=Path, help="results.json of the nodeagent run")
    p_report.add_argument("kubelet", type=Path, help="results.json of the --node kubelet run")
    p_report.add_argument("--out", type=Path, default=runner.REPO / "docs" / "node-conformance-report.md")
    args = parser.parse_args(argv)

    if args.command == "report":
        args.out.write_text(runner.side_by_side_report(args.nodeagent, args.kubelet))
        print(args.out)
        return 0

    if args.command == "build":
        path, secs = harness.build(args.binary, force=args.force)
        print(f"{path} ({'built in %.0fs' % secs if secs else 'already built'})")
        return 0
    opts = runner.Options(focus=args.focus, node_only=args.node_only, slice=args.slice == "ci", binary=args.binary, dry_run=args.command == "list")
    if args.command == "run":
        opts.workdir, opts.report_dir, opts.node = args.workdir, args.report_dir, args.node
        if args.node_name:
            opts.node_name = args.node_name
        opts.runtime, opts.node_timeout, opts.suite_timeout = args.runtime, args.node_timeout, args.suite_timeout
        opts.nodes = args.nodes
        opts.keep, opts.nodeagent_args, opts.e2e_args = args.keep, args.nodeagent_args, args.e2e_args
    return runner.run(opts)


if __name__ == "__main__":
    sys.exit(main())
