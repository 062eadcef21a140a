"""`python -m hostsync bench`: the reproducer's wall times and the detector's cost
(`hostsync.measure.bench`), printed and, with --write, kept."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hostsync.commands.options import add_case, add_device, add_timeout, chosen_cases
from hostsync.measure import provenance
from hostsync.measure.bench import (
    SCAN_EXAMPLES,
    BenchSettings,
    bench_runs,
    detector_truth,
    intercepted_op_us,
    print_detector,
    print_scan_overhead,
    scan_overhead,
)
from hostsync.measure.records import BenchResult
from hostsync.workspace import locks, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync bench",
        description="Print the reproducer's wall time, cold and warm, and the sync detector's"
        " overhead against the same runs without it.",
    )
    add_case(parser)
    parser.add_argument("--tree", default="pinned", help="tree to run (default: %(default)s)")
    parser.add_argument(
        "--warm-runs",
        type=int,
        default=3,
        help="warm runs with the detector, and as many without (default: %(default)s)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="times each run goes through the scenarios, for more loss calls (default: 1)",
    )
    add_device(parser)
    add_timeout(parser, "one run")
    parser.add_argument(
        "--detector-only",
        action="store_true",
        help="only the detector's precision, recall and cost per operation (no multi-rank runs)",
    )
    parser.add_argument("--write", action="store_true", help="keep the figures in profiles/")
    parser.add_argument(
        "--scan",
        type=Path,
        nargs="*",
        metavar="SCRIPT",
        help="only what `scan` adds to each SCRIPT's whole run (--warm-runs runs each way;"
        f" default: {', '.join(SCAN_EXAMPLES)})",
    )
    parser.add_argument(
        "--scan-args", default="", metavar="ARGS", help="each SCRIPT's arguments, as one string"
    )
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.scan is not None:
        layout = Layout()
        scripts = args.scan or [layout.root / name for name in SCAN_EXAMPLES]
        missing = [str(script) for script in scripts if not script.is_file()]
        if missing:
            raise WorkspaceError(f"--scan {' '.join(missing)}: no such script, give Python files")
        figures = scan_overhead(
            layout, scripts, shlex.split(args.scan_args), args.warm_runs, args.timeout
        )
        print_scan_overhead(figures, args.warm_runs)
        return 0
    settings = BenchSettings(
        args.tree, args.warm_runs, args.repeat, args.device, args.timeout, args.write
    )
    (case,) = chosen_cases(args.case)
    layout = case.layout
    measured_against = provenance.inputs(layout)
    truth, op_us = detector_truth(), intercepted_op_us()
    if args.detector_only:
        print_detector(truth, op_us)
        if args.write:
            result = BenchResult(provenance.stamp(layout, measured_against), truth, op_us)
            path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
            print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)
        return 0
    with locks.case(layout):
        return bench_runs(case, settings, truth, op_us, measured_against)
