"""`python -m hostsync census`: every setup of census.toml on the releases as published and with
every carried fix (`hostsync.census`), one report."""

from __future__ import annotations

import argparse
import sys
import time

from hostsync.census import report, setups
from hostsync.census.report import FIXED, TODAY
from hostsync.census.run import CENSUS, census_cases, run_census
from hostsync.census.setups import Matrix
from hostsync.commands.options import add_timeout
from hostsync.workspace import cases, locks, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.values import comma_list


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync census",
        description="Record every host sync of the training steps users run (census.toml), on"
        " the newest releases the cases pin, as published and with every carried fix.",
    )
    parser.add_argument(
        "--setups",
        help="comma-separated setups of census.toml (default: every one not marked extra)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        help="optimizer steps per setup, the first being the warm-up (default: census.toml's)",
    )
    parser.add_argument(
        "--columns",
        default=f"{TODAY},{FIXED}",
        help="today (as published), fixed (every carried fix) or both (default: %(default)s)",
    )
    add_timeout(parser, "one setup")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    layout = Layout(case=CENSUS)
    matrix = setups.load(layout.root)
    chosen = matrix.chosen(comma_list(args.setups, "--setups") if args.setups else None)
    steps = args.steps or matrix.steps
    if steps < 3:
        raise WorkspaceError(f"--steps {steps}: use 3 or more (the warm-up and steady steps)")
    columns = comma_list(args.columns, "--columns")
    unknown = sorted(set(columns) - {TODAY, FIXED})
    if unknown:
        raise WorkspaceError(f"--columns {', '.join(unknown)}: use {TODAY}, {FIXED} or both")
    everyone = cases.every(layout.root)
    stacked = census_cases(everyone)
    started = time.monotonic()
    with locks.case(layout):
        result = run_census(
            layout, Matrix(steps, chosen), columns, stacked, everyone, args.timeout, started
        )
    json_path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
    print(report.console_summary(result))
    for path in [json_path, *report.write_reports(layout, json_path)]:
        print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)
    failed = [run.label for run in result.runs if run.error]
    for run in result.runs:
        if not run.measured:
            print(
                f"{'error' if run.error else 'note'}: {run.label}: {run.error or run.not_judged}",
                file=sys.stderr,
            )
    print(f"census wall time: {result.wall_s:.0f} s ({len(result.runs)} runs)", file=sys.stderr)
    return 1 if failed else 0
