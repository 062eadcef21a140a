"""The `scan` command line: a user's own training script run unchanged, each step under the
detector, every host sync it makes reported with its disposition; a CI gate on top."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from hostsync.commands.options import (
    add_device,
    add_nodes,
    add_timeout,
    node_layout,
    positive_count,
)
from hostsync.detector.baseline import Baseline, BaselineError
from hostsync.launch import devices, launchers
from hostsync.scan import gate, report
from hostsync.scan.measure import SCAN, ScanPlan, check_plan, run_scan, scan_result
from hostsync.sites.known import carried_rules, load_known_sites
from hostsync.sites.remedies import load_remedies
from hostsync.workspace import cases, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Launcher


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hostsync scan",
        description="Run a training script unchanged, as `python SCRIPT ARGS` would, each of its"
        " steps under the host-sync detector, and report every host sync it makes: where, how"
        " often per step, whether it waits for the device, and its disposition.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=positive_count,
        default=1,
        metavar="N",
        help="ranks on this node (torchrun's spellings are taken)",
    )
    parser.add_argument(
        "--threads",
        type=positive_count,
        metavar="N",
        help="OMP_NUM_THREADS for every rank (default: as you set it; the scan adds none)",
    )
    parser.add_argument(
        "--launcher",
        choices=[launcher.value for launcher in launchers.users_launchers()],
        help="how the script is started (default: python for one rank, else torchrun)",
    )
    parser.add_argument(
        "--launcher-args",
        default="",
        metavar="ARGS",
        help="the launcher's own options, as one string: '--use_deepspeed --zero_stage 2'",
    )
    add_nodes(parser)
    steps = parser.add_argument_group("steps")
    steps.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="first steps left out of the figures, 1 or more: the first runs unwatched, with"
        " the script's setup (default: %(default)s)",
    )
    steps.add_argument(
        "--steps",
        type=positive_count,
        metavar="N",
        help="measure N steps after the warm-up, then stop the script (default: run it through)",
    )
    steps.add_argument(
        "--step-fn",
        metavar="MODULE:FUNCTION",
        help="each call is a step (default: each optimizer step); __main__:NAME for a"
        " function of the script itself",
    )
    add_device(parser)
    add_timeout(parser, "the script")
    ci = parser.add_argument_group("gate")
    ci.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="write what the run saw to FILE; with --fail-on new, read it instead",
    )
    ci.add_argument(
        "--fail-on",
        choices=(gate.NEW,),
        help="new: fail on a site the baseline does not hold (and no [[allow]] accepts)",
    )
    ci.add_argument(
        "--sarif",
        type=Path,
        metavar="FILE",
        help="write every site as SARIF 2.1.0 to FILE: code scanning shows them on the PR's lines",
    )
    ci.add_argument(
        "--max-waits",
        type=int,
        metavar="N",
        help="fail when a step after the warm-up waits more than N times on a rank",
    )
    parser.add_argument("script", type=Path, help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def plan_of(args: argparse.Namespace, layout: Layout) -> ScanPlan:
    nodes = node_layout(args, layout)
    world = args.nproc_per_node * nodes.count
    launcher = Launcher(args.launcher) if args.launcher else None
    plan = ScanPlan(
        script=args.script,
        args=tuple(args.args),
        launcher=launcher or (Launcher.TORCHRUN if world > 1 else Launcher.PYTHON),
        launcher_args=tuple(shlex.split(args.launcher_args)),
        ranks=args.nproc_per_node,
        nodes=nodes,
        warmup=args.warmup,
        steps=args.steps,
        step_fn=args.step_fn,
        device=devices.resolve_device(args.device, nodes.ranks_here(world), sys.executable),
        timeout=args.timeout,
        threads=args.threads,
    )
    check_plan(plan)
    return plan


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.fail_on and args.baseline is None:
        raise WorkspaceError("--fail-on new compares with a baseline: give --baseline FILE")
    try:
        baseline = Baseline.read(args.baseline) if args.fail_on else None
    except BaselineError as error:
        raise WorkspaceError(str(error)) from None
    layout = Layout(case=SCAN)
    rules, remedies = load_known_sites(layout.known_sites), load_remedies(layout)
    carried = carried_rules(cases.every(layout.root))
    plan = plan_of(args, layout)
    scanned = run_scan(layout, plan)
    result = scan_result(layout, plan, scanned, rules.allow, carried)
    writing = time.monotonic()
    json_path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
    print(report.summary(result, rules, remedies))
    here = Path.cwd()
    for path in [json_path, *report.write_reports(layout, json_path)]:
        # Where the user stands: a path they can open from there.
        print(
            f"wrote {path.relative_to(here) if path.is_relative_to(here) else path}",
            file=sys.stderr,
        )
    print(
        f"wrote the result and its reports in {time.monotonic() - writing:.2f} s (the run:"
        f" {scanned.seconds:.1f} s)",
        file=sys.stderr,
    )
    where = json_path.relative_to(layout.root)
    if scanned.interrupted:
        print(
            f"interrupted: every process it started was stopped; the partial result is {where}",
            file=sys.stderr,
        )
        return 130
    if result.partial:
        raise WorkspaceError(f"{result.partial}; the partial result is {where}")
    if args.sarif is not None:
        found = gate.findings(result, rules, remedies, baseline)
        args.sarif.write_text(json.dumps(gate.sarif(found), indent=1) + "\n")
        print(f"wrote {args.sarif}", file=sys.stderr)
    failures = gate.over_budget(result, args.max_waits) if args.max_waits is not None else []
    if baseline is not None:
        warning = gate.unmatched(result, baseline, args.baseline)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        failures = gate.new_sites(result, baseline) + failures
    elif args.baseline is not None:
        gate.baseline_of(result).write(args.baseline)
        print(f"wrote the baseline {args.baseline}", file=sys.stderr)
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failures else 0
